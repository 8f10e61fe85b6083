package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// skipRecorder is a testing.TB whose Skip and Fatalf record which was
// called, and the message, instead of stopping.
type skipRecorder struct {
	testing.TB
	how, msg string
}

func (r *skipRecorder) Helper() {}
func (r *skipRecorder) Skip(a ...any) {
	r.how, r.msg = "skip", fmt.Sprint(a...)
	panic(r)
}
func (r *skipRecorder) Fatalf(f string, a ...any) {
	r.how, r.msg = "fail", fmt.Sprintf(f, a...)
	panic(r)
}

// stops calls f with r and recovers r's Skip or Fatalf.
func (r *skipRecorder) stops(f func()) {
	defer func() {
		if v := recover(); v != nil && v != r {
			panic(v)
		}
	}()
	f()
}

func TestCachedBinaryPathRules(t *testing.T) {
	cache := t.TempDir()
	if err := os.WriteFile(filepath.Join(cache, "tool-v1"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	override := filepath.Join(t.TempDir(), "my-tool")
	if err := os.WriteFile(override, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	b := CachedBinary{Name: "tool", File: "tool-v1", Env: "TESTUTIL_TOOL", CacheEnv: "TESTUTIL_TOOL_CACHE", Build: "scripts/tool.sh"}
	for _, tc := range []struct {
		rule            string
		env, cacheEnv   string
		wantPath        string
		wantOK          bool
		withoutEnvField bool
		anyOK           bool // whatever this machine's cache holds
	}{
		{rule: "the env variable names the binary", env: override, cacheEnv: cache, wantPath: override, wantOK: true},
		{rule: "an env variable naming nothing is not ok, even with a cached one", env: override + ".absent", cacheEnv: cache, wantPath: override + ".absent"},
		{rule: "without the env variable, the cache directory's file", cacheEnv: cache, wantPath: filepath.Join(cache, "tool-v1"), wantOK: true},
		{rule: "an empty cache directory is not ok", cacheEnv: t.TempDir(), wantOK: false},
		{rule: "without the cache variable, the default cache directory", wantPath: filepath.Join(DefaultCacheDir, "tool-v1"), anyOK: true},
		{rule: "a binary without an env variable is only looked up in the cache", withoutEnvField: true, env: override, cacheEnv: cache, wantPath: filepath.Join(cache, "tool-v1"), wantOK: true},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			t.Setenv("TESTUTIL_TOOL", tc.env)
			t.Setenv("TESTUTIL_TOOL_CACHE", tc.cacheEnv)
			bb := b
			if tc.withoutEnvField {
				bb.Env = ""
			}
			p, ok := bb.Path()
			if tc.wantPath != "" && p != tc.wantPath {
				t.Errorf("path %q, want %q", p, tc.wantPath)
			}
			if !tc.anyOK && ok != tc.wantOK {
				t.Errorf("ok %v, want %v", ok, tc.wantOK)
			}
		})
	}
}

func TestCachedBinaryRequireRules(t *testing.T) {
	cache := t.TempDir()
	if err := os.WriteFile(filepath.Join(cache, "tool-v1"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	b := CachedBinary{Name: "tool", File: "tool-v1", Env: "TESTUTIL_TOOL", CacheEnv: "TESTUTIL_TOOL_CACHE", Build: "scripts/tool.sh", Takes: "a minute"}
	t.Setenv("TESTUTIL_TOOL", "")
	for _, tc := range []struct {
		rule, cache, ci, wantHow string
		wantIn                   []string
	}{
		{rule: "a cached binary is returned", cache: cache, wantHow: ""},
		{rule: "a cached binary is returned under CI", cache: cache, ci: "1", wantHow: ""},
		{rule: "a missing binary skips, saying how to build it", cache: t.TempDir(), wantHow: "skip",
			wantIn: []string{"no tool at ", "build it with scripts/tool.sh (a minute; .ci/run does it), or set TESTUTIL_TOOL"}},
		{rule: "a missing binary fails under CI", cache: t.TempDir(), ci: "true", wantHow: "fail",
			wantIn: []string{"no tool at ", "$CI is set"}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			t.Setenv("TESTUTIL_TOOL_CACHE", tc.cache)
			t.Setenv("CI", tc.ci)
			r := &skipRecorder{TB: t}
			var p string
			r.stops(func() { p = b.Require(r) })
			if r.how != tc.wantHow {
				t.Fatalf("Require: %q (%s), want %q", r.how, r.msg, tc.wantHow)
			}
			if tc.wantHow == "" && p != filepath.Join(tc.cache, "tool-v1") {
				t.Errorf("path %q, want the cached one", p)
			}
			for _, w := range tc.wantIn {
				if !strings.Contains(r.msg, w) {
					t.Errorf("message %q lacks %q", r.msg, w)
				}
			}
		})
	}
}

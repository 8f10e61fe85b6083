package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// DefaultCacheDir is where scripts/kube-apiserver.sh and scripts/jaeger.sh
// cache the binaries they build, outside the repository, unless their
// cache variable ($KUBE_CACHE, $JAEGER_CACHE) names another directory.
const DefaultCacheDir = "/var/cache/hyperpodrun"

// CachedBinary is a real part a test runs that is too slow to build per
// test run (a kube-apiserver, a Jaeger): a script builds it once at a
// pinned release and caches it under DefaultCacheDir, and .ci/run calls
// that script before the tests.
type CachedBinary struct {
	// Name is what the binary is, for messages ("kube-apiserver").
	Name string
	// File is its file name in the cache ("kube-apiserver-v1.34.2").
	File string
	// Env, when set, is the variable whose value overrides its path
	// ("KUBE_APISERVER").
	Env string
	// CacheEnv is the variable that overrides the cache directory
	// ("KUBE_CACHE").
	CacheEnv string
	// Build is the command that builds it ("scripts/kube-apiserver.sh"),
	// and Takes how long that takes ("10-20 minutes"; may be empty).
	Build, Takes string
}

// Path returns the binary's path: $Env, else File in $CacheEnv's
// directory (DefaultCacheDir when unset); ok is false when nothing is
// there.
func (b CachedBinary) Path() (path string, ok bool) {
	if b.Env != "" {
		if p := os.Getenv(b.Env); p != "" {
			_, err := os.Stat(p)
			return p, err == nil
		}
	}
	dir := os.Getenv(b.CacheEnv)
	if dir == "" {
		dir = DefaultCacheDir
	}
	p := filepath.Join(dir, b.File)
	_, err := os.Stat(p)
	return p, err == nil
}

// Require returns the binary's path. When it is absent, it skips the test
// saying how to build it, or fails it when $CI is set (SkipOrFail).
func (b CachedBinary) Require(t testing.TB) string {
	t.Helper()
	p, ok := b.Path()
	if !ok {
		or := ""
		if b.Env != "" {
			or = ", or set " + b.Env
		}
		takes := ""
		if b.Takes != "" {
			takes = b.Takes + "; "
		}
		SkipOrFail(t, "no "+b.Name+" at "+p+": build it with "+b.Build+" ("+takes+".ci/run does it)"+or)
	}
	return p
}

// SkipOrFail skips the test saying why a real part it needs cannot run
// here, or fails it when $CI is set: .ci/run installs and builds every
// such part and runs the tests as root, so a skip there would hide a
// broken install step behind a green run.
func SkipOrFail(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s; $CI is set, and .ci/run must provide it", why)
	}
	t.Skip(why)
}

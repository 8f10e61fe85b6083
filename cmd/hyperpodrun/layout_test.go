package main

// Issue 25: the log directory as torchrun lays it out, and the Python
// helper kept out of it and behind the user's own modules.

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// runLogDirs lists the run directories <logs>/<runID>_<random> that runs
// created, as torchrun names them.
func runLogDirs(t *testing.T, logs, runID string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(logs, runID+"_*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// runLogDir is the one run directory of runID under logs.
func runLogDir(t *testing.T, logs, runID string) string {
	t.Helper()
	m := runLogDirs(t, logs, runID)
	if len(m) != 1 {
		entries, _ := os.ReadDir(logs)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("want one run directory %s_<random> under %s, found %v (entries %v)", runID, logs, m, names)
	}
	return m[0]
}

// torchrun's layout: <log_dir>/<run_id>_<random>/attempt_<restart
// count>/<local_rank>/{stdout,stderr}.log,error.json. A restart goes to
// attempt_1; nothing else (no code) is in the log directory.
func TestLogDirectoryLayoutAsTorchrun(t *testing.T) {
	logs := t.TempDir()
	marker := filepath.Join(t.TempDir(), "failed-once")
	w := script(t, `echo "out-$LOCAL_RANK-$TORCHELASTIC_RESTART_COUNT"
if [ "$LOCAL_RANK" = 1 ] && [ ! -e "`+marker+`" ]; then touch "`+marker+`"; exit 3; fi`)
	r := hpr(t, nil, "--nproc-per-node", "2", "--rdzv-id", "lay", "--log-dir", logs, "--max-restarts", "1",
		"--redirects", "1", "--no-python", w)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	run := runLogDir(t, logs, "lay")
	if !regexp.MustCompile(`^lay_[A-Za-z0-9_]+$`).MatchString(filepath.Base(run)) {
		t.Errorf("run directory %q, want lay_<random>", filepath.Base(run))
	}
	for _, want := range []struct{ file, content string }{
		{"attempt_0/0/stdout.log", "out-0-0\n"}, {"attempt_0/1/stdout.log", "out-1-0\n"},
		{"attempt_1/0/stdout.log", "out-0-1\n"}, {"attempt_1/1/stdout.log", "out-1-1\n"},
	} {
		b, err := os.ReadFile(filepath.Join(run, want.file))
		if err != nil || string(b) != want.content {
			t.Errorf("%s = %q (%v), want %q", want.file, b, err, want.content)
		}
	}
	var code []string
	filepath.WalkDir(logs, func(p string, d fs.DirEntry, err error) error {
		if err == nil && (strings.HasSuffix(p, ".py") || d.Name() == "python") {
			code = append(code, p)
		}
		return nil
	})
	if len(code) > 0 {
		t.Errorf("the log directory holds code: %v", code)
	}
}

// A user module named like the helper (hyperpodrun_elastic) on the user's
// PYTHONPATH is the one the script imports (the helper used to be
// prepended and shadow it).
func TestUserModuleNamedLikeTheHelperWins(t *testing.T) {
	py := torchPython(t)
	user := t.TempDir()
	if err := os.WriteFile(filepath.Join(user, "hyperpodrun_elastic.py"), []byte("WHO = 'user'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "imp.py")
	os.WriteFile(p, []byte("import hyperpodrun_elastic\nprint('who', getattr(hyperpodrun_elastic, 'WHO', 'helper'))\n"), 0o644)
	logs := t.TempDir()
	r := hpr(t, []string{"PYTHON_EXEC=" + py, "PYTHONPATH=" + user}, "--log-dir", logs, p)
	if r.code != 0 || !strings.Contains(r.stdout, "who user") {
		t.Errorf("exit %d, want the user's module imported\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
}

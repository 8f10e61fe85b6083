package launcher

import (
	"os"
	"path/filepath"
	"strings"
)

// FindPython picks the workers' interpreter when PYTHON_EXEC is not set:
// the first python3 on PATH whose installation has torch, else the python3
// of the activated virtualenv (VIRTUAL_ENV) or conda environment
// (CONDA_PREFIX), else "python3". why says which rule chose it, for the
// first log line.
//
// It only looks at the file system (a few stat calls per candidate), never
// starts an interpreter: importing torch takes seconds. Nothing is cached,
// so an environment changed between runs is always seen as it is now.
func FindPython() (path, why string) {
	first := ""
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, "python3")
		if !isExecutable(p) {
			continue
		}
		if first == "" {
			first = p
		}
		if hasTorch(p) {
			return p, "the first python3 on PATH that has torch"
		}
	}
	for _, env := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if root := os.Getenv(env); root != "" {
			if p := filepath.Join(root, "bin", "python3"); isExecutable(p) {
				return p, "the python3 of the activated environment " + env + "=" + root + " (no python3 on PATH has torch)"
			}
		}
	}
	if first != "" {
		return first, "python3 on PATH (none has torch; set PYTHON_EXEC to choose)"
	}
	return "python3", "python3 (not found on PATH; set PYTHON_EXEC)"
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// hasTorch reports whether the interpreter at p would import torch from its
// own installation: a torch package in one of its site directories (venv
// and base installation, Debian's dist-packages, the user site) or on
// PYTHONPATH.
func hasTorch(p string) bool {
	var roots []string
	// A venv's bin/python3 is a link to the base interpreter: its own
	// site-packages are next to the link, the base's next to the target.
	roots = append(roots, filepath.Dir(filepath.Dir(p)))
	real, err := filepath.EvalSymlinks(p)
	if err == nil {
		roots = append(roots, filepath.Dir(filepath.Dir(real)))
	}
	version := ""
	if err == nil {
		if b := filepath.Base(real); strings.HasPrefix(b, "python3.") {
			version = b // "python3.11": only that version's directories
		}
	}
	var dirs []string
	for i, root := range roots {
		if i > 0 && root == roots[0] {
			continue
		}
		dirs = append(dirs,
			filepath.Join(root, "lib", "python3", "dist-packages"),
			filepath.Join(root, "local", "lib", "python3", "dist-packages"))
		pattern := "python3.*"
		if version != "" {
			pattern = version
		}
		for _, sub := range []string{"site-packages", "dist-packages"} {
			for _, base := range []string{filepath.Join(root, "lib"), filepath.Join(root, "local", "lib")} {
				m, _ := filepath.Glob(filepath.Join(base, pattern, sub))
				dirs = append(dirs, m...)
			}
		}
	}
	if home, err := os.UserHomeDir(); err == nil && version != "" {
		dirs = append(dirs, filepath.Join(home, ".local", "lib", version, "site-packages"))
	}
	dirs = append(dirs, filepath.SplitList(os.Getenv("PYTHONPATH"))...)
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if st, err := os.Stat(filepath.Join(d, "torch", "__init__.py")); err == nil && !st.IsDir() {
			return true
		}
	}
	return false
}

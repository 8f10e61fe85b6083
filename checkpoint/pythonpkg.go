package checkpoint

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// pythonFS holds the stdlib-only Python helper packages, so hyperpodrun can
// make them importable by any training script without an install.
//
//go:embed python/hyperpodrun_elastic/*.py python/hyperpod_elastic_agent/*.py python/hyperpod_elastic_agent/ipc/*.py
var pythonFS embed.FS

// ExtractPython writes the Python helper packages (hyperpodrun_elastic and
// the hyperpod_elastic_agent shim) under dir and returns the directory to
// put on PYTHONPATH.
func ExtractPython(dir string) (string, error) {
	root := filepath.Join(dir, "python")
	err := fs.WalkDir(pythonFS, "python", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, p)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := pythonFS.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		return "", fmt.Errorf("extract the Python helper package to %s: %w", root, err)
	}
	return root, nil
}

package checkpoint

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestExtractPythonIsImportable(t *testing.T) {
	root, err := ExtractPython(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"hyperpodrun_elastic/__init__.py", "hyperpod_elastic_agent/elastic_event_handler.py"} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("missing %s: %v", f, err)
		}
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	cmd := exec.Command(py, "-c", "import hyperpodrun_elastic; from hyperpod_elastic_agent.elastic_event_handler import elastic_event_detected; print(elastic_event_detected())")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+root)
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "False\n" {
		t.Errorf("import from PYTHONPATH: %v\n%s", err, out)
	}
}

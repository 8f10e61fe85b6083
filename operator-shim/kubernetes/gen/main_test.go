package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/manifests"
)

// -image puts the built image in the Deployment, as its image and its
// --launcher-image; without it the output is the committed manifests.
func TestImageFlag(t *testing.T) {
	const ref = "registry.example.com/hyperpodrun/hyperpod-kube-controller:v0.1"
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-dir", dir, "-image", ref}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "controller.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ctl := string(b)
	if strings.Contains(ctl, manifests.Image) || !strings.Contains(ctl, "image: "+ref+"\n") || !strings.Contains(ctl, "--launcher-image="+ref+"\n") {
		t.Errorf("controller.yaml does not use %s as image and --launcher-image:\n%s", ref, ctl)
	}

	def := t.TempDir()
	if code := run([]string{"-dir", def}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, n := range []string{"00-namespace.yaml", "crds.yaml", "controller.yaml"} {
		got, _ := os.ReadFile(filepath.Join(def, n))
		committed, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "kubernetes", n))
		if err != nil || !bytes.Equal(got, committed) {
			t.Errorf("%s without -image differs from the committed file (%v)", n, err)
		}
	}

	stderr.Reset()
	if code := run([]string{"-dir", dir, "-image", "Registry Example/x"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "registry/repository:tag") {
		t.Errorf("a bad -image: exit %d, stderr %q", code, stderr.String())
	}
}

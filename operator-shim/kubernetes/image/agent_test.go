package main

import (
	"bytes"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// -agent builds the node agent's image, the one the hyperpod-agent
// DaemonSet names: hyperpod-agent as its entrypoint, run as root, and the
// static hyperpodrun where the containerd DaemonSet's init container copies
// it from (/usr/local/bin/hyperpodrun-static); tagged as the DaemonSet's
// image by default. A dynamic agent is refused, naming the program.
func TestAgentImage(t *testing.T) {
	dynamic, static := cPrograms(t)
	out := filepath.Join(t.TempDir(), "agent.tar")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-agent", static, "-hyperpodrun", static, "-o", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	tag, _ := name.NewTag("ghcr.io/hyperpodrun/hyperpod-agent:latest")
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatalf("the tarball is not tagged %s: %v", tag, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if c := cf.Config; c.User != "" || !reflect.DeepEqual(c.Entrypoint, []string{"/usr/local/bin/hyperpod-agent"}) || c.Labels["org.opencontainers.image.title"] != "hyperpod-agent" {
		t.Errorf("config: user %q entrypoint %q labels %v; want root, hyperpod-agent", c.User, c.Entrypoint, c.Labels)
	}
	files := layerFiles(t, img)
	for _, p := range []string{"usr/local/bin/hyperpod-agent", "usr/local/bin/hyperpodrun", "usr/local/bin/hyperpodrun-static"} {
		if h, ok := files[p]; !ok || h.Mode != 0o755 {
			t.Errorf("%s: present %v mode %o, want the program, 0755", p, ok, h.Mode)
		}
	}
	if _, ok := files["usr/local/bin/hyperpod-kube-controller"]; ok {
		t.Errorf("the agent's image holds the controller")
	}
	stderr.Reset()
	if code := run([]string{"-agent", dynamic, "-hyperpodrun", static, "-o", out}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "./cmd/hyperpod-agent") {
		t.Errorf("a dynamic agent: exit %d, stderr %q; want 1 naming the static build of hyperpod-agent", code, stderr.String())
	}
}

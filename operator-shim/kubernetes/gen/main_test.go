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

// -etcd-endpoints and -etcd-prefix put the user's etcd in the controller's
// Deployment and in a copy of the agent DaemonSet; bad values are refused.
func TestEtcdFlags(t *testing.T) {
	t.Chdir(filepath.Join("..", "..", "..")) // the repository root, as make runs it
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	const eps = "https://etcd-0.fleet.internal:2379,https://etcd-1.fleet.internal:2379"
	if code := run([]string{"-dir", dir, "-etcd-endpoints", eps, "-etcd-prefix", "/ml-fleet"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, n := range []string{"controller.yaml", "daemonset.yaml"} {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if strings.Contains(s, manifests.EtcdEndpoints) || !strings.Contains(s, "--etcd-endpoints="+eps+"\n") || !strings.Contains(s, "--etcd-prefix=/ml-fleet\n") {
			t.Errorf("%s does not name the given etcd:\n%s", n, s)
		}
	}
	for _, bad := range [][]string{{"-etcd-endpoints", "etcd:2379"}, {"-etcd-prefix", "hyperpodrun"}} {
		stderr.Reset()
		if code := run(append([]string{"-dir", dir}, bad...), &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), bad[0]) {
			t.Errorf("%v: exit %d, stderr %q", bad, code, stderr.String())
		}
	}
}

// -agent-image puts the given node agent image in the DaemonSet copied
// into -dir (the committed examples keep manifests.AgentImage); a bad
// reference is refused.
func TestAgentImageFlag(t *testing.T) {
	t.Chdir(filepath.Join("..", "..", ".."))
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	const img = "registry.example.com/hyperpodrun/hyperpod-agent:v0.1"
	if code := run([]string{"-dir", dir, "-agent-image", img}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); strings.Contains(s, manifests.AgentImage) || strings.Count(s, "image: "+img+"\n") < 2 {
		t.Errorf("daemonset.yaml does not name the agent image %s everywhere:\n%s", img, s)
	}
	stderr.Reset()
	if code := run([]string{"-dir", dir, "-agent-image", "Bad Image"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "-agent-image") {
		t.Errorf("a bad -agent-image: exit %d, stderr %q", code, stderr.String())
	}
}

package kubernetes_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/internal/ctrdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/kubetest"
	kube "github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/manifests"
)

// walkMarker precedes each code block of docs/kubernetes.md that
// TestInstallDocWalk runs.
const walkMarker = "<!-- walked: TestInstallDocWalk -->"

// walkedBlocks are the bodies of the code blocks that follow walkMarker,
// in the document's order.
func walkedBlocks(doc string) ([]string, error) {
	lines := strings.Split(doc, "\n")
	var out []string
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != walkMarker {
			continue
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			return nil, fmt.Errorf("line %d: %s is not followed by a code block", i+1, walkMarker)
		}
		end := slices.IndexFunc(lines[i+2:], func(l string) bool { return strings.HasPrefix(l, "```") })
		if end < 0 {
			return nil, fmt.Errorf("line %d: the code block does not end", i+2)
		}
		out = append(out, strings.Join(lines[i+2:i+2+end], "\n"))
		i += 2 + end
	}
	return out, nil
}

func TestWalkedBlocks(t *testing.T) {
	doc := "a\n" + walkMarker + "\n```sh\nmake image\n# comment\n```\ntext\n```sh\nnot walked\n```\n" + walkMarker + "\n```sh\nkubectl apply -f x\n```\n"
	got, err := walkedBlocks(doc)
	if err != nil || !slices.Equal(got, []string{"make image\n# comment", "kubectl apply -f x"}) {
		t.Fatalf("walkedBlocks: %q %v", got, err)
	}
	if _, err := walkedBlocks(walkMarker + "\ntext\n"); err == nil {
		t.Error("a marker without a block was accepted")
	}
	if _, err := walkedBlocks(walkMarker + "\n```sh\nno end\n"); err == nil {
		t.Error("an unterminated block was accepted")
	}
}

// docs/kubernetes.md's install, walked: the blocks marked walked run in
// order, as one bash script (set -euo pipefail), in a checkout of this
// repository (symlinks; what the commands write lands in a temp dir),
// against a real kube-apiserver, with Debian's docker-registry on loopback
// in place of registry.example.com. Before them, the files the earlier
// steps the section refers to would have made: the etcd certificate files
// (examples/kubernetes/README.md) and the passwords of `elasticctl auth
// bootstrap --password-dir etcd-passwords`. After them: both images are
// in the registry, the controller's Deployment and the agent's DaemonSet
// name them and the given etcd, the Secrets exist, `kubectl scale` set
// the example job's maximum and `kubectl delete` removed it.
func TestInstallDocWalk(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and pushes both images and runs a kube-apiserver")
	}
	root := repoRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := walkedBlocks(string(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) < 5 {
		t.Fatalf("docs/kubernetes.md has %d walked blocks, want the install's 5 (images, agent image, gen, Secrets, apply)", len(blocks))
	}
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl is not installed")
	}
	reg := ctrdtest.StartRegistry(t)
	s := kubetest.Start(t)
	work := symlinkCheckout(t, root)
	for f, data := range map[string]string{
		"ca.crt":  "-----BEGIN CERTIFICATE-----\n(the CA of etcd's server certificate)\n-----END CERTIFICATE-----\n",
		"tls.crt": "-----BEGIN CERTIFICATE-----\n(the agents' client certificate)\n-----END CERTIFICATE-----\n",
		"tls.key": "-----BEGIN PRIVATE KEY-----\n(its key)\n-----END PRIVATE KEY-----\n",
		"etcd-passwords/hyperpod-kube-controller.password": "controller-password\n",
		"etcd-passwords/hyperpod-enroll.password":          "enroll-password\n",
	} {
		p := filepath.Join(work, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	script := "set -euo pipefail\nset -x\n" + strings.ReplaceAll(strings.Join(blocks, "\n"), "registry.example.com", reg.Host)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "KUBECONFIG="+s.Kubeconfig, "PWD="+work)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the walked blocks of docs/kubernetes.md failed (%v) after %s:\n%s", err, time.Since(start).Round(time.Second), lastBytes(string(out), 8192))
	}
	t.Logf("walked in %s", time.Since(start).Round(time.Second))

	ctlImage := reg.Host + "/hyperpodrun/hyperpod-kube-controller:v0.1"
	agentImage := reg.Host + "/hyperpodrun/hyperpod-agent:v0.1"
	for _, want := range []string{"pushed " + ctlImage, "pushed " + agentImage, "elasticjob.hyperpodrun.io/llama-sweep scaled",
		"elasticjob.hyperpodrun.io \"llama-sweep\" deleted"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the walk's output lacks %q:\n%s", want, lastBytes(string(out), 8192))
		}
	}
	for _, ref := range []string{"hyperpodrun/hyperpod-kube-controller", "hyperpodrun/hyperpod-agent"} {
		req, _ := http.NewRequestWithContext(ctx, "HEAD", "http://"+reg.Host+"/v2/"+ref+"/manifests/v0.1", nil)
		req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("%s:v0.1 in the registry: %v %v", ref, err, resp)
		} else {
			resp.Body.Close()
		}
	}
	cs := s.Clientset(t)
	dep, err := cs.AppsV1().Deployments(manifests.Namespace).Get(ctx, manifests.Controller, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	if c.Image != ctlImage || !strings.Contains(args, "--launcher-image="+ctlImage) || !strings.Contains(args, "https://etcd-0.example:2379,https://etcd-1.example:2379") {
		t.Errorf("the controller's Deployment: image %s, args %s", c.Image, args)
	}
	ds, err := cs.AppsV1().DaemonSets(manifests.Namespace).Get(ctx, "hyperpod-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := ds.Spec.Template.Spec.Containers[0]; c.Image != agentImage || !strings.Contains(strings.Join(c.Args, " "), "--etcd-endpoints=https://etcd-0.example:2379,https://etcd-1.example:2379") {
		t.Errorf("the agent's DaemonSet: image %s, args %v", c.Image, c.Args)
	}
	for _, sec := range []string{"hyperpod-etcd-tls", "hyperpod-kube-controller-etcd", "hyperpod-enroll-etcd"} {
		if _, err := cs.CoreV1().Secrets(manifests.Namespace).Get(ctx, sec, metav1.GetOptions{}); err != nil {
			t.Errorf("Secret %s: %v", sec, err)
		}
	}
	cl, err := kube.NewClient(s.Admin())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.ElasticJobs("ml").Get(ctx, "llama-sweep", metav1.GetOptions{}); err == nil {
		t.Error("llama-sweep still exists after kubectl delete")
	}
	if _, err := cl.ElasticTeams().Get(ctx, "research", metav1.GetOptions{}); err != nil {
		t.Errorf("the example team research: %v", err)
	}
}

// symlinkCheckout is a directory whose entries link to the repository's
// (but bin/, which `make image` writes): commands run there as in a
// checkout, and what they create stays in the temp dir.
func symlinkCheckout(t *testing.T, root string) string {
	t.Helper()
	work := t.TempDir()
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == "bin" || e.Name() == "my-cluster" {
			continue
		}
		abs, err := filepath.Abs(filepath.Join(root, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(work, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	return work
}

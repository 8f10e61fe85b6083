package kubernetes_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/checkpoint"
)

// build compiles a command of this module into dir.
func build(t *testing.T, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, "github.com/hyperpodrun/hyperpodrun/"+pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// The planned shrink with the real hyperpodrun in the pods: the kubelet
// (played by the test) runs each pod's own command line (the supervisor,
// then hyperpodrun with the etcd rendezvous and the bundled training
// worker). When a higher-priority job of the other team takes a node, the
// supervisor of the leaving pod drains its hyperpodrun: the workers
// checkpoint (the record is committed in etcd), hyperpodrun leaves the
// rendezvous and exits 0, and only then is the pod deleted; the other pod
// trains on.
func TestPlannedShrinkWithRealHyperpodrun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds hyperpodrun and runs real training processes")
	}
	bin := t.TempDir()
	hpr := build(t, bin, "cmd/hyperpodrun")
	worker := build(t, bin, "examples/worker")
	e := startEnv(t, envOptions{Hyperpodrun: hpr})
	ckpt := t.TempDir()
	sweep := elasticJob("sweep", "research", "low", 1, 2)
	sweep.Spec.NProcPerNode = "1"
	sweep.Spec.Template.Spec.Containers[0].Command = []string{worker, "--steps", "1000000", "--step-time", "50ms", "--ckpt-dir", ckpt}
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, sweep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "sweep's two hyperpodruns in one rendezvous", func() (bool, string) {
		pods, _ := livePods(t, e.cs, "sweep")
		n, _ := e.st.Members(e.ctx, "sweep")
		return len(pods) == 2 && n == 2, fmt.Sprintf("%d pods, %d rendezvous members", len(pods), n)
	})
	before, _ := livePods(t, e.cs, "sweep")
	time.Sleep(2 * time.Second) // some training

	serve := elasticJob("serve", "prod", "high", 3, 3)
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, serve, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "sweep shrunk to 1 pod, serve on 3 nodes", func() (bool, string) {
		sw, all := livePods(t, e.cs, "sweep")
		se, _ := livePods(t, e.cs, "serve")
		s := e.status("sweep")
		return len(sw) == 1 && all == 1 && len(se) == 3 && s.DesiredReplicas == 1 && s.CurrentReplicas == 1,
			fmt.Sprintf("sweep %d/%d pods %+v, serve %d", len(sw), all, s, len(se))
	})
	after, _ := livePods(t, e.cs, "sweep")
	var left, stayed string
	for n, p := range before {
		if after[n] == nil {
			left = p.Name
		} else if after[n].UID == p.UID {
			stayed = p.Name
		}
	}
	e.k.mu.Lock()
	exit, killed := e.k.exits[left], append([]string(nil), e.k.killed...)
	_, stillRunning := e.k.exits[stayed]
	e.k.mu.Unlock()
	if left == "" || stayed == "" || stillRunning {
		t.Fatalf("the pods: before %v after %v; left %q stayed %q (exited: %v)", keys(before), keys(after), left, stayed, stillRunning)
	}
	if exit != "0 drained" {
		t.Errorf("the leaving pod %s ended %q, want exit 0 after a drain", left, exit)
	}
	if len(killed) != 0 {
		t.Errorf("pods deleted while their container ran: %q", killed)
	}
	r, err := e.s.Etcd.Get(e.ctx, e.st.Keys.Checkpoint("sweep"))
	if err != nil || len(r.Kvs) == 0 {
		t.Fatalf("no committed checkpoint: %v", err)
	}
	var rec checkpoint.Record
	if err := json.Unmarshal(r.Kvs[0].Value, &rec); err != nil || rec.Step < 1 {
		t.Fatalf("checkpoint record %s: %v", r.Kvs[0].Value, err)
	}
	if txt := eventsText(t, e.cs, "sweep"); !strings.Contains(txt, "Drained") {
		t.Errorf("no Drained event:\n%s", txt)
	}
	// The job goes on at its new size: one member in the rendezvous.
	waitFor(t, time.Minute, "sweep's rendezvous at 1 member", func() (bool, string) {
		n, _ := e.st.Members(e.ctx, "sweep")
		return n == 1, fmt.Sprintf("%d members", n)
	})
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

package jobrunner

import (
	"context"
	"encoding/json"
	"github.com/hyperpodrun/hyperpodrun/internal/syncbuf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/agent/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

type syncBuf = syncbuf.Buffer

func TestStartsDrainsAndRecordsFinish(t *testing.T) {
	dir := t.TempDir()
	hpr := filepath.Join(dir, "hyperpodrun")
	if out, err := exec.Command("go", "build", "-o", hpr, "../../cmd/hyperpodrun").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	worker := filepath.Join(dir, "w.sh")
	os.WriteFile(worker, []byte(`#!/bin/sh
trap 'echo drained > "$OUT/drained.$HYPERPODRUN_ROUND"; exit 0' USR1
echo run > "$OUT/started"
while [ ! -f "$OUT/finish" ]; do sleep 0.02; done
`), 0o755)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
		Run: fleet.RunSpec{Script: worker, NoPython: true, Env: map[string]string{"OUT": dir}, GracefulTimeoutSeconds: 10}})
	var out syncBuf
	r := New(Config{Hyperpodrun: hpr, Endpoints: srv.Endpoints, Output: &out})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(rctx, nodeagent.Node{Name: "node-a", Prefix: "/hyperpodrun", Client: cli}); close(done) }()
	defer func() { stop(); <-done }()

	alloc := func(nodes ...string) {
		b, _ := json.Marshal(policy.Allocation{Job: "j", Size: len(nodes), Nodes: nodes})
		cli.Put(ctx, st.AllocationKey("j"), string(b))
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s\n%s", what, out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	exists := func(name string) func() bool {
		return func() bool { _, err := os.Stat(filepath.Join(dir, name)); return err == nil }
	}
	running := func() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.jobs) }

	alloc("node-b") // not this node: nothing starts
	alloc("node-a")
	waitFor("the job's worker on this node", exists("started"))
	if !strings.Contains(out.String(), "node-a/j ") {
		t.Errorf("output not prefixed with node/job: %q", out.String())
	}
	// Moved off this node: drained through the sync signal, not finished.
	alloc("node-b")
	waitFor("the worker to be told to checkpoint and leave", exists("drained.1"))
	waitFor("hyperpodrun to exit", func() bool { return running() == 0 })
	if f, _ := st.Finished(ctx); len(f) != 0 {
		t.Errorf("a drained job was recorded as finished: %v", f)
	}
	// Placed here again, then training ends by itself: recorded Succeeded.
	os.Remove(filepath.Join(dir, "started"))
	alloc("node-a")
	waitFor("the job to start again", exists("started"))
	os.WriteFile(filepath.Join(dir, "finish"), nil, 0o644)
	waitFor("the finish record", func() bool { f, _ := st.Finished(ctx); return f["j"].Outcome == fleet.Succeeded })
}

func TestArgs(t *testing.T) {
	spec := fleet.JobSpec{Job: policy.Job{Name: "j", MinNodes: 2, MaxNodes: 4},
		Run: fleet.RunSpec{Script: "train.py", Args: []string{"--lr", "1"}, NProcPerNode: "8", MaxRestarts: 3, GracefulTimeoutSeconds: 45}}
	got := strings.Join(Args(spec, []string{"e1:2379", "e2:2379"}, "/p", "lease_ttl=5", "/logs"), " ")
	want := "--nnodes 2:4 --nproc-per-node 8 --rdzv-backend etcd --rdzv-endpoint e1:2379,e2:2379 --rdzv-id j --rdzv-conf prefix=/p,lease_ttl=5 --max-restarts 3 --graceful-timeout 45 --log-dir /logs train.py --lr 1"
	if got != want {
		t.Errorf("args:\n got %s\nwant %s", got, want)
	}
}

package jobrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/syncbuf"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

type syncBuf = syncbuf.Buffer

func TestStartsDrainsAndRecordsFinish(t *testing.T) {
	dir := t.TempDir()
	hpr := hyperpodrun(t)
	worker := filepath.Join(dir, "w.sh")
	os.WriteFile(worker, []byte(`#!/bin/sh
trap 'cp "$HYPERPODRUN_EVENT_FILE" "$OUT/drained.tmp" && mv "$OUT/drained.tmp" "$OUT/drained"; exit 0' USR1
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
	r := New(Config{Hyperpodrun: hpr, Endpoints: srv.Endpoints, Output: &out, AllowRootJobs: true})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(rctx, nodeagent.Node{Name: "node-a", Prefix: "/hyperpodrun", Client: cli}); close(done) }()
	defer func() { stop(); <-done }()

	gen := int64(0)
	desire := func(d fleet.Desired) {
		t.Helper()
		gen++
		d.Job, d.Generation = "j", gen
		if err := st.Place(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	alloc := func(nodes ...string) {
		desire(fleet.Desired{Allocation: policy.Allocation{Size: len(nodes), Nodes: nodes}})
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
	// drainedEvent waits for the worker to be signalled and returns the
	// event it read.
	drainedEvent := func(what string) map[string]any {
		t.Helper()
		waitFor(what, exists("drained"))
		waitFor("hyperpodrun to exit", func() bool { return running() == 0 })
		b, err := os.ReadFile(filepath.Join(dir, "drained"))
		var ev map[string]any
		if err == nil {
			err = json.Unmarshal(b, &ev)
		}
		if err != nil {
			t.Fatalf("event file the worker read: %v (%q)", err, b)
		}
		os.Remove(filepath.Join(dir, "drained"))
		os.Remove(filepath.Join(dir, "started"))
		if f, ok := finishOf(t, ctx, st, "j"); ok {
			t.Errorf("a drained job was recorded as finished: %v", f)
		}
		return ev
	}
	// Moved off this node: drained through the sync signal, not finished.
	alloc("node-b")
	if ev := drainedEvent("the worker to be told to checkpoint and leave"); ev["kind"] != "drain" {
		t.Errorf("moved off this node: worker got %v, want kind drain", ev)
	}
	// Preempted: the coordinator's desired record takes the nodes away and
	// says why. The workers are told it is a preemption, to world size 0,
	// and why.
	alloc("node-a")
	waitFor("the job to start again", exists("started"))
	desire(fleet.Desired{Stop: &fleet.Stop{Kind: fleet.StopPreemption, Reason: "preempted by higher-priority urgent of the same team t"}})
	ev := drainedEvent("the worker to be told of the preemption")
	if ev["kind"] != "preemption" || ev["new_world_size"] != 0.0 || !strings.Contains(fmt.Sprint(ev["reason"]), "higher-priority urgent") {
		t.Errorf("preempted: worker got %v, want kind preemption, new world size 0 and the coordinator's reason", ev)
	}
	// Placed here again (the new record has no stop), then training ends by
	// itself: recorded Succeeded.
	alloc("node-a")
	waitFor("the job to start again", exists("started"))
	os.WriteFile(filepath.Join(dir, "finish"), nil, 0o644)
	waitFor("the finish record", func() bool { f, _ := finishOf(t, ctx, st, "j"); return f.Outcome == fleet.Succeeded })
}

// A job without maxNodes runs at minNodes: it used to get --nnodes 1:0
// and always fail.
func TestArgsMaxNodesDefaultsToMinNodes(t *testing.T) {
	for _, tc := range []struct {
		job  policy.Job
		want string
	}{
		{policy.Job{Name: "j"}, "1:1"},
		{policy.Job{Name: "j", MinNodes: 3}, "3:3"},
		{policy.Job{Name: "j", Sizes: []int{2, 4, 8}}, "2:8"},
		{policy.Job{Name: "j", MinNodes: 2, MaxNodes: 6, Elastic: true}, "2:6"},
	} {
		args := Args(fleet.JobSpec{Job: tc.job, Run: fleet.RunSpec{Script: "t.py"}}, []string{"e:2379"}, "/p", "", "")
		if args[0] != "--nnodes" || args[1] != tc.want {
			t.Errorf("%+v: %v, want --nnodes %s", tc.job, args[:2], tc.want)
		}
	}
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

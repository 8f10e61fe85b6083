package fleet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// Place writes a desired record with its per-node assignments: nodes that
// leave the placement lose theirs, a stopped job has none left, and each
// node's assignments list only its own jobs.
func TestPlaceKeepsAssignmentsInStep(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	on := func(node string) []string {
		as, bad, _, err := st.Assignments(ctx, node)
		if err != nil || len(bad) > 0 {
			t.Fatalf("assignments of %s: %v %v", node, err, bad)
		}
		var jobs []string
		for _, a := range as {
			jobs = append(jobs, a.Job)
		}
		return jobs
	}
	place := func(job string, gen int64, nodes ...string) {
		t.Helper()
		d := fleet.Desired{Allocation: policy.Allocation{Job: job, Size: len(nodes), Nodes: nodes}, Generation: gen}
		if len(nodes) == 0 {
			d.Stop = &fleet.Stop{Kind: fleet.StopShutdown}
		}
		if err := st.Place(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	place("j", 1, "a", "b")
	place("k", 1, "b")
	if !slices.Equal(on("a"), []string{"j"}) || !slices.Equal(on("b"), []string{"j", "k"}) {
		t.Fatalf("a has %v, b has %v", on("a"), on("b"))
	}
	place("j", 2, "b", "c")
	if len(on("a")) != 0 || !slices.Equal(on("c"), []string{"j"}) || !slices.Equal(on("b"), []string{"j", "k"}) {
		t.Errorf("after j moved from a to c: a %v, b %v, c %v", on("a"), on("b"), on("c"))
	}
	place("j", 3)
	if !slices.Equal(on("b"), []string{"k"}) || len(on("c")) != 0 {
		t.Errorf("after j stopped: b %v, c %v", on("b"), on("c"))
	}
}

func TestAssignmentKeysAndRecords(t *testing.T) {
	k := fleet.NewKeys("/x")
	if node, job, ok := k.AssignmentOwner(k.Assignment("n1", "j1")); !ok || node != "n1" || job != "j1" {
		t.Errorf("AssignmentOwner(%s) = %q %q %v", k.Assignment("n1", "j1"), node, job, ok)
	}
	for _, bad := range []string{k.NodeAssignments("n1"), k.Desired("j1"), k.AssignPrefix() + "n1/j/x"} {
		if _, _, ok := k.AssignmentOwner(bad); ok {
			t.Errorf("AssignmentOwner(%q) is an assignment", bad)
		}
	}
	if job := k.EventJob(k.Event(time.Unix(5, 6), "my-job")); job != "my-job" {
		t.Errorf("EventJob = %q, want my-job", job)
	}
	b, _ := json.Marshal(fleet.Assignment{Job: "j1", Generation: 4})
	if a, err := fleet.DecodeAssignment(k.Assignment("n", "j1"), b); err != nil || a.Generation != 4 {
		t.Errorf("DecodeAssignment: %+v %v", a, err)
	}
	if _, err := fleet.DecodeAssignment(k.Assignment("n", "other"), b); err == nil {
		t.Error("an assignment naming another job than its key decodes")
	}
	// An event written before deduplication reads as seen once.
	var e fleet.Event
	json.Unmarshal([]byte(`{"time":"2026-01-01T00:00:00Z","job":"j","kind":"Admitted","message":"m","fromSize":0,"toSize":1}`), &e)
	if e.Times() != 1 || e.Count != 0 {
		t.Errorf("old event reads as %d times", e.Times())
	}
}

// The coordinator reads its records in pages: at 20,000 nodes and 50,000
// jobs they are about 80 MB, past the client's 64 MiB message limit, and
// one transaction of every prefix failed on every retry. Here a client
// limited to 1 MiB reads 3 MB of statuses, whole.
func TestReadSnapshotReadsMoreThanOneMessage(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := fleet.New(cli, "")
	const jobs = 6000
	msg := strings.Repeat("x", 400)
	var ops []clientv3.Op
	for i := range jobs {
		s := fleet.Status{Reason: policy.Reason{Job: fmt.Sprintf("job-%05d", i), Kind: policy.KindPending, Message: msg}, Time: time.Now(), Since: time.Now()}
		op, err := st.PutStatusOp(s)
		if err != nil {
			t.Fatal(err)
		}
		if ops = append(ops, op); len(ops) == 100 || i == jobs-1 {
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	small, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second, MaxCallRecvMsgSize: 1 << 20, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	snap, err := fleet.New(small, "").ReadSnapshot(ctx)
	if err != nil {
		t.Fatalf("read a snapshot larger than a message: %v", err)
	}
	if len(snap.Statuses) != jobs {
		t.Fatalf("read %d statuses, want %d", len(snap.Statuses), jobs)
	}
	for i, kv := range snap.Statuses {
		if want := st.Keys.Status(fmt.Sprintf("job-%05d", i)); string(kv.Key) != want {
			t.Fatalf("status %d: key %s, want %s", i, kv.Key, want)
		}
	}
}

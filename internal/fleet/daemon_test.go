package fleet_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

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

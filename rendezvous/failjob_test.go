package rendezvous

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A job whose restarts are spent fails for every node at once: the node
// waiting for a round (the others left it) gets a *JobFailedError with the
// failing node's summary instead of waiting out its join timeout, a node
// still in a round sees it superseded, and the closer writes nothing over
// the failed record.
func TestFailJobEndsEveryNodesJoinWithTheSummary(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes := h.register(ctx, h.cfg("a", 2, 2), h.cfg("b", 2, 2))
	rs := mustJoinAll(t, ctx, nodes...)
	const summary = "====\ntrain.py FAILED\nRoot Cause (first observed failure):\n  rank      : 1\n====\n"
	if _, err := nodes[0].ReportFailure(ctx, rs[0], "rank 1 exitcode 1", summary); err != nil {
		t.Fatal(err)
	}
	for i := range nodes {
		if _, err := nodes[i].Next(ctx, rs[i]); err != nil {
			t.Fatal(err)
		}
	}
	rs = mustJoinAll(t, ctx, nodes...)
	for i, r := range rs {
		if r.Reason != MemberFailed || r.FailureSummary != summary {
			t.Fatalf("node %d: round after the failure: reason %s summary %q, want MemberFailed carrying the report's summary", i, r.Reason, r.FailureSummary)
		}
	}
	if err := nodes[0].FailJob(ctx, "restarts spent", rs[0].FailureSummary); err != nil {
		t.Fatal(err)
	}
	c, err := nodes[1].Next(ctx, rs[1])
	if err != nil || c.Reason != JobFailed {
		t.Fatalf("running node: Next = %+v, %v; want the round superseded with reason JobFailed", c, err)
	}
	if err := nodes[0].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	jctx, jcancel := context.WithTimeout(ctx, 10*time.Second)
	defer jcancel()
	_, err = nodes[1].Join(jctx)
	var jf *JobFailedError
	if !errors.As(err, &jf) || !errors.Is(err, ErrJobFailed) || jf.Summary != summary || jf.Detail != "restarts spent" {
		t.Fatalf("waiting node: Join = %v, want a *JobFailedError with the summary", err)
	}
	// A second FailJob keeps the first record.
	if err := nodes[1].FailJob(ctx, "second", ""); err != nil {
		t.Fatal(err)
	}
	late := h.node(h.cfg("c", 2, 2))
	_, err = late.Join(jctx)
	if !errors.As(err, &jf) || jf.Detail != "restarts spent" {
		t.Fatalf("late node: Join = %v, want the first failure", err)
	}
}

package rendezvous

import (
	"context"
	"slices"
	"testing"
	"time"
)

func TestSuspicionRules(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const after = 4 * time.Second
	for _, tc := range []struct {
		rule      string
		members   map[string]*cand
		now       time.Time
		wantEnded []string
		wantNext  time.Time
	}{
		{rule: "not-a-suspect", members: map[string]*cand{"a": {id: "a"}}, now: t0.Add(time.Hour)},
		{rule: "suspect-within-its-time", members: map[string]*cand{"a": {id: "a", suspect: true, suspectedAt: t0}},
			now: t0.Add(time.Second), wantNext: t0.Add(after)},
		{rule: "suspect-past-its-time", members: map[string]*cand{"a": {id: "a", suspect: true, suspectedAt: t0}},
			now: t0.Add(after), wantEnded: []string{"a"}},
		{rule: "earliest-of-several", members: map[string]*cand{
			"a": {id: "a", suspect: true, suspectedAt: t0},
			"b": {id: "b", suspect: true, suspectedAt: t0.Add(2 * time.Second)},
			"c": {id: "c", suspect: true, suspectedAt: t0.Add(time.Second)},
			"d": {id: "d", suspect: true, suspectedAt: t0.Add(-time.Hour)},
			"e": {id: "e", suspect: true, suspectedAt: t0.Add(-time.Minute)},
		}, now: t0.Add(time.Second), wantEnded: []string{"d", "e"}, wantNext: t0.Add(after)},
	} {
		ended, next := suspicionEnded(tc.members, tc.now, after)
		if !slices.Equal(ended, tc.wantEnded) || !next.Equal(tc.wantNext) {
			t.Errorf("%s: suspicionEnded = %v, %v; want %v, %v", tc.rule, ended, next, tc.wantEnded, tc.wantNext)
		}
	}
}

// A live node left out of a round for a missed acknowledgement, which
// never acknowledges anything again, is taken back once its lease proved
// it alive for suspectFor. A node frozen between AckTimeout and its fence
// (1 to 3.5 s with the defaults) while a round needing its acknowledgement
// was proposed and superseded sees, when it wakes, only the latest round
// record of its watch's batch, one without it: it never acknowledges the
// proposal it missed. Before, the closer kept it a suspect for as long as
// its lease lived: out of every round, with the job a node short.
func TestLiveSuspectTakenBack(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	nodes := h.register(ctx, h.cfg("a", 1, 3), h.cfg("b", 1, 3))
	// c: registered, its lease kept alive, and it never acknowledges.
	k := newKeys(nodes[0].cfg.Prefix, h.job)
	h.registerSilent(ctx, k, "c")
	// Round 1: a, b and c (only rank 0, a, acknowledges a first round).
	rs := mustJoinAll(t, ctx, nodes...)
	if rs[0].NumNodes != 3 {
		t.Fatalf("round 1 has %d nodes, want 3", rs[0].NumNodes)
	}
	// A worker failure: round 2 needs every member's acknowledgement; c's
	// never comes, c is left out, and a and b go on at 2 nodes.
	if _, err := nodes[1].ReportFailure(ctx, rs[1], "worker exited 1", ""); err != nil {
		t.Fatal(err)
	}
	rs = mustJoinAll(t, ctx, nodes...)
	if rs[0].NumNodes != 2 {
		t.Fatalf("round %d has %d nodes, want 2 (c left out)", rs[0].Number, rs[0].NumNodes)
	}
	left := time.Now()
	// c is alive (its lease lives): a round grows by it.
	wctx, wcancel := context.WithTimeout(ctx, 3*suspectFor(2*time.Second))
	defer wcancel()
	c, err := nodes[0].Next(wctx, rs[0])
	if err != nil {
		t.Fatalf("no round took node c back: %v", err)
	}
	if c.NumNodes != 3 || c.Reason != NodeWaiting {
		t.Errorf("round %d after c was left out: %d nodes (%s: %s), want 3 (%s)", c.Round, c.NumNodes, c.Reason, c.Detail, NodeWaiting)
	}
	t.Logf("node c taken back %s after it was left out", time.Since(left).Round(100*time.Millisecond))
}

package rendezvous

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestStallRules(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const grace, revoke = 3 * time.Second, 8 * time.Second
	closed := func(nodes, target int) *header {
		return &header{V: formatVersion, Round: 4, State: stateClosed, Nodes: nodes, Target: target, Closer: "a"}
	}
	every := func(n int) int { return n }
	even := func(n int) int { return n / 2 * 2 } // step 2 from 2
	for _, tc := range []struct {
		rule    string
		v       stallView
		now     time.Time
		want    stallAction
		wantAt  time.Time
		allowed func(int) int
	}{
		{rule: ruleStallNoRound, v: stallView{}, now: t0.Add(time.Hour), want: stallNone},
		{rule: ruleStallNoRound, v: stallView{head: &header{State: stateOpen, Round: 4}}, now: t0.Add(time.Hour), want: stallNone},
		{rule: ruleStallNoRound, v: stallView{head: &header{State: stateProposed, Round: 4, Nodes: 2}}, now: t0.Add(time.Hour), want: stallNone},
		{rule: ruleStallInRound, v: stallView{head: closed(2, 3), inRound: true}, now: t0.Add(time.Hour), want: stallNone},
		{rule: ruleStallFinishing, v: stallView{head: closed(2, 3), finishing: true}, now: t0.Add(time.Hour), want: stallNone},
		{rule: ruleStallAtSize, v: stallView{head: closed(3, 0)}, now: t0.Add(time.Hour), want: stallNone},
		{rule: ruleStallAtSize, v: stallView{head: closed(2, 2)}, now: t0.Add(time.Hour), want: stallNone},
		{rule: ruleStallAtSize, v: stallView{head: closed(2, 0)}, now: t0.Add(time.Hour), want: stallNone, allowed: even},
		{rule: ruleStallWaiting, v: stallView{head: closed(2, 3)}, now: t0.Add(time.Second), want: stallNone, wantAt: t0.Add(grace)},
		{rule: ruleStallWaiting, v: stallView{head: closed(2, 0)}, now: t0.Add(time.Second), want: stallNone, wantAt: t0.Add(grace)},
		{rule: ruleStallNudge, v: stallView{head: closed(2, 3)}, now: t0.Add(grace), want: stallNudge, wantAt: t0.Add(2 * grace)},
		{rule: ruleStallNudge, v: stallView{head: closed(2, 3)}, now: t0.Add(time.Hour), want: stallNudge, wantAt: t0.Add(time.Hour + grace)},
		{rule: ruleStallNudged, v: stallView{head: closed(2, 3), nudged: true}, now: t0.Add(grace + time.Second), want: stallNone, wantAt: t0.Add(revoke)},
		{rule: ruleStallRevokeClose, v: stallView{head: closed(2, 3), nudged: true}, now: t0.Add(revoke), want: stallRevokeCloser, wantAt: t0.Add(2 * revoke)},
		// The coordinator's current target, read before acting, sizes the
		// round as the closer does: a round record still carrying an
		// older, larger target is not overdue.
		{rule: ruleStallAtSize, v: stallView{head: closed(2, 3), nudged: true, desired: desiredRead, target: 2}, now: t0.Add(revoke), want: stallNone},
		{rule: ruleStallRevokeClose, v: stallView{head: closed(2, 2), nudged: true, desired: desiredRead, target: 3}, now: t0.Add(revoke), want: stallRevokeCloser, wantAt: t0.Add(2 * revoke)},
		{rule: ruleStallRevokeClose, v: stallView{head: closed(2, 0), nudged: true, desired: desiredRead}, now: t0.Add(revoke), want: stallRevokeCloser, wantAt: t0.Add(2 * revoke)},
		{rule: ruleStallStopping, v: stallView{head: closed(2, 3), nudged: true, desired: desiredRead, stopping: true}, now: t0.Add(revoke), want: stallNone},
		{rule: ruleStallUnread, v: stallView{head: closed(2, 3), nudged: true, desired: desiredUnread}, now: t0.Add(revoke), want: stallNone},
	} {
		v := tc.v
		v.since, v.maxNodes, v.grace, v.revokeAfter = t0, 3, grace, revoke
		v.allowed = every
		if tc.allowed != nil {
			v.allowed = tc.allowed
		}
		act, rule, at := stallDecide(v, tc.now)
		if act != tc.want || rule != tc.rule || !at.Equal(tc.wantAt) {
			t.Errorf("%s: stallDecide = %v, %s, wake %v; want %v, %s, wake %v", tc.rule, act, rule, at, tc.want, tc.rule, tc.wantAt)
		}
	}
}

// A node registered while the job's round is closed below its size and
// its closer does nothing (a closer whose watch lost the node's
// registration, or one wedged in a call: the state a node frozen past its
// lease can find when it registers again, issue 24) is not left waiting:
// it reminds the closer, then revokes the closer's lease, and the next
// node in the closer queue forms the round with it. Before, it waited
// for the join timeout (600 s by default) and logged nothing.
func TestWaitingNodeNotLeftOutByAWedgedCloser(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	cfg := func(id string) Config {
		c := h.cfg(id, 1, 3)
		if err := c.setDefaults(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	k := newKeys(cfg("x").Prefix, h.job)
	// x: the closer, registered first (oldest in the closer queue), its
	// lease kept alive, its closer doing nothing.
	lease, rev := h.registerSilent(ctx, k, "x")
	if _, err := h.cli.Put(ctx, k.QueueKey(rev), "x", clientv3.WithLease(lease)); err != nil {
		t.Fatal(err)
	}
	// y: a live node of the round.
	y := h.register(ctx, cfg("y"))[0]
	// Round 1, closed by x with x and y: one node short of --nnodes 1:3.
	ms := []Member{{NodeID: "x", Addr: "127.0.0.1", LocalWorldSize: 1, GroupRank: 0}, {NodeID: "y", Addr: "127.0.0.1", LocalWorldSize: 1, GroupRank: 1, BaseRank: 1}}
	hd := header{V: formatVersion, Round: 1, State: stateClosed, Nonce: "n1", Nodes: 2, World: 2, Chunks: 1,
		MasterAddr: "127.0.0.1", MasterPort: 29500, Closer: "x"}
	hv, _ := json.Marshal(hd)
	ops := []clientv3.Op{clientv3.OpPut(k.Head, string(hv))}
	for i, c := range encodeChunks(ms, 1) {
		ops = append(ops, clientv3.OpPut(k.Chunk(1, "n1", i), string(c)))
	}
	if _, err := h.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
	r1, err := y.Join(ctx)
	if err != nil || r1.Number != 1 {
		t.Fatalf("node y: join round 1: %v, %v", r1, err)
	}
	c := h.node(cfg("c"))
	start := time.Now()
	r, err := c.Join(ctx)
	if err != nil {
		t.Fatalf("node c was not taken into a round: %v", err)
	}
	t.Logf("node c joined round %d (%d nodes) %s after it registered", r.Number, r.NumNodes, time.Since(start).Round(100*time.Millisecond))
	if r.NumNodes != 2 {
		t.Errorf("node c's round has %d nodes, want 2 (y and c)", r.NumNodes)
	}
	logs := h.logs.String()
	for _, want := range []string{"reminding the closer", "revoking the closer's lease"} {
		if !strings.Contains(logs, want) {
			t.Errorf("node c's logs do not say %q", want)
		}
	}
}

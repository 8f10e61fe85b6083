package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A round closes at MAX at once (no last-call wait), with a fixed member
// list, contiguous ranks, base ranks summing unequal local world sizes, and
// rank 0's address and a port as MASTER_ADDR/MASTER_PORT.
func TestCloseAtMaxAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var nodes []*Node
	for i, id := range []string{"a", "b", "c"} {
		cfg := h.cfg(id, 2, 3)
		cfg.LocalWorldSize = i + 1
		cfg.Addr = fmt.Sprintf("10.0.0.%d", i+1)
		cfg.LastCallTimeout = 10 * time.Second // must not matter at MAX
		nodes = append(nodes, h.node(cfg))
	}
	start := time.Now()
	rs := mustJoinAll(t, ctx, nodes...)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("closing at MAX took %s; it must not wait for the last call", took)
	}
	r := rs[0]
	if r.NumNodes != 3 || r.WorldSize != 6 || len(r.Members) != 3 || r.Reason != "" {
		t.Fatalf("round: %+v", r)
	}
	for _, x := range rs {
		if x.Self.LocalWorldSize != map[string]int{"a": 1, "b": 2, "c": 3}[x.Self.NodeID] {
			t.Fatalf("self entry wrong: %+v", x.Self)
		}
	}
	if want := r.Members[0].Addr; r.MasterAddr != want {
		t.Fatalf("MASTER_ADDR %s, rank 0 is at %s", r.MasterAddr, want)
	}
}

// Below MAX a round closes at >= MIN after the last-call timeout.
func TestLastCallAtMin(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const lastCall = 700 * time.Millisecond
	var nodes []*Node
	for _, id := range []string{"a", "b"} {
		cfg := h.cfg(id, 2, 4)
		cfg.LastCallTimeout = lastCall
		nodes = append(nodes, h.node(cfg))
	}
	start := time.Now()
	rs := mustJoinAll(t, ctx, nodes...)
	took := time.Since(start)
	if took < lastCall || took > lastCall+3*time.Second {
		t.Fatalf("round of 2 (MIN) of 2:4 closed after %s; want last call %s plus a little", took, lastCall)
	}
	if rs[0].NumNodes != 2 {
		t.Fatalf("round: %+v", rs[0])
	}
}

// Join fails with a clear error when no round includes the node in time.
func TestJoinTimeout(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.cfg("lonely", 2, 2)
	cfg.JoinTimeout = 500 * time.Millisecond
	n := h.node(cfg)
	start := time.Now()
	_, err := n.Join(context.Background())
	if err == nil || !strings.Contains(err.Error(), "join timeout") || !strings.Contains(err.Error(), "--nnodes 2:2") {
		t.Fatalf("want a join-timeout error, got %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("join timeout took %s", took)
	}
}

// A target size (clamped to [MIN,MAX]) sizes rounds; nodes beyond it wait
// as spares; changing the target starts a new round at once; ranks of
// staying nodes are stable.
func TestTargetSparesAndStableRanks(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := newKeys(fleet.DefaultPrefix, h.job)
	h.setTarget(ctx, 2)
	var cfgs []Config
	for _, id := range []string{"a", "b", "c"} {
		c := h.cfg(id, 1, 3)
		c.LastCallTimeout = 5 * time.Second // target reached: must not wait
		cfgs = append(cfgs, c)
	}
	nodes := h.register(ctx, cfgs...)
	a, b, c := nodes[0], nodes[1], nodes[2]

	// c is a spare: its Join keeps waiting.
	spare := make(chan joinResult, 1)
	go func() { r, err := c.Join(ctx); spare <- joinResult{r, err, time.Now()} }()
	rs := mustJoinAll(t, ctx, a, b)
	if rs[0].NumNodes != 2 || rs[0].Target != 2 || rankOf(rs, "a") != 0 || rankOf(rs, "b") != 1 {
		t.Fatalf("target 2: round %+v", rs[0])
	}

	// Raise the target: members are told at once, c joins, a and b keep ranks.
	changed := time.Now()
	h.setTarget(ctx, 3)
	ch := nextAll(t, ctx, []*Node{a, b}, rs)
	// The change says the planned size, so the agent can tell its workers
	// the world size they will restart at.
	if ch[0].Reason != TargetChanged || ch[0].NumNodes != 3 || ch[0].WorldSize != 3 {
		t.Fatalf("change: %+v", ch[0])
	}
	rs = mustJoinAll(t, ctx, a, b)
	sr := <-spare
	if sr.err != nil {
		t.Fatal(sr.err)
	}
	rs = append(rs, sr.r)
	checkRound(t, rs)
	if took := time.Since(changed); took > 3*time.Second {
		t.Fatalf("target change to new round took %s", took)
	}
	if rs[0].NumNodes != 3 || rankOf(rs, "a") != 0 || rankOf(rs, "b") != 1 || rankOf(rs, "c") != 2 {
		t.Fatalf("target 3: %+v", rs)
	}

	// Target above MAX is clamped; below MIN too. Shrink to 1: rank 0 stays.
	h.setTarget(ctx, 1)
	ch = nextAll(t, ctx, []*Node{a, b, c}, rs)
	if ch[0].Reason != TargetChanged || ch[0].NumNodes != 1 || ch[0].WorldSize != 1 {
		t.Fatalf("change: %+v", ch[0])
	}
	r1, err := a.Join(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r1.NumNodes != 1 || r1.Rank != 0 || r1.Target != 1 {
		t.Fatalf("target 1: %+v", r1)
	}

	// No target: MAX again, the spares come back with their old ranks.
	if _, err := h.cli.Delete(ctx, k.desired); err != nil {
		t.Fatal(err)
	}
	rs = mustJoinAll(t, ctx, a, b, c)
	if rs[0].NumNodes != 3 || rs[0].Target != 0 || rs[0].Reason != TargetChanged {
		t.Fatalf("no target: %+v", rs[0])
	}
}

// runningAtTarget2 starts nodes a and b (1..4 nodes) in a round sized by
// target 2, raises the target to 4, and returns a joinLater that starts a
// new node's Join in the background.
func runningAtTarget2(t *testing.T, lastCall time.Duration) (context.Context, []*Node, []*Round, func(id string) chan joinResult) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	h.setTarget(ctx, 2)
	cfg := func(id string) Config {
		c := h.cfg(id, 1, 4)
		c.LastCallTimeout = lastCall
		return c
	}
	nodes := h.register(ctx, cfg("a"), cfg("b"))
	rs := mustJoinAll(t, ctx, nodes...)
	h.setTarget(ctx, 4)
	joinLater := func(id string) chan joinResult {
		n := h.node(cfg(id))
		out := make(chan joinResult, 1)
		go func() { r, err := n.Join(ctx); out <- joinResult{r, err, time.Now()} }()
		return out
	}
	return ctx, nodes, rs, joinLater
}

// growthRound checks the round the grown job formed, new nodes included.
func growthRound(t *testing.T, ctx context.Context, nodes []*Node, joins ...chan joinResult) []*Round {
	t.Helper()
	rs := mustJoinAll(t, ctx, nodes...)
	for _, j := range joins {
		res := <-j
		if res.err != nil {
			t.Fatal(res.err)
		}
		rs = append(rs, res.r)
	}
	checkRound(t, rs)
	return rs
}

// Raising the target grows the job in one round when the new nodes arrive
// a moment apart (the coordinator's placement starts them on different
// node agents), not one round per node.
func TestTargetGrowthWaitsForStaggeredNodes(t *testing.T) {
	t.Parallel()
	ctx, nodes, rs, joinLater := runningAtTarget2(t, 2*time.Second)
	cj := joinLater("c")
	time.Sleep(200 * time.Millisecond) // the second new node starts later
	dj := joinLater("d")
	ch := nextAll(t, ctx, nodes, rs)
	if ch[0].Reason != TargetChanged || ch[0].NumNodes != 4 {
		t.Fatalf("growth to target 4 with nodes 200ms apart: change %+v, want one round of 4 nodes", ch[0])
	}
	if rs := growthRound(t, ctx, nodes, cj, dj); rs[0].NumNodes != 4 {
		t.Fatalf("round after growth: %+v", rs[0])
	}
}

// When fewer nodes come than the raised target asks for, the job still
// grows with those that came, after the last call.
func TestTargetGrowthWithFewerNodesAfterLastCall(t *testing.T) {
	t.Parallel()
	const lastCall = 300 * time.Millisecond
	ctx, nodes, rs, joinLater := runningAtTarget2(t, lastCall)
	arrived := time.Now()
	cj := joinLater("c")
	ch := nextAll(t, ctx, nodes, rs)
	if ch[0].Reason != TargetChanged || ch[0].NumNodes != 3 {
		t.Fatalf("change: %+v, want growth to the 3 nodes there are", ch[0])
	}
	if waited := time.Since(arrived); waited < lastCall {
		t.Errorf("grew %s after the new node arrived, before the last call (%s) for the others", waited, lastCall)
	}
	if rs := growthRound(t, ctx, nodes, cj); rs[0].NumNodes != 3 {
		t.Fatalf("round after growth: %+v", rs[0])
	}
}

// Drain: a draining member is left out of the next round at once, and
// every member (the drained one too) sees a planned change with the
// smaller size, before anyone stops its workers.
func TestDrainIsAPlannedChangeForEveryMember(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes := h.register(ctx, h.cfg("a", 1, 3), h.cfg("b", 1, 3), h.cfg("c", 1, 3))
	rs := mustJoinAll(t, ctx, nodes...)
	if err := nodes[1].Drain(ctx); err != nil {
		t.Fatal(err)
	}
	for i, ch := range nextAll(t, ctx, nodes, rs) {
		if ch.Reason != NodeLeaving || ch.NumNodes != 2 || ch.WorldSize != 2 {
			t.Errorf("node %s: change %+v, want NodeLeaving to 2 nodes", nodes[i].ID(), ch)
		}
	}
	rs2 := mustJoinAll(t, ctx, nodes[0], nodes[2])
	if rs2[0].NumNodes != 2 || rankOf(rs2, "a") != 0 || rankOf(rs2, "c") != 1 {
		t.Fatalf("round after the drain: %+v", rs2)
	}
	// The drained node is not taken back as a spare while it drains.
	if err := nodes[1].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := nodes[0].Restarts(ctx); err != nil || n != 0 {
		t.Errorf("restarts %d %v after a drain; want 0", n, err)
	}
}

// A waiting node while the round is below MAX starts a new round; ranks of
// staying nodes are stable and MASTER_PORT is fresh.
func TestWaitingNodeStartsNewRound(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes := h.register(ctx, h.cfg("a", 2, 3), h.cfg("b", 2, 3))
	rs := mustJoinAll(t, ctx, nodes...)
	if rs[0].NumNodes != 2 {
		t.Fatalf("round: %+v", rs[0])
	}
	start := time.Now()
	c := h.node(h.cfg("c", 2, 3))
	cj := make(chan joinResult, 1)
	go func() { r, err := c.Join(ctx); cj <- joinResult{r, err, time.Now()} }()
	ch := nextAll(t, ctx, nodes, rs)
	if ch[0].Reason != NodeWaiting {
		t.Fatalf("change: %+v", ch[0])
	}
	rs2 := mustJoinAll(t, ctx, nodes...)
	res := <-cj
	if res.err != nil {
		t.Fatal(res.err)
	}
	rs2 = append(rs2, res.r)
	checkRound(t, rs2)
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("scale-up round took %s", took)
	}
	if rankOf(rs2, "a") != rankOf(rs, "a") || rankOf(rs2, "b") != rankOf(rs, "b") || rankOf(rs2, "c") != 2 {
		t.Fatalf("ranks not stable: %+v", rs2)
	}
	if rs2[0].MasterPort == rs[0].MasterPort {
		t.Fatalf("MASTER_PORT %d reused across rounds", rs2[0].MasterPort)
	}
}

// A node whose process dies (no revoke) is noticed within its lease TTL
// and the survivors form a new round at once; the node that had the
// highest rank moves into the dead node's rank, rank 0 stays.
func TestMemberLostOnCrash(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cfgs []Config
	for _, id := range []string{"a", "b", "c"} {
		c := h.cfg(id, 2, 3)
		c.LastCallTimeout = 5 * time.Second // shrinking must not wait for it
		cfgs = append(cfgs, c)
	}
	nodes := h.register(ctx, cfgs...)
	rs := mustJoinAll(t, ctx, nodes...)
	killed := time.Now()
	nodes[1].crash()
	surv := []*Node{nodes[0], nodes[2]}
	ch := nextAll(t, ctx, surv, []*Round{rs[0], rs[2]})
	if ch[0].Reason != MemberLost || !strings.Contains(ch[0].Detail, "b") {
		t.Fatalf("change: %+v", ch[0])
	}
	rs2 := mustJoinAll(t, ctx, surv...)
	took := time.Since(killed)
	if ttl := 2 * time.Second; took > ttl+2*time.Second {
		t.Fatalf("new round %s after the crash; lease TTL is %s", took, ttl)
	}
	if rankOf(rs2, "a") != 0 || rankOf(rs2, "c") != 1 || rs2[0].NumNodes != 2 {
		t.Fatalf("survivor ranks: %+v", rs2)
	}
	// Membership losses are not failures.
	if n, err := nodes[0].Restarts(ctx); err != nil || n != 0 {
		t.Fatalf("restarts %d %v, want 0", n, err)
	}
}

// A graceful Leave is noticed at once (well below the lease TTL), even when
// the leaving node is the closer: the next node takes over.
func TestLeaveNoticedAtOnceAndCloserFailover(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cfgs []Config
	for _, id := range []string{"a", "b", "c"} {
		c := h.cfg(id, 2, 3)
		c.LeaseTTL = 10 * time.Second
		cfgs = append(cfgs, c)
	}
	nodes := h.register(ctx, cfgs...) // a is the oldest: the closer
	rs := mustJoinAll(t, ctx, nodes...)
	left := time.Now()
	if err := nodes[0].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-nodes[0].LeaseLost():
	default:
		t.Fatal("LeaseLost not closed after Leave")
	}
	surv := []*Node{nodes[1], nodes[2]}
	ch := nextAll(t, ctx, surv, rs[1:])
	noticed := time.Since(left)
	if ch[0].Reason != MemberLost || noticed > 2*time.Second {
		t.Fatalf("change %+v after %s (TTL 10s)", ch[0], noticed)
	}
	rs2 := mustJoinAll(t, ctx, surv...)
	if rs2[0].NumNodes != 2 || time.Since(left) > 3*time.Second {
		t.Fatalf("round after leave: %+v after %s", rs2[0], time.Since(left))
	}
	if _, err := nodes[0].Join(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("join after leave: %v", err)
	}
}

// A worker failure counts one global restart per failed round however many
// nodes report it (when the next round closes with every member), starts a
// new round, and reports for a round already superseded do not count.
func TestReportFailureCountsOncePerRound(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes := h.register(ctx, h.cfg("a", 2, 3), h.cfg("b", 2, 3), h.cfg("c", 2, 3))
	rs := mustJoinAll(t, ctx, nodes...)
	var wg sync.WaitGroup
	counts := make([]int, 3)
	errs := make([]error, 3)
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			counts[i], errs[i] = nodes[i].ReportFailure(ctx, rs[i], fmt.Sprintf("worker exited 1 on %s", nodes[i].ID()), "")
		}()
	}
	wg.Wait()
	for i := range nodes {
		// The count grows when the next round closes, which may already
		// have happened when ReportFailure reads it back: 0 or 1, never more.
		if errs[i] != nil || counts[i] > 1 {
			t.Fatalf("node %d: restarts so far %d err %v; want at most 1 (one failed round)", i, counts[i], errs[i])
		}
	}
	ch := nextAll(t, ctx, nodes, rs)
	if ch[0].Reason != MemberFailed || !strings.Contains(ch[0].Detail, "worker exited 1") {
		t.Fatalf("change: %+v", ch[0])
	}
	rs2 := mustJoinAll(t, ctx, nodes...)
	if rs2[0].NumNodes != 3 || rs2[0].Reason != MemberFailed {
		t.Fatalf("round after failure: %+v", rs2[0])
	}
	if n, err := nodes[2].Restarts(ctx); err != nil || n != 1 {
		t.Fatalf("restarts after the failed round: %d %v; want 1", n, err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if rankOf(rs2, id) != rankOf(rs, id) {
			t.Fatalf("rank of %s changed across a restart", id)
		}
	}
	// A late report about the superseded round does not count.
	if n, err := nodes[0].ReportFailure(ctx, rs[0], "late", ""); err != nil || n != 1 {
		t.Fatalf("late report: %d %v", n, err)
	}
	if _, err := nodes[1].ReportFailure(ctx, rs2[1], "again", ""); err != nil {
		t.Fatalf("second failure: %v", err)
	}
	mustJoinAll(t, ctx, nodes...)
	if n, err := nodes[2].Restarts(ctx); err != nil || n != 2 {
		t.Fatalf("Restarts: %d %v", n, err)
	}
}

// deadNodeRound runs a, b and c (2..3 nodes, lease TTL 20 s; a registered
// first is the closer), crashes node dead without revoking its lease, has
// node reporter report a worker failure, and returns the nodes, the
// survivors' next round and how long it took after the report.
func deadNodeRound(t *testing.T, h *harness, ctx context.Context, dead, reporter int) ([]*Node, []*Round, time.Duration) {
	t.Helper()
	var cfgs []Config
	for _, id := range []string{"a", "b", "c"} {
		c := h.cfg(id, 2, 3)
		c.LeaseTTL = 20 * time.Second
		cfgs = append(cfgs, c)
	}
	nodes := h.register(ctx, cfgs...)
	rs := mustJoinAll(t, ctx, nodes...)
	nodes[dead].crash() // its lease lives on for 20s
	failed := time.Now()
	if _, err := nodes[reporter].ReportFailure(ctx, rs[reporter], "gloo: connection reset by peer", ""); err != nil {
		t.Fatal(err)
	}
	var survivors []*Node
	for i, n := range nodes {
		if i != dead {
			survivors = append(survivors, n)
		}
	}
	rs2 := mustJoinAll(t, ctx, survivors...)
	took := time.Since(failed)
	if rs2[0].NumNodes != 2 || rs2[0].Reason != MemberLost {
		t.Fatalf("round without the dead node: %+v", rs2[0])
	}
	// The survivors' workers failed because a node died: a membership
	// change, not a failure of the job.
	if n, err := nodes[reporter].Restarts(ctx); err != nil || n != 0 {
		t.Fatalf("restarts %d %v after a dead node; want 0", n, err)
	}
	t.Logf("survivors in a new round %s after the failure report", took)
	return nodes, rs2, took
}

// Fast failure path when the dead agent is the closer: the node that
// reported the failure sees the closer not act within AckTimeout, revokes
// its lease, and the next node in the closer queue forms the round; no
// waiting for the dead closer's lease TTL.
func TestDeadCloserReplacedWithoutWaitingForTTL(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, took := deadNodeRound(t, h, ctx, 0, 1); took > 6*time.Second {
		t.Fatalf("round without the dead closer took %s (TTL 20s, ack timeout 0.5s)", took)
	}
	if !strings.Contains(h.logs.String(), "revoking its lease") {
		t.Errorf("no log line says why the closer's lease was revoked")
	}
}

// Fast failure path: a node whose agent died but whose lease has not
// expired yet does not stall the next round for the TTL: it cannot
// acknowledge the proposal and is left out after AckTimeout.
func TestDeadAgentLeftOutWithoutWaitingForTTL(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, rs2, took := deadNodeRound(t, h, ctx, 2, 0)
	if took > 4*time.Second {
		t.Fatalf("round without the dead agent took %s (TTL 20s, ack timeout 0.5s)", took)
	}
	if !strings.Contains(rs2[0].Detail, "did not acknowledge") {
		t.Fatalf("round: %+v", rs2[0])
	}
}

// A node whose workers succeeded leaves with Finish without restarting the
// others; once everyone finished, the rendezvous is closed for good.
func TestFinishDoesNotRestartOthers(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes := h.register(ctx, h.cfg("a", 1, 3), h.cfg("b", 1, 3), h.cfg("c", 1, 3))
	rs := mustJoinAll(t, ctx, nodes...)
	if err := nodes[0].Finish(ctx, rs[0]); err != nil { // a is the closer, too
		t.Fatal(err)
	}
	// b and c must see no change: wait well past last-call and ack timeouts.
	nctx, ncancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	_, err := nodes[1].Next(nctx, rs[1])
	ncancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after a node finished, Next returned %v; want no change", err)
	}
	for i := 1; i < 3; i++ {
		if err := nodes[i].Finish(ctx, rs[i]); err != nil {
			t.Fatal(err)
		}
	}
	// A node that comes after the job finished is refused, as torch
	// refuses a closed rendezvous: it does not run the job over again.
	d := h.node(h.cfg("d", 1, 3))
	r, err := d.Join(ctx)
	if !errors.Is(err, ErrJobFinished) || !strings.Contains(fmt.Sprint(err), "--rdzv-id") {
		t.Fatalf("join after the job finished: %+v %v; want ErrJobFinished saying to use another --rdzv-id", r, err)
	}
}

// A larger round: MemberListLimit decides whether every node gets the whole
// list or only its own entry (reads stay O(1) per node at scale).
func TestLargeRoundMemberList(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 150
	var nodes []*Node
	for i := range n {
		cfg := h.cfg(fmt.Sprintf("n%03d", i), n, n)
		cfg.LocalWorldSize = 1 + i%3
		cfg.MemberListLimit = 100 // below n: only Self
		cfg.Logger = slog.New(slog.DiscardHandler)
		nodes = append(nodes, h.node(cfg))
	}
	rs := mustJoinAll(t, ctx, nodes...)
	if rs[0].NumNodes != n || rs[0].Members != nil || rs[0].Self.NodeID == "" {
		t.Fatalf("round: %+v", rs[0])
	}
	all, err := nodes[0].Members(ctx, rs[0])
	if err != nil || len(all) != n {
		t.Fatalf("Members: %d %v", len(all), err)
	}
	for _, r := range rs {
		if all[r.Rank] != r.Self {
			t.Fatalf("rank %d: list has %+v, node has %+v", r.Rank, all[r.Rank], r.Self)
		}
	}
}

func TestAssignKeepsRanks(t *testing.T) {
	prev := []Member{{NodeID: "a", GroupRank: 0}, {NodeID: "b", GroupRank: 1}, {NodeID: "c", GroupRank: 2}, {NodeID: "d", GroupRank: 3}}
	cands := []*cand{
		{id: "d", createRev: 4, rec: memberRec{Addr: "d", LWS: 2}},
		{id: "a", createRev: 1, rec: memberRec{Addr: "a", LWS: 1}},
		{id: "e", createRev: 9, rec: memberRec{Addr: "e", LWS: 1}},
		{id: "c", createRev: 3, rec: memberRec{Addr: "c", LWS: 1}},
	}
	got := assign(prev, cands, 3, nil) // b lost, size 3: a keeps 0, c keeps 2, d takes 1; e spare
	want := []string{"a", "d", "c"}
	for i, m := range got {
		if m.NodeID != want[i] || m.GroupRank != i {
			t.Fatalf("assign: %+v, want order %v", got, want)
		}
	}
	if got[1].BaseRank != 1 || got[2].BaseRank != 3 {
		t.Fatalf("base ranks: %+v", got)
	}
	got = assign(prev, cands, 4, nil) // newcomer e fills the free rank 1
	if got[1].NodeID != "e" || got[3].NodeID != "d" {
		t.Fatalf("assign with newcomer: %+v", got)
	}
	// With the coordinator's placement, placed nodes are kept over previous
	// members (a is dropped for e); kept nodes keep their ranks.
	got = assign(prev, cands, 3, map[string]bool{"c": true, "d": true, "e": true})
	ids := map[string]int{}
	for _, m := range got {
		ids[m.NodeID] = m.GroupRank
	}
	if _, kept := ids["a"]; kept || len(ids) != 3 || ids["c"] != 2 {
		t.Fatalf("assign with placement c,d,e: %+v", got)
	}
}

// A shrink keeps the nodes the coordinator placed the job on: the others
// become spares (their node agents drain them).
func TestShrinkKeepsPlacedNodes(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes := h.register(ctx, h.cfg("a", 1, 3), h.cfg("b", 1, 3), h.cfg("c", 1, 3))
	rs := mustJoinAll(t, ctx, nodes...)
	if rs[0].NumNodes != 3 {
		t.Fatalf("round: %+v", rs[0])
	}
	h.place(ctx, "c", "a")
	nextAll(t, ctx, nodes, rs)
	r2 := mustJoinAll(t, ctx, nodes[0], nodes[2])
	if r2[0].NumNodes != 2 {
		t.Fatalf("round after shrink: %+v", r2[0])
	}
	if r2[0].Rank != rankOf(rs, "a") {
		t.Fatalf("a's rank went from %d to %d", rankOf(rs, "a"), r2[0].Rank)
	}
}

// A live but slow agent left out for not acknowledging in time rejoins as
// a spare as soon as it acknowledges, and the next round takes it back.
func TestSlowAgentRejoinsAsSpare(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes := h.register(ctx, h.cfg("a", 2, 3), h.cfg("b", 2, 3), h.cfg("c", 2, 3))
	rs := mustJoinAll(t, ctx, nodes...)
	nodes[2].mu.Lock()
	nodes[2].ackDelay = 1500 * time.Millisecond // ack timeout is 500ms
	nodes[2].mu.Unlock()
	if _, err := nodes[0].ReportFailure(ctx, rs[0], "boom", ""); err != nil {
		t.Fatal(err)
	}
	rs2 := mustJoinAll(t, ctx, nodes[0], nodes[1])
	if rs2[0].NumNodes != 2 || !strings.Contains(rs2[0].Detail, "did not acknowledge") {
		t.Fatalf("round without the slow agent: %+v", rs2[0])
	}
	ch := nextAll(t, ctx, nodes[:2], rs2)
	if ch[0].Reason != NodeWaiting {
		t.Fatalf("change: %+v", ch[0])
	}
	rs3 := mustJoinAll(t, ctx, nodes...)
	if rs3[0].NumNodes != 3 || rankOf(rs3, "c") != 2 {
		t.Fatalf("round with the slow agent back: %+v", rs3)
	}
}

// A node id held by a live lease is refused with a clear error; the id of
// an agent that died is usable again once its lease expired.
func TestNodeIDReuse(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes := h.register(ctx, h.cfg("a", 1, 3), h.cfg("b", 1, 3))
	nodes[0].crash()
	start := time.Now()
	again := h.node(h.cfg("a", 1, 3))
	if err := again.register(ctx); err != nil {
		t.Fatalf("re-registering a dead agent's id: %v", err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("re-registration took %s (TTL 2s)", took)
	}
	dup := h.node(h.cfg("b", 1, 3))
	if _, err := dup.Join(ctx); err == nil || !strings.Contains(err.Error(), `node id "b" is already registered`) {
		t.Fatalf("duplicate id: %v", err)
	}
}

// LeftOut (issue 14's in-process resize): after a shrink, the node the new
// round leaves out learns it (its agent then tells the workers it kept to
// leave), while a node in the new round gets ErrIncluded once it joined.
func TestLeftOutAfterShrink(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cfgs []Config
	for _, id := range []string{"a", "b", "c"} {
		cfg := h.cfg(id, 1, 3)
		// All three must be in the first round: the round closes as soon as
		// the third registers (max), so a long last call costs nothing and
		// a slow registration (over 300 ms on 2 loaded cores) cannot leave
		// c out of it.
		cfg.LastCallTimeout = 10 * time.Second
		cfgs = append(cfgs, cfg)
	}
	nodes := h.register(ctx, cfgs...)
	rs := mustJoinAll(t, ctx, nodes...)
	first := rs[0].Number
	// Nobody is left out of the first round.
	short, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	if err := nodes[2].LeftOut(short, first); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LeftOut before any change = %v, want it to wait", err)
	}
	scancel()
	h.setTarget(ctx, 2)
	nextAll(t, ctx, nodes, rs)
	// The highest rank is dropped: stable ranks keep the others.
	var out *Node
	var in []*Node
	for _, n := range nodes {
		if rankOf(rs, n.ID()) == 2 {
			out = n
		} else {
			in = append(in, n)
		}
	}
	if err := out.LeftOut(ctx, first); err != nil {
		t.Fatalf("the dropped node's LeftOut = %v, want nil", err)
	}
	mustJoinAll(t, ctx, in...)
	for _, n := range in {
		if err := n.LeftOut(ctx, first); !errors.Is(err, ErrIncluded) {
			t.Errorf("node %s in the new round: LeftOut = %v, want ErrIncluded", n.ID(), err)
		}
	}
}

// An etcd restarted after an outage gives the fenced incarnation's lease a
// fresh TTL from when it came back, which can be later than the new
// registration began: its member key then outlives "one TTL from the
// start". The new incarnation must wait it out, not fail the job (a 65 s
// outage lost a job that way in CI).
func TestReRegistrationOutwaitsARestoredLease(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := h.cfg("a", 1, 3) // TTL 2 s
	n := h.node(cfg)
	old, err := h.cli.Grant(ctx, 4) // restored: 4 s left, more than TTL + 1 s
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.cli.Put(ctx, n.k.Member("a"), `{"addr":"127.0.0.1","lws":1}`, clientv3.WithLease(old.ID)); err != nil {
		t.Fatal(err)
	}
	if err := n.register(ctx); err != nil {
		t.Fatalf("re-registering while the previous incarnation's restored lease runs out: %v", err)
	}
}

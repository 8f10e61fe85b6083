package rendezvous

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

// The closer's rules, tested on decide alone: no etcd, no waiting.

var t0 = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

const (
	testLastCall = 5 * time.Second
	testAck      = time.Second
	testRegroup  = 7 * time.Second
)

// mkView builds the closer's view of a job with --nnodes min:max. Members of
// the round that did not join are lost, as the closer's snapshot finds them.
func mkView(minN, maxN int, opts ...func(*view)) view {
	v := view{
		members: map[string]*cand{}, acked: map[string]ackRec{},
		minNodes: minN, maxNodes: maxN, lastCallTimeout: testLastCall, ackTimeout: testAck,
		regroupTimeout: testRegroup,
	}
	for _, o := range opts {
		o(&v)
	}
	v.avail, v.draining = tally(v.members)
	for _, m := range v.round {
		if v.members[m.NodeID] != nil {
			v.present++
		} else {
			v.lost = append(v.lost, m.NodeID)
		}
	}
	return v
}

// joined registers live members, in join order.
func joined(ids ...string) func(*view) {
	return func(v *view) {
		for _, id := range ids {
			v.members[id] = &cand{id: id, rec: memberRec{Addr: id + ".example", LWS: 2}, createRev: int64(100 + len(v.members))}
		}
	}
}

func leaving(ids ...string) func(*view) {
	return func(v *view) {
		for _, id := range ids {
			v.members[id].rec.Leaving = true
		}
	}
}

func suspect(ids ...string) func(*view) {
	return func(v *view) {
		for _, id := range ids {
			v.members[id].suspect = true
		}
	}
}

func roundOf(ids []string) []Member {
	ms := make([]Member, len(ids))
	for i, id := range ids {
		ms[i] = Member{NodeID: id, Addr: id + ".example", LocalWorldSize: 2, GroupRank: i, BaseRank: 2 * i}
	}
	return ms
}

// head sets the round record: state, number, the target it was sized for,
// and its members in rank order.
func head(state string, round int64, target int, ids ...string) func(*view) {
	return func(v *view) {
		v.head = &header{Round: round, State: state, Target: target, Nodes: len(ids)}
		v.headRev = 10 * round
		v.round = roundOf(ids)
	}
}

func ackAll(v *view) { v.head.AckAll = true }

func acked(ids ...string) func(*view) {
	return func(v *view) {
		for _, id := range ids {
			v.acked[id] = ackRec{Round: v.head.Round, Nonce: v.head.Nonce, Port: 29500}
		}
	}
}

func target(size int, placed ...string) func(*view) {
	return func(v *view) { v.target, v.placed = size, placed }
}

func lastCallAt(t time.Time) func(*view) { return func(v *view) { v.lastCall = t } }
func ackSince(t time.Time) func(*view)   { return func(v *view) { v.ackSince = t } }
func failed(node string) func(*view) {
	return func(v *view) { v.failure = &failureRec{Node: node, Detail: "rank 3 exitcode 1"} }
}
func finished(v *view) { v.finish = true }

// outcome is the part of an action a test states.
type outcome struct {
	kind     actionKind
	wake     time.Time
	lastCall time.Time
	reason   Reason
	round    int64
	nodes    []string // proposed members in rank order; nil: open round
	spares   int
	ackAll   bool
	missing  []string
}

func outcomeOf(a action) outcome {
	o := outcome{kind: a.kind, wake: a.wake, lastCall: a.lastCall, reason: a.reason, round: a.round,
		spares: a.spares, ackAll: a.ackAll, missing: a.missing}
	for i, m := range a.members {
		if m.GroupRank != i {
			panic("members out of rank order")
		}
		o.nodes = append(o.nodes, m.NodeID)
	}
	return o
}

type decideCase struct {
	name string
	v    view
	now  time.Time
	want outcome
}

func runDecide(t *testing.T, cases []decideCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := outcomeOf(decide(tc.v, tc.now))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("decide:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func wakeAt(at, lastCall time.Time) outcome {
	return outcome{kind: actWake, wake: at, lastCall: lastCall}
}

var idle = outcome{kind: actWake}

func TestDecideLastCall(t *testing.T) {
	runDecide(t, []decideCase{
		{"max nodes propose the first round at once",
			mkView(2, 4, joined("a", "b", "c", "d")), t0,
			outcome{kind: actPropose, round: 1, nodes: []string{"a", "b", "c", "d"}}},
		{"below max with min: the last call starts",
			mkView(2, 4, joined("a", "b", "c")), t0,
			wakeAt(t0.Add(testLastCall), t0.Add(testLastCall))},
		{"before the last call ends: wait for it",
			mkView(2, 4, joined("a", "b", "c"), lastCallAt(t0.Add(testLastCall))), t0.Add(2 * time.Second),
			wakeAt(t0.Add(testLastCall), t0.Add(testLastCall))},
		{"at the end of the last call: propose with those there",
			mkView(2, 4, joined("a", "b", "c"), lastCallAt(t0.Add(testLastCall))), t0.Add(testLastCall),
			outcome{kind: actPropose, round: 1, nodes: []string{"a", "b", "c"}, lastCall: t0.Add(testLastCall)}},
		{"after the last call: propose",
			mkView(2, 4, joined("a", "b"), lastCallAt(t0)), t0.Add(time.Minute),
			outcome{kind: actPropose, round: 1, nodes: []string{"a", "b"}, lastCall: t0}},
		{"an open round keeps its number and reason",
			mkView(2, 4, head(stateOpen, 7, 0), func(v *view) { v.head.Reason, v.head.Detail = MemberLost, "node x lost" },
				joined("a", "b"), lastCallAt(t0)), t0,
			outcome{kind: actPropose, round: 7, reason: MemberLost, nodes: []string{"a", "b"}, ackAll: true, lastCall: t0}},
		{"everyone finished: the rendezvous closes for good, a later node does not start over",
			mkView(1, 4, head(stateClosed, 3, 0, "a", "b"), finished, joined("c")), t0,
			outcome{kind: actFinish}},
		{"finished: nothing more to do, whoever joins",
			mkView(1, 4, head(stateFinished, 3, 0, "a", "b"), joined("c", "d")), t0, idle},
	})
}

func TestDecideMinNotReached(t *testing.T) {
	runDecide(t, []decideCase{
		{"no nodes", mkView(2, 4), t0, idle},
		{"below min: wait for nodes, no deadline",
			mkView(2, 4, joined("a")), t0, idle},
		{"below min: a running last call is dropped",
			mkView(2, 4, joined("a"), lastCallAt(t0)), t0.Add(time.Minute), idle},
		{"a draining node does not count",
			mkView(2, 4, joined("a", "b"), leaving("b")), t0, idle},
		{"a suspect does not count",
			mkView(2, 4, joined("a", "b"), suspect("b")), t0, idle},
		{"open round below min: wait",
			mkView(2, 4, head(stateOpen, 5, 0), joined("a")), t0, idle},
	})
}

func TestDecideAckTimeout(t *testing.T) {
	deadline := t0.Add(ackWait(testAck, 3))
	runDecide(t, []decideCase{
		{"proposal waits for the acknowledgements",
			mkView(1, 4, head(stateProposed, 2, 0, "a", "b", "c"), joined("a", "b", "c"), ackAll, acked("a", "b"), ackSince(t0)), t0.Add(testAck / 2),
			wakeAt(deadline, time.Time{})},
		{"every acknowledgement in: close",
			mkView(1, 4, head(stateProposed, 2, 0, "a", "b", "c"), joined("a", "b", "c"), ackAll, acked("a", "b", "c"), ackSince(t0)), t0,
			outcome{kind: actClose}},
		{"a growth round closes on rank 0's acknowledgement",
			mkView(1, 4, head(stateProposed, 2, 0, "a", "b", "c"), joined("a", "b", "c"), acked("a"), ackSince(t0)), t0,
			outcome{kind: actClose}},
		{"ack timeout: the silent members are left out",
			mkView(1, 4, head(stateProposed, 2, 0, "a", "b", "c"), joined("a", "b", "c"), ackAll, acked("b"), ackSince(t0)), deadline,
			outcome{kind: actAckTimeout, missing: []string{"a", "c"}}},
		{"ack timeout of a growth round: rank 0 alone is missing",
			mkView(1, 4, head(stateProposed, 2, 0, "a", "b", "c"), joined("a", "b", "c"), ackSince(t0)), t0.Add(time.Minute),
			outcome{kind: actAckTimeout, missing: []string{"a"}}},
		{"ack timeout keeps a running last call",
			mkView(1, 4, head(stateProposed, 2, 0, "a", "b"), joined("a", "b"), ackAll, ackSince(t0), lastCallAt(t0)), deadline,
			outcome{kind: actAckTimeout, missing: []string{"a", "b"}, lastCall: t0}},
		{"a member lost before the close: propose again at once, every ack",
			mkView(1, 4, head(stateProposed, 2, 0, "a", "b", "c"), joined("a", "b"), acked("a"), ackSince(t0)), t0,
			outcome{kind: actPropose, reason: MemberLost, round: 3, nodes: []string{"a", "b"}, ackAll: true}},
	})
}

func TestAckWait(t *testing.T) {
	for _, c := range []struct {
		rule string
		size int
		want time.Duration
	}{
		{"a small round waits about AckTimeout", 2, time.Second + 500*time.Microsecond},
		{"a 10,000-node round waits for every member's read of its proposal", 10000, 3500 * time.Millisecond},
		{"a 20,000-node round waits longer still", 20000, 6 * time.Second},
	} {
		if got := ackWait(time.Second, c.size); got != c.want {
			t.Errorf("%s: ackWait(1s, %d) = %s, want %s", c.rule, c.size, got, c.want)
		}
	}
	// A large proposal is not given up on after AckTimeout alone.
	members := make([]string, 10000)
	for i := range members {
		members[i] = fmt.Sprintf("n%05d", i)
	}
	v := mkView(1, 10000, head(stateProposed, 2, 0, members...), joined(members...), ackSince(t0))
	if got := decide(v, t0.Add(2*time.Second)); got.kind != actWake {
		t.Errorf("a 10,000-node proposal 2s old without rank 0's acknowledgement: %v, want a wait", got.kind)
	}
	if got := decide(v, t0.Add(4*time.Second)); got.kind != actAckTimeout {
		t.Errorf("a 10,000-node proposal 4s old without rank 0's acknowledgement: %v, want an ack timeout", got.kind)
	}
}

// After an ack timeout the closer marks the silent members suspect and
// proposes again without them.
func TestProposalLeavesOutSuspects(t *testing.T) {
	v := mkView(1, 4, head(stateProposed, 2, 0, "a", "b", "c"), ackAll, joined("a", "b", "c"), suspect("a"), acked("b", "c"))
	got := outcomeOf(v.proposal(MemberLost, "node a did not acknowledge"))
	want := outcome{kind: actPropose, reason: MemberLost, round: 3, nodes: []string{"c", "b"}, ackAll: true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("proposal:\n got %+v\nwant %+v", got, want)
	}
	v = mkView(2, 4, head(stateProposed, 2, 0, "a", "b"), ackAll, joined("a", "b"), suspect("a"))
	if got := outcomeOf(v.proposal(MemberLost, "node a did not acknowledge")); got.kind != actPropose || got.nodes != nil || got.round != 3 {
		t.Errorf("too few left: want an open round 3, got %+v", got)
	}
}

func TestDecideGrowth(t *testing.T) {
	lc := t0.Add(testLastCall)
	runDecide(t, []decideCase{
		{"target raised, one node waiting: the target's last call starts",
			mkView(1, 8, head(stateClosed, 2, 2, "a", "b"), target(4), joined("a", "b", "c")), t0,
			wakeAt(lc, lc)},
		{"target raised, last call over: grow by those waiting",
			mkView(1, 8, head(stateClosed, 2, 2, "a", "b"), target(4), joined("a", "b", "c"), lastCallAt(lc)), lc,
			outcome{kind: actPropose, reason: TargetChanged, round: 3, nodes: []string{"a", "b", "c"}, lastCall: lc}},
		{"target raised, every new node waiting: grow at once",
			mkView(1, 8, head(stateClosed, 2, 2, "a", "b"), target(4), joined("a", "b", "c", "d")), t0,
			outcome{kind: actPropose, reason: TargetChanged, round: 3, nodes: []string{"a", "b", "c", "d"}}},
		{"no target, a node waiting below max: NodeWaiting after the last call",
			mkView(1, 4, head(stateClosed, 2, 0, "a", "b"), joined("a", "b", "c"), lastCallAt(t0)), t0,
			outcome{kind: actPropose, reason: NodeWaiting, round: 3, nodes: []string{"a", "b", "c"}, lastCall: t0}},
		{"round at its target: the waiting node stays a spare",
			mkView(1, 8, head(stateClosed, 2, 2, "a", "b"), target(2), joined("a", "b", "c"), lastCallAt(t0)), t0,
			idle},
		{"round at max: the waiting node stays a spare",
			mkView(1, 2, head(stateClosed, 2, 0, "a", "b"), joined("a", "b", "c")), t0,
			idle},
	})
}

func TestDecideShrink(t *testing.T) {
	runDecide(t, []decideCase{
		{"target lowered: shrink at once, lowest ranks kept",
			mkView(1, 8, head(stateClosed, 4, 4, "a", "b", "c", "d"), target(2), joined("a", "b", "c", "d")), t0,
			outcome{kind: actPropose, reason: TargetChanged, round: 5, nodes: []string{"a", "b"}, spares: 2}},
		{"target lowered with a placement: the placed nodes are kept",
			mkView(1, 8, head(stateClosed, 4, 4, "a", "b", "c", "d"), target(2, "c", "d"), joined("a", "b", "c", "d")), t0,
			outcome{kind: actPropose, reason: TargetChanged, round: 5, nodes: []string{"c", "d"}, spares: 2}},
		{"target below min: clamped to min",
			mkView(3, 8, head(stateClosed, 4, 4, "a", "b", "c", "d"), target(1), joined("a", "b", "c", "d")), t0,
			outcome{kind: actPropose, reason: TargetChanged, round: 5, nodes: []string{"a", "b", "c"}, spares: 1}},
		{"target stopped (none): back to max, nothing to do",
			mkView(1, 4, head(stateClosed, 4, 0, "a", "b", "c", "d"), joined("a", "b", "c", "d")), t0,
			idle},
	})
}

func TestDecideSpares(t *testing.T) {
	runDecide(t, []decideCase{
		{"more candidates than max: the latest to join wait",
			mkView(1, 3, joined("a", "b", "c", "d", "e")), t0,
			outcome{kind: actPropose, round: 1, nodes: []string{"a", "b", "c"}, spares: 2}},
		{"more candidates than the target: the placed nodes first",
			mkView(1, 4, target(2, "d", "e"), joined("a", "b", "c", "d", "e")), t0,
			outcome{kind: actPropose, round: 1, nodes: []string{"d", "e"}, spares: 3}},
		{"spares refill a lost member's rank",
			mkView(1, 3, head(stateClosed, 2, 0, "a", "b", "c"), joined("a", "c", "d", "e")), t0,
			outcome{kind: actPropose, reason: MemberLost, round: 3, nodes: []string{"a", "d", "c"}, spares: 1, ackAll: true}},
	})
}

func TestDecideLeaving(t *testing.T) {
	runDecide(t, []decideCase{
		{"a draining member: propose without it at once",
			mkView(1, 4, head(stateClosed, 2, 0, "a", "b", "c"), joined("a", "b", "c"), leaving("b")), t0,
			outcome{kind: actPropose, reason: NodeLeaving, round: 3, nodes: []string{"a", "c"}}},
		{"a draining member of a proposal: propose again without it",
			mkView(1, 4, head(stateProposed, 2, 0, "a", "b", "c"), joined("a", "b", "c"), leaving("c"), ackSince(t0)), t0,
			outcome{kind: actPropose, reason: NodeLeaving, round: 3, nodes: []string{"a", "b"}}},
		{"a draining member leaves too few: the round is recorded open",
			mkView(2, 4, head(stateClosed, 2, 0, "a", "b"), joined("a", "b"), leaving("b")), t0,
			outcome{kind: actPropose, reason: NodeLeaving, round: 3}},
		{"a draining spare changes nothing",
			mkView(1, 2, head(stateClosed, 2, 0, "a", "b"), joined("a", "b", "c"), leaving("c")), t0,
			idle},
	})
}

func TestDecideFailedOrLost(t *testing.T) {
	runDecide(t, []decideCase{
		{"a worker failure: the same members again, every ack",
			mkView(1, 4, head(stateClosed, 2, 0, "a", "b"), joined("a", "b"), failed("b")), t0,
			outcome{kind: actPropose, reason: MemberFailed, round: 3, nodes: []string{"a", "b"}, ackAll: true}},
		{"a failure with a lost member is a loss",
			mkView(1, 4, head(stateClosed, 2, 0, "a", "b"), joined("a"), failed("a")), t0,
			outcome{kind: actPropose, reason: MemberLost, round: 3, nodes: []string{"a"}, ackAll: true}},
		{"a lost member: the others go on at once",
			mkView(1, 4, head(stateClosed, 2, 0, "a", "b", "c"), joined("a", "b")), t0,
			outcome{kind: actPropose, reason: MemberLost, round: 3, nodes: []string{"a", "b"}, ackAll: true}},
		{"a lost member leaves too few: the round is recorded open",
			mkView(2, 4, head(stateClosed, 2, 0, "a", "b"), joined("a")), t0,
			outcome{kind: actPropose, reason: MemberLost, round: 3}},
		{"a member finished: nobody restarts",
			mkView(1, 4, head(stateClosed, 2, 0, "a", "b"), joined("a"), finished), t0,
			idle},
		{"a malformed round record: the next round goes above it",
			mkView(1, 4, func(v *view) { v.headBad, v.headRev = true, 42 }, joined("a", "b", "c", "d")), t0,
			outcome{kind: actPropose, round: 43, nodes: []string{"a", "b", "c", "d"}}},
	})
}

// decide reads only its arguments and changes nothing in the view.
func TestDecideIsPure(t *testing.T) {
	v := mkView(1, 4, head(stateClosed, 2, 2, "a", "b"), target(4, "a", "b", "c"), joined("a", "b", "c", "d"), suspect("d"))
	before := outcomeOf(decide(v, t0))
	if before.kind != actWake || before.lastCall != t0.Add(testLastCall) {
		t.Fatalf("want the target's last call, got %+v", before)
	}
	snap := *v.members["d"]
	for range 3 {
		if got := outcomeOf(decide(v, t0)); !reflect.DeepEqual(got, before) {
			t.Fatalf("decide is not deterministic: %+v then %+v", before, got)
		}
	}
	if *v.members["d"] != snap || v.lastCall != (time.Time{}) {
		t.Fatalf("decide changed the view")
	}
}

func sizes(allowed ...int) func(*view) { return func(v *view) { v.sizes = allowed } }
func step(n int) func(*view)           { return func(v *view) { v.step = n } }

// The job spec's sizes and step bind the rendezvous as they bind the
// coordinator's engine: an unplanned loss never forms a round of a size the
// engine would never allow (issue 23).
func TestDecideAllowedSizes(t *testing.T) {
	lc := t0.Add(testLastCall)
	runDecide(t, []decideCase{
		{"sizes {2,4}: a lost node at 4 forms 2, never 3 (the third waits as a spare)",
			mkView(2, 4, sizes(2, 4), head(stateClosed, 5, 4, "a", "b", "c", "d"), target(4), joined("a", "b", "c")), t0,
			outcome{kind: actPropose, reason: MemberLost, round: 6, nodes: []string{"a", "b"}, spares: 1, ackAll: true}},
		{"sizes {2,4}: a failure at 3 live nodes forms 2",
			mkView(2, 4, sizes(2, 4), head(stateClosed, 5, 0, "a", "b"), joined("a", "b", "c"), failed("b")), t0,
			outcome{kind: actPropose, reason: MemberFailed, round: 6, nodes: []string{"a", "b"}, spares: 1, ackAll: true}},
		{"sizes {2,4}: a node waiting beside a round of 2 does not grow it to 3",
			mkView(2, 4, sizes(2, 4), head(stateClosed, 6, 0, "a", "b"), joined("a", "b", "c"), lastCallAt(t0)), t0,
			idle},
		{"sizes {2,4}: two nodes waiting grow the round to 4 at once",
			mkView(2, 4, sizes(2, 4), head(stateClosed, 6, 0, "a", "b"), joined("a", "b", "c", "d")), t0,
			outcome{kind: actPropose, reason: NodeWaiting, round: 7, nodes: []string{"a", "b", "c", "d"}}},
		{"sizes {2,4}: the first round with 3 nodes after the last call is 2",
			mkView(2, 4, sizes(2, 4), joined("a", "b", "c"), lastCallAt(lc)), lc,
			outcome{kind: actPropose, round: 1, nodes: []string{"a", "b"}, spares: 1, lastCall: lc}},
		{"sizes {2,4}: a lost node at 2 leaves an open round, not 1",
			mkView(2, 4, sizes(2, 4), head(stateClosed, 5, 0, "a", "b"), joined("a")), t0,
			outcome{kind: actPropose, reason: MemberLost, round: 6}},
		{"step 2 from 2 to 6: a lost node at 6 forms 4, never 5",
			mkView(2, 6, step(2), head(stateClosed, 3, 6, "a", "b", "c", "d", "e", "f"), target(6), joined("a", "b", "c", "d", "e")), t0,
			outcome{kind: actPropose, reason: MemberLost, round: 4, nodes: []string{"a", "b", "c", "d"}, spares: 1, ackAll: true}},
		{"step 2 from 1 to 5: a target of 4 between allowed sizes sizes to 3",
			mkView(1, 5, step(2), head(stateClosed, 3, 1, "a"), target(4), joined("a", "b", "c", "d")), t0,
			outcome{kind: actPropose, reason: TargetChanged, round: 4, nodes: []string{"a", "b", "c"}, spares: 1}},
		{"no sizes: a lost node at 4 forms 3 as before",
			mkView(2, 4, head(stateClosed, 5, 4, "a", "b", "c", "d"), target(4), joined("a", "b", "c")), t0,
			outcome{kind: actPropose, reason: MemberLost, round: 6, nodes: []string{"a", "b", "c"}, ackAll: true}},
	})
}

func TestFit(t *testing.T) {
	for _, tc := range []struct {
		rule string
		v    view
		n    int
		want int
	}{
		{"below min: none", mkView(2, 4), 1, 0},
		{"every size by default", mkView(2, 4), 3, 3},
		{"above max: max", mkView(2, 4), 9, 4},
		{"sizes: the largest at most n", mkView(2, 8, sizes(2, 4, 8)), 7, 4},
		{"sizes: exact", mkView(2, 8, sizes(2, 4, 8)), 8, 8},
		{"step: down to min plus a multiple of step", mkView(2, 9, step(3)), 7, 5},
		{"step: max not on the grid", mkView(2, 9, step(3)), 9, 8},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := tc.v.fit(tc.n); got != tc.want {
				t.Errorf("fit(%d) = %d, want %d", tc.n, got, tc.want)
			}
		})
	}
}

// refenced marks registered members of the round as new incarnations (they
// lost their lease and registered again, as after an etcd outage): lost,
// though registered, as the closer counts them.
func refenced(v view, ids ...string) view {
	for _, id := range ids {
		v.present--
		v.lost = append(v.lost, id)
	}
	return v
}

// Issue 24: after an etcd outage longer than the lease every member of the
// round is fenced and registers again; the first one back must not form a
// round of one that the others then grow (every node restarting twice).
func TestDecideRegroupAfterOutage(t *testing.T) {
	deadline := t0.Add(testRegroup)
	runDecide(t, []decideCase{
		{"every member fenced, one back: wait for the others",
			refenced(mkView(1, 3, head(stateClosed, 4, 0, "a", "b", "c"), joined("a")), "a"), t0,
			wakeAt(deadline, deadline)},
		{"every member fenced, two back: still wait for the third",
			refenced(mkView(1, 3, head(stateClosed, 4, 0, "a", "b", "c"), joined("a", "b"), lastCallAt(deadline)), "a", "b"), t0.Add(time.Second),
			wakeAt(deadline, deadline)},
		{"every member back: the round re-forms at once at its size",
			refenced(mkView(1, 3, head(stateClosed, 4, 0, "a", "b", "c"), joined("a", "b", "c"), lastCallAt(deadline)), "a", "b", "c"), t0.Add(time.Second),
			outcome{kind: actPropose, reason: MemberLost, round: 5, nodes: []string{"a", "b", "c"}, ackAll: true, lastCall: deadline}},
		{"regroup timeout: go on with the members back",
			refenced(mkView(1, 3, head(stateClosed, 4, 0, "a", "b", "c"), joined("a", "b"), lastCallAt(deadline)), "a", "b"), deadline,
			outcome{kind: actPropose, reason: MemberLost, round: 5, nodes: []string{"a", "b"}, ackAll: true, lastCall: deadline}},
		{"regroup timeout with too few back: the round is recorded open",
			refenced(mkView(2, 3, head(stateClosed, 4, 0, "a", "b", "c"), joined("a"), lastCallAt(deadline)), "a"), deadline,
			outcome{kind: actPropose, reason: MemberLost, round: 5, lastCall: deadline}},
		{"a member survived: no regroup, the others go on at once",
			mkView(1, 3, head(stateClosed, 4, 0, "a", "b", "c"), joined("a")), t0,
			outcome{kind: actPropose, reason: MemberLost, round: 5, nodes: []string{"a"}, ackAll: true}},
		{"every member lost after they finished: nothing restarts",
			mkView(1, 3, head(stateClosed, 4, 0, "a", "b"), finished), t0,
			outcome{kind: actFinish}},
	})
}

package coordinator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// writes is the writes a cycle would make of d on the view as it is (a
// full comparison after a read), without committing or applying them.
func (c *Coordinator) writes(d policy.Decision) (units [][]clientv3.Op, changed map[policy.ReasonKind]int, running map[string]bool, again bool) {
	p := planNow(c, d, !c.view.haveLast)
	return p.units, p.changed, p.running, p.again
}

// fakeCommitter records the plans it is given and fails with err.
type fakeCommitter struct {
	plans []*plan
	err   error
}

func (f *fakeCommitter) commit(_ context.Context, p *plan) (int, error) {
	f.plans = append(f.plans, p)
	if f.err != nil {
		return 0, f.err
	}
	n := 0
	for _, u := range p.units {
		n += len(u)
	}
	return n, nil
}

// viewRecords is what of the view a cycle's writes change, copied.
type viewRecords struct {
	Desired     map[string]fleet.Desired
	Assigned    map[string]map[string]int64
	Statuses    map[string]fleet.Status
	Events      map[string][]evRec
	EventsTotal int
	Usage       []api.TeamUsage
	HaveLast    bool
	LastAllocs  []api.Allocation
	LastReasons []policy.Reason
	Touched     map[string]bool
}

func recordsOf(v *view) viewRecords {
	r := viewRecords{Desired: maps.Clone(v.desired), Assigned: map[string]map[string]int64{}, Statuses: map[string]fleet.Status{},
		Events: map[string][]evRec{}, EventsTotal: v.events.total, Usage: slices.Clone(v.usage), HaveLast: v.haveLast,
		LastAllocs: slices.Clone(v.lastAllocs), LastReasons: slices.Clone(v.lastReasons), Touched: maps.Clone(v.touched)}
	for job, m := range v.assigned {
		r.Assigned[job] = maps.Clone(m)
	}
	for job, s := range v.statuses {
		r.Statuses[job] = *s
	}
	for job, evs := range v.events.byJob {
		r.Events[job] = slices.Clone(evs)
	}
	return r
}

// opKeys names a plan's ops ("put <key>", "delete <key>"), in order.
func opKeys(p *plan) []string {
	var out []string
	for _, u := range p.units {
		for _, op := range u {
			verb := "put "
			if op.IsDelete() {
				verb = "delete "
			}
			out = append(out, verb+string(op.KeyBytes()))
		}
	}
	return out
}

// planNow plans d as a cycle that no follow-up comes after: settle writes
// the statuses it held.
func planNow(c *Coordinator, d policy.Decision, full bool) *plan {
	p := c.plan(d, full)
	p.settle(false)
	return p
}

// newPlanCoordinator is a coordinator over an empty view and no etcd.
func newPlanCoordinator(t testing.TB) *Coordinator {
	t.Helper()
	c := New(nil, Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	c.view = newView(c.store.Keys, c.log)
	c.view.load(context.Background(), nil, &fleet.CoordinatorSnapshot{Rev: 1}, time.Unix(1000, 0))
	return c
}

// The cycle's writes as phases that return a plan, and a committer: the
// view takes a plan only once it is committed. No etcd: a fake committer
// records the plans and fails when told.
func TestPlanIsAppliedOnlyAfterItsCommit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	k := fleet.NewKeys("")
	alloc := api.Allocation{Job: "a", Team: "t", Flavor: "f", Size: 2, AcceleratorsPerNode: 8, Nodes: []string{"n1", "n2"}, Since: t0}
	usage := []api.TeamUsage{{Team: "t", Flavor: "f", Nominal: 16, Used: 16}}
	admit := policy.Decision{Now: t0, Allocations: []api.Allocation{alloc},
		Reasons: []policy.Reason{
			{Job: "a", Team: "t", Kind: policy.KindAdmitted, ToSize: 2, Message: "admitted"},
			{Job: "b", Team: "t", Kind: policy.KindPending, Code: policy.CodeNoCapacity, Message: "no room"},
		}, Teams: usage}
	t1 := t0.Add(time.Minute)
	preempt := policy.Decision{Now: t1,
		Reasons: []policy.Reason{
			{Job: "a", Team: "t", Kind: policy.KindPreempted, FromSize: 2, Message: "preempted for b"},
			{Job: "b", Team: "t", Kind: policy.KindPending, Code: policy.CodeNoCapacity, Message: "no room"},
		}, Teams: []api.TeamUsage{{Team: "t", Flavor: "f", Nominal: 16}}}
	steady := policy.Decision{Now: t0.Add(time.Second), Allocations: []api.Allocation{alloc},
		Reasons: []policy.Reason{
			{Job: "a", Team: "t", Kind: policy.KindRunning, FromSize: 2, ToSize: 2, Message: "running"},
			{Job: "b", Team: "t", Kind: policy.KindPending, Code: policy.CodeNoCapacity, Message: "no room"},
		}, Teams: usage}
	admitWrites := []string{
		"put " + k.Desired("a"), "put " + k.Assignment("n1", "a"), "put " + k.Assignment("n2", "a"),
		"put " + k.Event(t0, "a"), // a runs as admitted: no status record
		"put " + k.Status("b"), "put " + k.Event(t0, "b"),
		"put " + k.Usage(),
	}
	preemptWrites := []string{
		"put " + k.Desired("a"), "delete " + k.Assignment("n1", "a"), "delete " + k.Assignment("n2", "a"),
		"put " + k.Status("a"), "put " + k.Event(t1, "a"),
		"put " + k.Usage(),
	}
	// a finishes: released, placed nowhere, explained by no reason.
	finish := policy.Decision{Now: t1, Released: []string{"a"},
		Reasons: []policy.Reason{
			{Job: "b", Team: "t", Kind: policy.KindPending, Code: policy.CodeNoCapacity, Message: "no room"},
		}, Teams: []api.TeamUsage{{Team: "t", Flavor: "f", Nominal: 16}}}
	finishWrites := []string{
		"put " + k.Desired("a"), "delete " + k.Assignment("n1", "a"), "delete " + k.Assignment("n2", "a"),
		"put " + k.Usage(), // a had no status record to delete
	}
	errBoom := errors.New("etcd unavailable")
	for _, tc := range []struct {
		rule      string
		committed []policy.Decision // committed first
		d         policy.Decision
		fail      error
		want      []string // the plan's writes (sorted)
		check     func(*testing.T, *view)
	}{
		{rule: "a committed plan is in the view", d: admit, want: admitWrites, check: func(t *testing.T, v *view) {
			if d := v.desired["a"]; !d.Running() || d.Size != 2 || d.Generation != 1 {
				t.Errorf("a's desired record in the view: %+v", d)
			}
			if !reflect.DeepEqual(v.assigned["a"], map[string]int64{"n1": 1, "n2": 1}) {
				t.Errorf("a's assignments in the view: %v", v.assigned["a"])
			}
			// The admission is the event; a runs as its desired record
			// places it, so it has no status record: the record implies
			// Running at 2 nodes since the admission, with the admission's
			// message (no status write per admission, none per finish).
			if s, has := v.statuses["a"]; has {
				t.Errorf("a has a status record in the view: %+v, want none", s)
			}
			d := v.desired["a"]
			if s, ok := fleet.ImpliedStatus(&d); !ok || s.Kind != policy.KindRunning || s.FromSize != 2 || s.ToSize != 2 || s.Message != "admitted" || !s.Since.Equal(t0) {
				t.Errorf("the status a's desired record implies: %+v %v, want Running at 2 nodes since the admission, its message", s, ok)
			}
			if s := v.statuses["b"]; s == nil || s.Kind != policy.KindPending {
				t.Errorf("b's status in the view: %+v", s)
			}
			if v.events.total != 2 || !reflect.DeepEqual(v.usage, usage) || !v.haveLast {
				t.Errorf("view after the commit: %d events, usage %v, haveLast %v", v.events.total, v.usage, v.haveLast)
			}
		}},
		{rule: "a failed commit leaves the view unchanged", d: admit, fail: errBoom, want: admitWrites},
		{rule: "a deposed leader's commit leaves the view unchanged", committed: []policy.Decision{admit}, d: preempt, fail: errNotLeader, want: preemptWrites},
		{rule: "the same decision again writes nothing", committed: []policy.Decision{admit, steady}, d: steady},
		{rule: "an admitted job running on unchanged writes nothing", committed: []policy.Decision{admit}, d: steady},
		{rule: "a finished job that ran as admitted writes its stop record and deletes no status", committed: []policy.Decision{admit}, d: finish, want: finishWrites},
		{rule: "a preempted job's stop record goes with its assignments' deletion", committed: []policy.Decision{admit}, d: preempt, want: preemptWrites,
			check: func(t *testing.T, v *view) {
				d := v.desired["a"]
				if d.Running() || d.Stop == nil || d.Stop.Kind != fleet.StopPreemption || d.Stop.Reason != "preempted for b" || d.Generation != 2 {
					t.Errorf("a's desired record in the view: %+v (stop %+v)", d, d.Stop)
				}
				if _, has := v.assigned["a"]; has {
					t.Errorf("a keeps assignments in the view: %v", v.assigned["a"])
				}
			}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			c := newPlanCoordinator(t)
			for _, d := range tc.committed {
				if _, err := c.commitPlan(context.Background(), &fakeCommitter{}, planNow(c, d, !c.view.haveLast)); err != nil {
					t.Fatal(err)
				}
			}
			before := recordsOf(c.view)
			fc := &fakeCommitter{err: tc.fail}
			p := planNow(c, tc.d, !c.view.haveLast)
			if got := recordsOf(c.view); !reflect.DeepEqual(got, before) {
				t.Fatalf("planning changed the view:\n%+v\nwas\n%+v", got, before)
			}
			n, err := c.commitPlan(context.Background(), fc, p)
			if len(fc.plans) != 1 || fc.plans[0] != p {
				t.Fatalf("the committer got %d plans, want the one planned", len(fc.plans))
			}
			got := opKeys(p)
			slices.Sort(got)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("the plan writes\n%v\nwant\n%v", got, want)
			}
			if tc.fail != nil {
				if !errors.Is(err, tc.fail) {
					t.Errorf("commit: %v, want %v", err, tc.fail)
				}
				if after := recordsOf(c.view); !reflect.DeepEqual(after, before) {
					t.Errorf("a failed commit changed the view:\n%+v\nwas\n%+v", after, before)
				}
				// Nothing is lost: the same decision plans the same writes.
				again := opKeys(planNow(c, tc.d, !c.view.haveLast))
				slices.Sort(again)
				if !slices.Equal(again, got) {
					t.Errorf("after the failed commit the decision writes %v, want %v again", again, got)
				}
				return
			}
			if err != nil || n != len(want) {
				t.Fatalf("commit wrote %d ops: %v, want %d", n, err, len(want))
			}
			if tc.check != nil {
				tc.check(t, c.view)
			}
			// Applied: the next cycle on the same decision writes nothing
			// but the events it counts again (a decision worth an event is
			// one every time it is made).
			evented := map[string]bool{}
			for _, e := range p.events {
				evented["put "+e.rec.key] = true
			}
			for _, full := range []bool{false, true} {
				again := slices.DeleteFunc(opKeys(planNow(c, tc.d, full)), func(key string) bool { return evented[key] })
				if len(again) != 0 {
					t.Errorf("after the commit the same decision (full %v) still writes %v", full, again)
				}
			}
		})
	}
}

// The history's bound is planned with the events the plan adds and
// applied with them: a failed commit neither records nor prunes.
func TestPlannedPruneCountsThePlansEvents(t *testing.T) {
	for _, tc := range []struct {
		rule              string
		perJob, total     int
		fail              error
		wantDel, wantLeft int
	}{
		{rule: "a job over its bound loses its oldest", perJob: 3, total: 100, wantDel: 1, wantLeft: 3},
		{rule: "the history over its bound loses the oldest", perJob: 100, total: 2, wantDel: 2, wantLeft: 2},
		{rule: "within the bounds nothing goes", perJob: 4, total: 100, wantDel: 0, wantLeft: 4},
		{rule: "a failed commit prunes nothing", perJob: 3, total: 100, fail: errNotLeader, wantDel: 1, wantLeft: 3},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			c := newPlanCoordinator(t)
			c.cfg.MaxEventsPerJob, c.cfg.MaxEvents = tc.perJob, tc.total
			t0 := time.Unix(1000, 0)
			for i := range 3 {
				c.view.events.record(policy.Reason{Job: "a", Kind: policy.KindShrunk, FromSize: i + 2, ToSize: i + 1}, t0.Add(time.Duration(i)*time.Second), time.Hour)
			}
			c.view.events.remove(nil)
			d := policy.Decision{Now: t0.Add(time.Hour), Reasons: []policy.Reason{{Job: "a", Kind: policy.KindShrunk, FromSize: 9, ToSize: 8}}}
			before := recordsOf(c.view)
			p := planNow(c, d, true)
			if len(p.pruned) != tc.wantDel {
				t.Fatalf("planned %d deletions (%v), want %d", len(p.pruned), p.pruned, tc.wantDel)
			}
			_, err := c.commitPlan(context.Background(), &fakeCommitter{err: tc.fail}, p)
			if tc.fail != nil {
				if err == nil || !reflect.DeepEqual(recordsOf(c.view), before) {
					t.Errorf("a failed commit: %v, and the history changed", err)
				}
				return
			}
			if c.view.events.total != tc.wantLeft || len(c.view.events.byJob["a"]) != tc.wantLeft {
				t.Errorf("history holds %d events (a: %d), want %d", c.view.events.total, len(c.view.events.byJob["a"]), tc.wantLeft)
			}
			if evs := c.view.events.byJob["a"]; evs[len(evs)-1].e.ToSize != 8 {
				t.Errorf("the newest event is %+v, want the plan's", evs[len(evs)-1].e)
			}
		})
	}
}

// A node a preempted job leaves is released in etcd before another job's
// assignment names it: the taking units come after every other (plan.takes),
// and commit sends them only once those are written. Before, the admitted
// job's unit came first, and a failed transaction of the preempted job's
// stop left both jobs assigned to the node, the agent running both.
func TestPlanReleasesNodesBeforeTakingThem(t *testing.T) {
	t0 := time.Unix(1000, 0)
	k := fleet.NewKeys("")
	c := newPlanCoordinator(t)
	onA := api.Allocation{Job: "a", Team: "t", Flavor: "f", Size: 2, AcceleratorsPerNode: 8, Nodes: []string{"n1", "n2"}, Since: t0}
	admit := policy.Decision{Now: t0, Allocations: []api.Allocation{onA},
		Reasons: []policy.Reason{{Job: "a", Team: "t", Kind: policy.KindAdmitted, ToSize: 2, Message: "admitted"}}}
	if _, err := c.commitPlan(context.Background(), &fakeCommitter{}, planNow(c, admit, !c.view.haveLast)); err != nil {
		t.Fatal(err)
	}
	t1 := t0.Add(time.Minute)
	onB := onA
	onB.Job, onB.Since = "b", t1
	preempt := policy.Decision{Now: t1, Allocations: []api.Allocation{onB},
		Reasons: []policy.Reason{
			{Job: "a", Team: "t", Kind: policy.KindPreempted, FromSize: 2, Message: "preempted for b"},
			{Job: "b", Team: "t", Kind: policy.KindAdmitted, ToSize: 2, Message: "admitted"},
		}}
	p := planNow(c, preempt, !c.view.haveLast)
	unitOf := func(key string) int {
		for i, u := range p.units {
			for _, op := range u {
				if string(op.KeyBytes()) == key {
					return i
				}
			}
		}
		t.Fatalf("no op on %s in the plan: %v", key, opKeys(p))
		return -1
	}
	for _, n := range []string{"n1", "n2"} {
		if rel, take := unitOf(k.Assignment(n, "a")), unitOf(k.Assignment(n, "b")); rel >= p.moves || take < p.takes {
			t.Errorf("node %s: a's release in unit %d, b's assignment in unit %d; the moves begin at %d, the takes at %d", n, rel, take, p.moves, p.takes)
		}
	}

	// A job moved off a node (defragmentation) leaves it before another
	// job is assigned it, and goes to its new node after every release.
	c = newPlanCoordinator(t)
	onC := api.Allocation{Job: "c", Team: "t", Flavor: "f", Size: 1, AcceleratorsPerNode: 8, Nodes: []string{"n3"}, Since: t0}
	admit.Allocations = []api.Allocation{onA, onC}
	admit.Reasons = append(admit.Reasons, policy.Reason{Job: "c", Team: "t", Kind: policy.KindAdmitted, ToSize: 1, Message: "admitted"})
	if _, err := c.commitPlan(context.Background(), &fakeCommitter{}, planNow(c, admit, !c.view.haveLast)); err != nil {
		t.Fatal(err)
	}
	moved := onA
	moved.Nodes = []string{"n2", "n4"}
	onB.Nodes, onB.Size = []string{"n1"}, 1
	move := policy.Decision{Now: t1, Allocations: []api.Allocation{moved, onB},
		Reasons: []policy.Reason{
			{Job: "a", Team: "t", Kind: policy.KindMoved, FromSize: 2, ToSize: 2, Message: "moved"},
			{Job: "b", Team: "t", Kind: policy.KindAdmitted, ToSize: 1, Message: "admitted"},
			{Job: "c", Team: "t", Kind: policy.KindPreempted, FromSize: 1, Message: "preempted for b"},
		}}
	p = planNow(c, move, !c.view.haveLast)
	if rel := unitOf(k.Assignment("n3", "c")); rel >= p.moves {
		t.Errorf("c's release in unit %d; the moves begin at %d", rel, p.moves)
	}
	if mv := unitOf(k.Assignment("n4", "a")); mv < p.moves || mv >= p.takes {
		t.Errorf("a's move in unit %d; want in the moves, [%d, %d)", mv, p.moves, p.takes)
	}
	if take := unitOf(k.Assignment("n1", "b")); take < p.takes {
		t.Errorf("b's assignment on the node a left in unit %d; the takes begin at %d", take, p.takes)
	}
}

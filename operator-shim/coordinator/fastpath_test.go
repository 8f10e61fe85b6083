package coordinator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// Jobs submitted one at a time into a settled fleet are decided on the
// engine's fast path (no full cycle, no follow-up cycle), each in the
// cycle its submit caused; the decisions written are the full cycle's: a
// coordinator that reads etcd afresh and runs a full cycle finds nothing
// to write. A submit the fast path cannot decide (its team over quota
// with a job of higher priority waiting) goes to a full cycle.
func TestSubmitsAreDecidedOnTheFastPath(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	const flavor = "trainium2"
	putNeuronNodes(t, ctx, cli, st, flavor, 6)
	for _, tm := range []policy.Team{
		{Name: "a", Cohort: "all", Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 16}}},
		{Name: "b", Cohort: "all", Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 16}}, Preemption: policy.PreemptLowerPriority},
	} {
		if err := st.PutTeam(ctx, tm); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	fast := map[string]bool{} // job -> decided by a fast cycle
	var cycles []CycleStats
	var c *Coordinator
	observe := func(s CycleStats) {
		mu.Lock()
		defer mu.Unlock()
		cycles = append(cycles, kept(s))
		for _, r := range s.Decision.Reasons {
			if r.Kind == policy.KindAdmitted || (r.Kind == policy.KindPending && r.FromSize == 0) {
				if _, seen := fast[r.Job]; !seen {
					fast[r.Job] = s.Fast
				}
			}
		}
	}
	c = New(cli, Config{Debounce: 5 * time.Millisecond, OnCycle: observe, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	defer func() { stop(); <-done }()

	submit := func(name, team string, prio, gpus, nodes int) {
		t.Helper()
		j := policy.Job{Name: name, Team: team, Priority: &prio, PerNode: policy.Resources{Accelerators: gpus}, MinNodes: nodes, MaxNodes: nodes}
		if err := st.SubmitJob(ctx, fleet.JobSpec{Job: j, Run: fleet.RunSpec{Script: "train.py"}}); err != nil {
			t.Fatal(err)
		}
		until(t, "job "+name+" decided", func() bool {
			mu.Lock()
			defer mu.Unlock()
			_, ok := fast[name]
			return ok
		})
		// The cycle settles before the next submit.
		time.Sleep(50 * time.Millisecond)
	}
	// Team b fills its quota and more, with a big job of high priority
	// waiting: b's next submit cannot take the fast path.
	submit("b-big", "b", 1, 8, 2)
	submit("b-wait", "b", 9, 8, 5)
	for i := 0; i < 6; i++ {
		submit(fmt.Sprintf("a-%d", i), "a", 1, 1+i%2, 0)
	}
	submit("b-low", "b", 0, 1, 0)
	mu.Lock()
	for i := 0; i < 6; i++ {
		if name := fmt.Sprintf("a-%d", i); !fast[name] {
			t.Errorf("job %s (within its team's quota, free nodes) was decided by a full cycle", name)
		}
	}
	if fast["b-low"] {
		t.Error("job b-low (a job of higher priority of its team waits) was decided on the fast path")
	}
	for i, s := range cycles {
		if s.Fast && i+1 < len(cycles) && len(cycles[i+1].Changed) == 0 && cycles[i+1].Ops > 0 {
			t.Errorf("a follow-up cycle after fast cycle %d wrote %d ops", i, cycles[i+1].Ops)
		}
	}
	mu.Unlock()
	stop()
	<-done
	fresh := New(cli, Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := fresh.reload(ctx); err != nil {
		t.Fatal(err)
	}
	s, _ := fresh.view.state(time.Now(), fresh.cfg.Engine)
	units, _, _, _ := fresh.writes(policy.Schedule(s))
	var keys []string
	for _, u := range units {
		for _, op := range u {
			keys = append(keys, string(op.KeyBytes()))
		}
	}
	if len(keys) > 0 {
		t.Errorf("a full cycle on what the fast path wrote would write %d records: %v", len(keys), keys)
	}
}

// A submit after a cycle that left statuses for the next cycle to compare
// in full (a follow-up leaves those naming who took a job's capacity) is
// still decided on the fast path: those statuses are the plan's business,
// not the engine's input. A job whose records were re-read, forgotten or
// expired since the last cycle is an input the fast path does not know:
// a full cycle decides.
func TestFastPathAfterStatusesLeftToCompare(t *testing.T) {
	for _, tc := range []struct {
		rule  string
		mark  func(v *view)
		fast  bool
		first string
	}{
		{"statuses a follow-up left to compare keep no submit off the fast path", func(v *view) { v.touched["a-0"] = true }, true, "x-1"},
		{"a job touched outside the write diff sends the submit to a full cycle", func(v *view) { v.touch("a-0") }, false, "x-2"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			var last CycleStats
			f := newCycleFixture(t, func(s CycleStats) { last = kept(s) })
			tc.mark(f.c.view)
			f.submitAndCycle(tc.first)
			if last.Fast != tc.fast {
				t.Fatalf("decided on the fast path: %v, want %v", last.Fast, tc.fast)
			}
			if rs, _ := last.Decision.Reason(tc.first); rs.Kind != policy.KindAdmitted {
				t.Fatalf("%s: %s %s", tc.first, rs.Kind, rs.Message)
			}
		})
	}
}

// Once a decision is written, the coordinator hands the one before it back
// to the engine, and the next submit on the fast path is rendered into its
// lists instead of two new lists of every job (15 MB a submit at 50,000
// jobs, each page of them a fault on a heap returned to the OS). The
// decision the view diffs against is left as it was.
func TestTheFastPathRendersIntoTheDecisionBeforeLast(t *testing.T) {
	var decisions []CycleStats // as the cycles handed them out, not copied
	f := newCycleFixture(t, func(s CycleStats) { decisions = append(decisions, s) })
	first := func(s CycleStats) *policy.Reason { return &s.Decision.Reasons[:1][0] }
	for i, name := range []string{"b-1", "b-2", "b-3"} {
		held := slices.Clone(f.c.view.lastReasons)
		f.submitAndCycle(name)
		n := len(decisions)
		if last := decisions[n-1]; !last.Fast {
			t.Fatalf("%s was decided by a full cycle", name)
		}
		if !reflect.DeepEqual(decisions[n-2].Decision.Reasons, held) {
			t.Fatalf("%s: deciding it changed the decision the view held", name)
		}
		if i > 0 && first(decisions[n-1]) != first(decisions[n-3]) {
			t.Errorf("%s: the fast path's decision is in new lists, not the decision before last's", name)
		}
	}
}

// cycleFixture is a coordinator on a fleet of two trainium2 nodes and team
// a (16 accelerators), run cycle by cycle: job a-0 is admitted and the
// cycles are at a fixed point.
type cycleFixture struct {
	t      *testing.T
	ctx    context.Context
	cli    *clientv3.Client
	st     *fleet.Store
	c      *Coordinator
	leader clientv3.Cmp
}

func newCycleFixture(t *testing.T, observe func(CycleStats)) *cycleFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	_, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	putNeuronNodes(t, ctx, cli, st, "trainium2", 2)
	if err := st.PutTeam(ctx, policy.Team{Name: "a", Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 16}}}); err != nil {
		t.Fatal(err)
	}
	f := &cycleFixture{t: t, ctx: ctx, cli: cli, st: st, leader: clientv3.Compare(clientv3.CreateRevision("no-such-key"), "=", 0)}
	f.submit("a-0")
	f.c = New(cli, Config{OnCycle: observe, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := f.c.reload(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ { // to a fixed point
		again, err := f.c.cycle(ctx, f.leader)
		if err != nil {
			t.Fatal(err)
		}
		if !again {
			break
		}
	}
	return f
}

// submit submits a one-accelerator job of team a.
func (f *cycleFixture) submit(name string) {
	f.t.Helper()
	p := 0
	j := policy.Job{Name: name, Team: "a", Priority: &p, PerNode: policy.Resources{Accelerators: 1}}
	if err := f.st.SubmitJob(f.ctx, fleet.JobSpec{Job: j, Run: fleet.RunSpec{Script: "train.py"}}); err != nil {
		f.t.Fatal(err)
	}
}

// submitAndCycle submits job name, hands its spec to the view as its
// watch would, and runs one cycle.
func (f *cycleFixture) submitAndCycle(name string) {
	f.t.Helper()
	f.submit(name)
	r, err := f.cli.Get(f.ctx, f.st.Keys.Spec("a", name))
	if err != nil || len(r.Kvs) != 1 {
		f.t.Fatalf("read the spec: %v", err)
	}
	f.c.view.apply([]*clientv3.Event{{Type: clientv3.EventTypePut, Kv: r.Kvs[0]}}, time.Now())
	if _, err := f.c.cycle(f.ctx, f.leader); err != nil {
		f.t.Fatal(err)
	}
}

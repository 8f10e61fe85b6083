package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/telemetry"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// runCoordinator runs a coordinator until the test ends.
func runCoordinator(t *testing.T, ctx context.Context, c *Coordinator) {
	t.Helper()
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// etcdCounter reads one of the embedded etcd's own counters (it registers
// them in the default registry): mvcc's puts, deletes and ranges.
func etcdCounter(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			sum := 0.0
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	t.Fatalf("etcd exports no %s", name)
	return 0
}

// until waits for cond with a generous deadline.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, what, testutil.True(cond))
}

// kept is s with its decision's lists copied, for an observer that keeps
// it: a later cycle overwrites the coordinator's (Config.OnCycle).
func kept(s CycleStats) CycleStats {
	s.Decision.Reasons = slices.Clone(s.Decision.Reasons)
	s.Decision.Allocations = slices.Clone(s.Decision.Allocations)
	return s
}

// cycleCounter counts a coordinator's cycles and remembers the last one's
// write count.
type cycleCounter struct {
	mu     sync.Mutex
	n      int
	lastOp int
	quiet  int // cycles in a row that wrote nothing
	calm   int // cycles in a row that changed no allocation
	jobs   map[string]bool
}

func (cc *cycleCounter) observe(s CycleStats) {
	cc.mu.Lock()
	cc.n++
	cc.lastOp = s.Ops
	if s.Ops == 0 {
		cc.quiet++
	} else {
		cc.quiet = 0
	}
	if len(s.Changed) == 0 {
		cc.calm++
	} else {
		cc.calm = 0
	}
	cc.jobs = map[string]bool{}
	for _, r := range s.Decision.Reasons {
		cc.jobs[r.Job] = true
	}
	cc.mu.Unlock()
}

// settled reports whether the last cycle decided job and the last n
// cycles wrote nothing.
func (cc *cycleCounter) settled(job string, n int) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.jobs[job] && cc.quiet >= n
}

// calmed reports whether the last cycle changed no allocation (no
// follow-up cycle is due).
func (cc *cycleCounter) calmed() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.n > 0 && cc.calm > 0
}

func (cc *cycleCounter) get() (int, int) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.n, cc.lastOp
}

// A steady fleet costs etcd nothing: once every job is decided, ten full
// scheduling cycles (forced by a short resync) write nothing at all, no
// put and no delete, counted both by a watch on the whole prefix and by
// etcd's own counters. And a coordinator whose inputs do not change runs
// no cycle and reads nothing.
func TestSteadyFleetWritesNothing(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	st.PutTeam(ctx, policy.Team{Name: "b", Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 0, BorrowingLimit: ptr(48)}}, Cohort: "all"})
	st.PutTeam(ctx, policy.Team{Name: "a", Cohort: "all", Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 32}}})
	for i := range 5 {
		team := "a"
		if i%2 == 1 {
			team = "b"
		}
		st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: fmt.Sprintf("j%d", i), Team: team, PerNode: policy.Resources{Accelerators: 16},
			MinNodes: 1, MaxNodes: 2, Elastic: true}})
	}
	var cc cycleCounter
	c := New(cli, Config{Resync: 50 * time.Millisecond, Debounce: 10 * time.Millisecond, Engine: policy.Config{MinStablePeriod: -1},
		OnCycle: cc.observe})
	runCoordinator(t, ctx, c)
	// Steady: every job has a status, and two cycles in a row wrote
	// nothing (a follow-up cycle leaves running jobs' statuses to the next
	// one: the second is not a follow-up).
	until(t, "every job decided and two cycles that wrote nothing", func() bool {
		s, _, err := st.Statuses(ctx)
		return err == nil && len(s) == 5 && cc.settled("j0", 2)
	})
	r, err := cli.Get(ctx, st.Keys.Root(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var writes atomic.Int64
	var seen sync.Map
	wch := cli.Watch(wctx, st.Keys.Root(), clientv3.WithPrefix(), clientv3.WithRev(r.Header.Revision+1))
	go func() {
		for w := range wch {
			for _, e := range w.Events {
				writes.Add(1)
				seen.Store(string(e.Kv.Key), e.Type.String())
			}
		}
	}()
	puts, dels := etcdCounter(t, "etcd_mvcc_put_total"), etcdCounter(t, "etcd_mvcc_delete_total")
	n0, _ := cc.get()
	until(t, "ten more cycles", func() bool { n, _ := cc.get(); return n >= n0+10 })
	// A write, if any, would reach the watch within the cycle it was made
	// in; the next write of the test itself is the marker that the watch
	// has caught up.
	if _, err := cli.Put(ctx, st.Keys.Prefix()+"-marker", "x"); err != nil {
		t.Fatal(err)
	}
	if w := writes.Load(); w != 0 {
		var keys []string
		seen.Range(func(k, v any) bool { keys = append(keys, fmt.Sprintf("%v %v", v, k)); return true })
		t.Errorf("a steady fleet wrote %d times over 10 cycles: %s", w, strings.Join(keys, ", "))
	}
	if p, d := etcdCounter(t, "etcd_mvcc_put_total")-puts, etcdCounter(t, "etcd_mvcc_delete_total")-dels; p != 1 || d != 0 {
		t.Errorf("etcd counted %v puts (want only the test's marker) and %v deletes over 10 steady cycles", p, d)
	}
}

// A coordinator with nothing to do reads nothing: no cycle runs, and
// housekeeping finds nothing due, so etcd serves it no range at all.
func TestIdleCoordinatorReadsNothing(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 3, Elastic: true}})
	var cc cycleCounter
	var rounds atomic.Int64
	clk := clocktesting.NewFakeClock(time.Now())
	c := New(cli, Config{Resync: time.Hour, PruneInterval: 20 * time.Millisecond, CompactRetention: -1,
		Engine: policy.Config{MinStablePeriod: -1}, OnCycle: cc.observe, Clock: clk, afterHousekeeping: func() { rounds.Add(1) }})
	runCoordinator(t, ctx, c)
	waitTarget(t, ctx, cli, "j", "3")
	// The cycle that admitted it is followed by one that changes no
	// allocation, and then none.
	until(t, "a cycle that changed no allocation", cc.calmed)
	n0, _ := cc.get()
	ranges := etcdCounter(t, "etcd_mvcc_range_total")
	// An idle second: 50 housekeeping rounds, each stepped on the fake
	// clock and waited for.
	for range 50 {
		r0 := rounds.Load()
		clk.Step(20 * time.Millisecond)
		until(t, "a housekeeping round", func() bool { return rounds.Load() > r0 })
	}
	if n, _ := cc.get(); n != n0 {
		t.Errorf("%d cycles ran without a change", n-n0)
	}
	if d := etcdCounter(t, "etcd_mvcc_range_total") - ranges; d != 0 {
		t.Errorf("an idle coordinator made etcd serve %v ranges in a second", d)
	}
	// A change is seen through the watch and decided at once.
	st.UpdateJob(ctx, "j", func(j *fleet.JobSpec) error { j.MaxNodes = 2; return nil })
	waitTarget(t, ctx, cli, "j", "2")
}

// A job's placement reaches each node as its own key, written in the
// transaction of the desired record: a node's agent watching only its own
// assignments sees the jobs placed on it and nothing else; a node the job
// leaves loses its key, and a stopped job has none left.
func TestAssignmentsFanOutPerNode(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	c := New(cli, Config{Debounce: 10 * time.Millisecond, Engine: policy.Config{MinStablePeriod: -1}})
	runCoordinator(t, ctx, c)
	assigned := func(node string) []string {
		as, bad, _, err := st.Assignments(ctx, node)
		if err != nil || len(bad) > 0 {
			t.Fatalf("assignments of %s: %v %v", node, err, bad)
		}
		var jobs []string
		for _, a := range as {
			jobs = append(jobs, fmt.Sprintf("%s@%d", a.Job, a.Generation))
		}
		return jobs
	}
	// n2's agent watches its own assignments only.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var n2Events atomic.Int64
	wch := cli.Watch(wctx, st.Keys.NodeAssignments("n2"), clientv3.WithPrefix())
	go func() {
		for w := range wch {
			n2Events.Add(int64(len(w.Events)))
		}
	}()
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "two", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 2, MaxNodes: 2}})
	waitTarget(t, ctx, cli, "two", "2")
	d, _ := st.Desired(ctx, "two")
	for _, n := range []string{"n0", "n1", "n2"} {
		got := assigned(n)
		if slicesContains(d.Nodes, n) != (len(got) == 1) {
			t.Errorf("node %s has assignments %v; the job is placed on %v", n, got, d.Nodes)
		}
	}
	free := ""
	for _, n := range []string{"n0", "n1", "n2"} {
		if !slicesContains(d.Nodes, n) {
			free = n
		}
	}
	before := n2Events.Load()
	// Another one-node job lands on the free node only.
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "one", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	waitTarget(t, ctx, cli, "one", "1")
	until(t, "the free node's assignment", func() bool { return len(assigned(free)) == 1 })
	if free != "n2" && n2Events.Load() != before {
		t.Errorf("n2 saw %d watch events for a job placed on %s", n2Events.Load()-before, free)
	}
	// Suspended: every assignment of the job goes with its nodes.
	st.UpdateJob(ctx, "two", func(j *fleet.JobSpec) error { j.Suspended = true; return nil })
	until(t, "the suspended job's assignments gone", func() bool {
		for _, n := range d.Nodes {
			for _, a := range assigned(n) {
				if strings.HasPrefix(a, "two@") {
					return false
				}
			}
		}
		return true
	})
	if got := assigned(free); len(got) != 1 || !strings.HasPrefix(got[0], "one@") {
		t.Errorf("the other job's assignment changed: %v", got)
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func ptr(n int) *int { return &n }

// A job's status is rewritten only when its decision changes, not when
// the usage figures in its message do (they go to the usage record, which
// is rewritten only when it changes); the same decision again is one event
// counted twice, the way Kubernetes Events are.
func TestStatusOnlyOnRealChangeAndEventsDeduplicated(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	c := New(cli, Config{Debounce: 10 * time.Millisecond, Engine: policy.Config{MinStablePeriod: -1}})
	runCoordinator(t, ctx, c)
	// a1 is elastic at its max: it keeps a status record (Running,
	// AtMax), which a job running as admitted does not have.
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "a1", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1, Elastic: true}})
	waitTarget(t, ctx, cli, "a1", "1")
	// 0: no status record.
	statusRev := func(job string) int64 {
		r, err := cli.Get(ctx, st.Keys.Status(job))
		if err != nil {
			t.Fatalf("status of %s: %v", job, err)
		}
		if len(r.Kvs) == 0 {
			return 0
		}
		return r.Kvs[0].ModRevision
	}
	usage := func() []api.TeamUsage { u, _ := st.Usage(ctx); return u }
	// a2's cycle settles a1 (Admitted, then Running: a change of kind).
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "a2", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	waitTarget(t, ctx, cli, "a2", "1")
	until(t, "a1 running at its max", func() bool {
		s, err := st.Status(ctx, "a1")
		return err == nil && s.Kind == policy.KindRunning && s.Code == policy.CodeAtMax
	})
	rev := statusRev("a1")
	if rev == 0 {
		t.Fatal("a1 has no status record: the test needs one")
	}
	// a3 joins the team: a1's message would now say the team uses 48.
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "a3", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	waitTarget(t, ctx, cli, "a3", "1")
	until(t, "the usage record says 48", func() bool { u := usage(); return len(u) == 1 && u[0].Used == 48 })
	if r := statusRev("a1"); r != rev {
		t.Errorf("a1's status was rewritten (revision %d -> %d) although only the team's usage changed", rev, r)
	}
	// The same decision twice: one event, counted.
	x := &eventIndex{keys: st.Keys, byJob: map[string][]evRec{}}
	t0 := time.Unix(1000, 0)
	r := policy.Reason{Job: "p", Kind: policy.KindPending, Code: policy.CodeNoCapacity, Message: "uses 1"}
	k1, e1 := x.record(r, t0, time.Hour)
	r.Message = "uses 2"
	k2, e2 := x.record(r, t0.Add(time.Minute), time.Hour)
	if k1 != k2 || e2.Count != 2 || !e2.FirstSeen.Equal(t0) || !e2.LastSeen.Equal(t0.Add(time.Minute)) || e2.Message != "uses 2" || e1.Count != 1 {
		t.Errorf("the same decision again: %s %+v then %s %+v, want one key counted twice", k1, e1, k2, e2)
	}
	r.Code = policy.CodeCohortExhausted
	if k3, e3 := x.record(r, t0.Add(2*time.Minute), time.Hour); k3 == k1 || e3.Count != 1 {
		t.Errorf("another decision reused the event %s (%+v)", k3, e3)
	}
	r.Code = policy.CodeNoCapacity
	if k4, _ := x.record(r, t0.Add(3*time.Hour), time.Hour); k4 == k1 {
		t.Error("an event outside the window was updated, not added")
	}
	// Bounded per job and in all.
	for i := range 10 {
		x.record(policy.Reason{Job: "q", Kind: policy.KindShrunk, FromSize: i + 2, ToSize: i + 1}, t0.Add(time.Duration(i)*time.Second), time.Hour)
	}
	del := x.prune(4, 6)
	if x.total != 6 || len(x.byJob["q"]) > 4 || len(del) != 13-6 {
		t.Errorf("pruned %d of 13 events to %d (q keeps %d), want 6 left and q at most 4", len(del), x.total, len(x.byJob["q"]))
	}
}

// A finished job's records are removed after the retention period; the
// coordinator's watch survives it, and it compacts etcd's history to its
// retention.
func TestFinishedRetentionAndCompaction(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	c := New(cli, Config{Debounce: 10 * time.Millisecond, PruneInterval: 50 * time.Millisecond, FinishedRetention: 500 * time.Millisecond,
		CompactRetention: 300 * time.Millisecond, Engine: policy.Config{MinStablePeriod: -1}})
	runCoordinator(t, ctx, c)
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "done", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	waitTarget(t, ctx, cli, "done", "1")
	r0, err := cli.Get(ctx, st.Keys.Root(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	st.MarkFinished(ctx, "done", fleet.Finish{Outcome: fleet.Succeeded, Node: "n0", Time: time.Now()})
	until(t, "the finished job's records gone", func() bool {
		for _, p := range []string{st.Keys.SpecsPrefix(), st.Keys.FinishedPrefix(), st.Keys.DesiredPrefix(), st.Keys.StatusPrefix(), st.Keys.AssignPrefix(), st.Keys.EventsPrefix()} {
			r, err := cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil || r.Count != 0 {
				return false
			}
		}
		return true
	})
	until(t, "the history before the finish compacted", func() bool {
		_, err := cli.Get(ctx, st.Keys.Root(), clientv3.WithPrefix(), clientv3.WithRev(r0.Header.Revision))
		return errors.Is(err, rpctypes.ErrCompacted)
	})
	// Still scheduling after its own compactions.
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "next", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	waitTarget(t, ctx, cli, "next", "1")
}

// The decision that changes a job's size is the root span of that scale
// event's trace, and its traceparent travels in the desired record for the
// agents to parent their spans on.
func TestDecisionIsTheRootSpanOfTheScaleTrace(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	c := New(cli, Config{Debounce: 10 * time.Millisecond, Engine: policy.Config{MinStablePeriod: -1}, Tracer: tp})
	runCoordinator(t, ctx, c)
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "traced", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 2, Elastic: true}})
	waitTarget(t, ctx, cli, "traced", "2")
	d, err := st.Desired(ctx, "traced")
	if err != nil {
		t.Fatal(err)
	}
	parent, ok := telemetry.FromTraceParent(d.TraceParent)
	if !ok {
		t.Fatalf("desired record %+v carries no valid traceparent", d)
	}
	want := trace.SpanContextFromContext(parent)
	var found bool
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID() == want.TraceID() && s.SpanContext().SpanID() == want.SpanID() {
			found = true
			if s.Name() != "coordinator.decision" || s.Parent().IsValid() {
				t.Errorf("span %q (parent %v), want the root span coordinator.decision", s.Name(), s.Parent())
			}
			attrs := map[string]string{}
			for _, a := range s.Attributes() {
				attrs[string(a.Key)] = a.Value.String()
			}
			if attrs["job"] != "traced" || attrs["to_size"] != "2" || attrs["kind"] != string(policy.KindAdmitted) {
				t.Errorf("decision span attributes %v", attrs)
			}
		}
	}
	if !found {
		t.Errorf("no recorded span matches the desired record's traceparent %s", d.TraceParent)
	}
}

// A watch that fell behind a compaction ends the watch loop with a
// re-read of the whole view (as after any broken watch), and the
// coordinator then decides what it missed.
func TestWatchBehindACompactionReadsTheFleetAgain(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	c := New(cli, Config{Debounce: 10 * time.Millisecond, Engine: policy.Config{MinStablePeriod: -1}, CompactRetention: -1})
	if err := c.reload(ctx); err != nil {
		t.Fatal(err)
	}
	// A job arrives after the view was read, and etcd compacts past it.
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "missed", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	r, err := cli.Put(ctx, st.Keys.Prefix()+"-marker", "x") // the spec's revision is history now
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, r.Header.Revision); err != nil {
		t.Fatal(err)
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, st.Keys.Leader())
	if err := el.Campaign(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := c.watchLoop(lctx, sess, clientv3.Compare(clientv3.CreateRevision(el.Key()), "=", el.Rev())); !errors.Is(err, errRelist) {
		t.Fatalf("watch loop behind a compaction returned %v, want errRelist", err)
	}
	el.Resign(ctx)
	runCoordinator(t, ctx, c)
	waitTarget(t, ctx, cli, "missed", "1")
}

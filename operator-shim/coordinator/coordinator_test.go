package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

func setup(t *testing.T) (*clientv3.Client, context.Context) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	_, cli := etcdtest.Start(t)
	for i := 0; i < 3; i++ {
		inv := devices.Inventory{Node: fmt.Sprintf("n%d", i), Flavor: "trainium2"}
		for d := 0; d < 16; d++ {
			inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNeuron, Index: d, Flavor: "trainium2", Healthy: true})
		}
		etcdtest.RegisterNode(t, cli, inv)
	}
	st := fleet.New(cli, "")
	st.PutTeam(ctx, policy.Team{Name: "a", Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 48}}})
	return cli, ctx
}

func waitTarget(t *testing.T, ctx context.Context, cli *clientv3.Client, job, want string) {
	t.Helper()
	testutil.Eventually(t, 15*time.Second, "the target of "+job+" to become "+want, func() (bool, string) {
		d, err := fleet.New(cli, "").Desired(ctx, job)
		if err != nil {
			return false, err.Error()
		}
		return strconv.Itoa(d.Target()) == want, "target " + strconv.Itoa(d.Target())
	})
}

func TestWritesAllocationTargetPlacementAndFailsOver(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	start := func(id string) (context.CancelFunc, chan struct{}) {
		c := New(cli, Config{Identity: id, Resync: 100 * time.Millisecond, SessionTTL: 2, Engine: policy.Config{MinStablePeriod: -1}})
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { c.Run(cctx); close(done) }()
		return cancel, done
	}
	stops := map[string]func(){}
	for _, id := range []string{"one", "two"} {
		stop, done := start(id)
		stops[id] = func() { stop(); <-done }
	}
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 3, Elastic: true}})
	waitTarget(t, ctx, cli, "j", "3")
	a, err := st.Allocation(ctx, "j")
	if err != nil || len(a.Nodes) != 3 {
		t.Fatalf("allocation %+v %v", a, err)
	}
	d, err := st.Desired(ctx, "j")
	if err != nil || len(d.Nodes) != 3 || d.Size != 3 || d.Generation < 1 || d.Stop != nil {
		t.Fatalf("desired record %+v %v, want 3 placed nodes", d, err)
	}
	// The leader goes away; the other coordinator takes over and keeps scheduling.
	first := leaderIdentity(t, ctx, cli)
	if stops[first] == nil {
		t.Fatalf("leader %q is neither coordinator", first)
	}
	stops[first]()
	delete(stops, first)
	deadline := time.Now().Add(15 * time.Second)
	for id := leaderIdentity(t, ctx, cli); id == first || id == ""; id = leaderIdentity(t, ctx, cli) {
		if time.Now().After(deadline) {
			t.Fatalf("no coordinator took over from %s", first)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st.UpdateJob(ctx, "j", func(j *fleet.JobSpec) error { j.MaxNodes = 2; return nil })
	waitTarget(t, ctx, cli, "j", "2")
	// The shrink is in the job's history (its status says Shrunk until
	// the follow-up cycle finds it running at its new size).
	evs, _, err := st.Events(ctx, "j")
	shrunk := false
	for _, e := range evs {
		shrunk = shrunk || (e.Kind == policy.KindShrunk && e.FromSize == 3 && e.ToSize == 2)
	}
	if err != nil || !shrunk {
		t.Errorf("no Shrunk 3 -> 2 event in the history %+v %v", evs, err)
	}
	if s, err := st.Status(ctx, "j"); err != nil || (s.Kind != policy.KindShrunk && s.Kind != policy.KindRunning) || s.ToSize != 2 {
		t.Errorf("status %+v %v, want Shrunk or Running at 2", s, err)
	}
	// A finished job releases its capacity.
	st.MarkFinished(ctx, "j", fleet.Finish{Outcome: fleet.Succeeded, Node: "n0"})
	waitTarget(t, ctx, cli, "j", "0")
	if _, err := st.Allocation(ctx, "j"); err == nil {
		t.Error("finished job still allocated")
	}
	// Deleted and submitted again under the same name, it runs again.
	if err := st.DeleteJob(ctx, "j"); err != nil {
		t.Fatal(err)
	}
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 3, Elastic: true}})
	waitTarget(t, ctx, cli, "j", "3")
}

func TestMalformedInputsAreIgnoredNotFatal(t *testing.T) {
	cli, ctx := setup(t)
	cli.Put(ctx, "/hyperpodrun/nodes/bad", "{not json")
	cli.Put(ctx, "/hyperpodrun/specs/bad", "[]")
	st := fleet.New(cli, "")
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "ok", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	c := New(cli, Config{Resync: 100 * time.Millisecond})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitTarget(t, ctx, cli, "ok", "1")
}

// A spec whose name is huge (600 KB, written by a team user straight to
// etcd) is not read: its status and event, keyed by its name, made a
// transaction etcd refused, and every job whose decision shared it, such
// as a valid job submitted after, was never admitted.
func TestAHugeSpecNameHoldsUpNoOtherJob(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	huge := strings.Repeat("x", 600<<10)
	rec, err := json.Marshal(fleet.JobSpec{Job: policy.Job{Name: huge, Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, st.Keys.Spec("a", huge), string(rec)); err != nil {
		t.Fatal(err)
	}
	c := New(cli, Config{Resync: 100 * time.Millisecond})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	defer func() { cancel(); <-done }()
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "ok", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	waitTarget(t, ctx, cli, "ok", "1")
}

// stopRecord reads why the job's desired record stopped it (nil when it
// did not).
func stopRecord(t *testing.T, ctx context.Context, cli *clientv3.Client, job string) *fleet.Stop {
	t.Helper()
	d, err := fleet.New(cli, "").Desired(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if d == nil {
		return nil
	}
	return d.Stop
}

// A job that loses its whole allocation has it taken away by the same
// desired record that says why (preemption or shutdown), so the node
// agents' drain reaches the workers as the right event kind; the stop is
// gone when the job is admitted again.
func TestStopRecordSaysPreemptionOrShutdown(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	st.PutTeam(ctx, policy.Team{Name: "a", Preemption: policy.PreemptLowerPriority,
		Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 48}}})
	// Every write of the desired record is checked: the one that takes the
	// nodes away is the one that says why, and generations only grow.
	wctx, wcancel := context.WithCancel(ctx)
	deletes := make(chan *fleet.Stop, 10)
	wch := cli.Watch(wctx, st.Keys.Desired("low"))
	watched := make(chan struct{})
	defer func() { wcancel(); <-watched }()
	go func() {
		defer close(watched)
		gen := int64(0)
		for w := range wch {
			for _, ev := range w.Events {
				d, err := fleet.DecodeDesired(string(ev.Kv.Key), ev.Kv.Value)
				if err != nil || d.Generation <= gen {
					t.Errorf("desired record %s: %+v %v, want a generation above %d", ev.Kv.Value, d, err, gen)
					continue
				}
				gen = d.Generation
				if d.Running() {
					continue
				}
				select {
				case deletes <- d.Stop:
				case <-wctx.Done():
					return
				}
			}
		}
	}()
	// high's stop record is read as it is written: once high's nodes have
	// left (at once here: no agents), the coordinator forgets it.
	highStop := make(chan *fleet.Stop, 1)
	go func() {
		for w := range cli.Watch(wctx, st.Keys.Desired("high")) {
			for _, ev := range w.Events {
				if d, err := fleet.DecodeDesired(string(ev.Kv.Key), ev.Kv.Value); err == nil && d.Stop != nil {
					select {
					case highStop <- d.Stop:
					default:
					}
				}
			}
		}
	}()
	c := New(cli, Config{Resync: 100 * time.Millisecond, Engine: policy.Config{MinStablePeriod: -1}})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	defer func() { cancel(); <-done }()

	low, high := 10, 90
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "low", Team: "a", Priority: &low, PerNode: policy.Resources{Accelerators: 16}, MinNodes: 3, MaxNodes: 3}})
	waitTarget(t, ctx, cli, "low", "3")
	if s := stopRecord(t, ctx, cli, "low"); s != nil {
		t.Fatalf("running job has a stop record %+v", s)
	}
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "high", Team: "a", Priority: &high, PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	waitTarget(t, ctx, cli, "high", "1")
	select {
	case s := <-deletes:
		if s == nil || s.Kind != fleet.StopPreemption || !strings.Contains(s.Reason, "high") {
			t.Errorf("when low's allocation was deleted its stop record was %+v, want kind preemption naming job high", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("low was not preempted")
	}
	// high goes away: low is admitted again and its stale record removed.
	st.DeleteJob(ctx, "high")
	waitTarget(t, ctx, cli, "low", "3")
	if s := stopRecord(t, ctx, cli, "low"); s != nil {
		t.Errorf("re-admitted job still has the stop record %+v", s)
	}
	select {
	case s := <-highStop:
		if s.Kind != fleet.StopShutdown {
			t.Errorf("deleted job's stop record %+v, want kind shutdown", s)
		}
	case <-time.After(10 * time.Second):
		t.Error("the deleted job got no stop record")
	}
	// Suspending is a shutdown, with the coordinator's reason.
	st.UpdateJob(ctx, "low", func(j *fleet.JobSpec) error { j.Suspended = true; return nil })
	select {
	case s := <-deletes:
		if s == nil || s.Kind != fleet.StopShutdown || !strings.Contains(strings.ToLower(s.Reason), "suspend") {
			t.Errorf("suspended job's stop record %+v, want kind shutdown saying suspended", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("suspended job kept its allocation")
	}
}

// leaderIdentity is the identity of the elected coordinator ("" if none).
func leaderIdentity(t *testing.T, ctx context.Context, cli *clientv3.Client) string {
	t.Helper()
	r, err := cli.Get(ctx, fleet.New(cli, "").Keys.Leader()+"/", append(clientv3.WithFirstCreate(), clientv3.WithPrefix())...)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return ""
	}
	return string(r.Kvs[0].Value)
}

// A coordinator that lost its leadership cannot write a decision: every
// write is guarded by its election key, so a deposed leader that has not
// noticed yet changes nothing.
func TestDeposedLeaderCannotWrite(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	el := concurrency.NewElection(sess, st.Keys.Leader())
	if err := el.Campaign(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	guard := clientv3.Compare(clientv3.CreateRevision(el.Key()), "=", el.Rev())
	c := New(cli, Config{Identity: "old", Engine: policy.Config{MinStablePeriod: -1}})
	// Deposed: its session ends (as when it was partitioned past the TTL).
	sess.Close()
	if err := c.Cycle(ctx, guard); !errors.Is(err, errNotLeader) {
		t.Fatalf("cycle of a deposed leader: %v, want errNotLeader", err)
	}
	if _, err := st.Allocation(ctx, "j"); err == nil {
		t.Error("a deposed leader wrote an allocation")
	}
	// The same coordinator, elected again, writes.
	sess2, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer sess2.Close()
	el2 := concurrency.NewElection(sess2, st.Keys.Leader())
	if err := el2.Campaign(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	if err := c.Cycle(ctx, clientv3.Compare(clientv3.CreateRevision(el2.Key()), "=", el2.Rev())); err != nil {
		t.Fatalf("cycle of the leader: %v", err)
	}
	if a, err := st.Allocation(ctx, "j"); err != nil || a.Size != 1 {
		t.Errorf("leader's allocation %+v %v", a, err)
	}
}

// A finish record is acted on at once, not at the next resync: the
// coordinator watches finish records like specs, so the capacity goes back
// to the fleet as soon as a node agent records the end of training.
func TestFinishedJobReleasedWithoutWaitingForResync(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	c := New(cli, Config{Resync: time.Hour, Engine: policy.Config{MinStablePeriod: -1}})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	defer func() { cancel(); <-done }()
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "done-soon", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	waitTarget(t, ctx, cli, "done-soon", "1")
	st.MarkFinished(ctx, "done-soon", fleet.Finish{Outcome: fleet.Succeeded, Node: "n0"})
	waitTarget(t, ctx, cli, "done-soon", "0")
}

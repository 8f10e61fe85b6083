package coordinator

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// A burst of inputs written in several transactions, each within the
// debounce window of the one before (a batch: finishes, then submits), is
// decided by one cycle. Before, the cycle started one window after the
// burst's first change: it saw the finish, started the waiting low-priority
// job on the capacity freed, and the next cycle, seeing the high-priority
// submit, preempted it again (issue 27's churn rounds: 50-70 jobs a round
// admitted and preempted within it, 8 writes each).
func TestABurstOfInputsIsDecidedByOneCycle(t *testing.T) {
	const window = time.Second
	checkLowLeftWaiting(t, window, func(ctx context.Context, st *fleet.Store) {
		// The burst: big finishes; an unrelated submit; high (all three
		// nodes) is submitted. Each comes 5/8 of a window after the one
		// before: the burst spans more than a window.
		if err := st.MarkFinished(ctx, "big", fleet.Finish{Outcome: fleet.Succeeded, Node: "n0"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(window * 5 / 8)
		if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "other", Team: "no-quota", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(window * 5 / 8)
		if err := st.SubmitJob(ctx, burstJob("high", 90, 3)); err != nil {
			t.Fatal(err)
		}
	})
}

// A batch writer's transactions (bulkEvents changes or more each) can come
// more than a window apart on a loaded etcd: issue 27's churn rounds, 10
// transactions of 100 finishes or submits, were decided by two cycles at
// load 2, and 40-70 jobs a round were started and preempted within it.
// After a bulk transaction the burst waits bulkGapWindows windows for the
// next change: here the batch's first transaction (bulkEvents submits of
// another team, by SubmitJobs) and big's finish come 3 windows before its
// last (high), and one cycle decides them.
func TestABatchsTransactionsMoreThanAWindowApartAreDecidedByOneCycle(t *testing.T) {
	const window = 100 * time.Millisecond
	checkLowLeftWaiting(t, window, func(ctx context.Context, st *fleet.Store) {
		var jobs []fleet.JobSpec
		for i := range bulkEvents {
			jobs = append(jobs, fleet.JobSpec{Job: policy.Job{Name: fmt.Sprintf("other-%d", i), Team: "no-quota", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1}})
		}
		if err := st.SubmitJobs(ctx, jobs); err != nil {
			t.Fatal(err)
		}
		// A finish report is no batch input: it waits with the batch.
		if err := st.MarkFinished(ctx, "big", fleet.Finish{Outcome: fleet.Succeeded, Node: "n0"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * window)
		if err := st.SubmitJob(ctx, burstJob("high", 90, 3)); err != nil {
			t.Fatal(err)
		}
	})
}

// burstJob is a job of team a on nodes whole nodes of 16 accelerators.
func burstJob(name string, prio, nodes int) fleet.JobSpec {
	return fleet.JobSpec{Job: policy.Job{Name: name, Team: "a", Priority: &prio, PerNode: policy.Resources{Accelerators: 16}, MinNodes: nodes, MaxNodes: nodes}}
}

// checkLowLeftWaiting runs a coordinator with debounce window on 3 nodes
// where big (priority 50) runs on all three and low (priority 10) waits,
// then the burst, which finishes big and submits high (priority 90, all
// three nodes). One cycle for the burst places high and leaves low
// waiting; a cycle that saw big's finish without high's submit would start
// low, and the next would preempt it.
func checkLowLeftWaiting(t *testing.T, window time.Duration, burst func(ctx context.Context, st *fleet.Store)) {
	t.Helper()
	cli, ctx := setup(t) // 3 nodes of 16; team a, nominal 48
	st := fleet.New(cli, "")
	st.PutTeam(ctx, policy.Team{Name: "a", Preemption: policy.PreemptLowerPriority,
		Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 48}}})
	// Every placement of low is seen.
	wctx, wcancel := context.WithCancel(ctx)
	var mu sync.Mutex
	lowPlaced := 0
	wch := cli.Watch(wctx, st.Keys.Desired("low"))
	watched := make(chan struct{})
	defer func() { wcancel(); <-watched }()
	go func() {
		defer close(watched)
		for w := range wch {
			for _, ev := range w.Events {
				if d, err := fleet.DecodeDesired(string(ev.Kv.Key), ev.Kv.Value); err == nil && d.Running() {
					mu.Lock()
					lowPlaced++
					mu.Unlock()
				}
			}
		}
	}()
	runCoordinator(t, ctx, New(cli, Config{Debounce: window, Engine: policy.Config{MinStablePeriod: -1}}))
	if err := st.SubmitJob(ctx, burstJob("big", 50, 3)); err != nil {
		t.Fatal(err)
	}
	waitTarget(t, ctx, cli, "big", "3")
	if err := st.SubmitJob(ctx, burstJob("low", 10, 1)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, "low waits", func() (bool, string) {
		s, err := st.Status(ctx, "low")
		return err == nil && s.Kind == policy.KindPending, "low's status"
	})
	burst(ctx, st)
	waitTarget(t, ctx, cli, "high", "3")
	testutil.Eventually(t, 15*time.Second, "low placed nowhere", func() (bool, string) {
		d, err := st.Desired(ctx, "low")
		return err != nil || !d.Running(), "low's desired record"
	})
	mu.Lock()
	defer mu.Unlock()
	s, err := st.Status(ctx, "low")
	if lowPlaced != 0 || err != nil || s.Kind != policy.KindPending {
		t.Errorf("low was started %d times during the burst (status %+v %v); want it left waiting (one cycle for the burst)", lowPlaced, s, err)
	}
}

func TestBurstHold(t *testing.T) {
	const w = 10 * time.Millisecond
	for _, tc := range []struct {
		rule     string
		window   time.Duration // w when 0
		held     time.Duration
		bulk     bool
		wantWait time.Duration
		wantHold bool
	}{
		{rule: "a change waits one window for the next", held: 0, wantWait: w, wantHold: true},
		{rule: "a burst of small changes holds its cycle at most burstWindows", held: burstWindows*w - 1, wantWait: w, wantHold: true},
		{rule: "a burst of small changes held burstWindows holds no longer", held: burstWindows * w, wantWait: w, wantHold: false},
		{rule: "after a batch's transaction the burst waits bulkGapWindows", held: burstWindows * w, bulk: true, wantWait: bulkGapWindows * w, wantHold: true},
		{rule: "a batch holds its cycle at most bulkBurstWindows", held: bulkBurstWindows * w, bulk: true, wantWait: bulkGapWindows * w, wantHold: false},
		{rule: "a batch's wait for its next change is at most maxBulkGap", window: 500 * time.Millisecond, held: 0, bulk: true, wantWait: maxBulkGap, wantHold: true},
		{rule: "a batch holds its cycle at most maxBulkHold", window: time.Second, held: maxBulkHold, bulk: true, wantWait: maxBulkGap, wantHold: false},
		{rule: "a batch holds its cycle no less than a small burst", window: 2 * time.Second, held: maxBulkHold, bulk: true, wantWait: 2 * time.Second, wantHold: true},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			window := w
			if tc.window > 0 {
				window = tc.window
			}
			wait, hold := burstHold(window, tc.held, tc.bulk)
			if wait != tc.wantWait || hold != tc.wantHold {
				t.Errorf("burstHold(%s, %s, bulk %v) = %s, %v; want %s, %v", window, tc.held, tc.bulk, wait, hold, tc.wantWait, tc.wantHold)
			}
		})
	}
}

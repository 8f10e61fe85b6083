package coordinator

import (
	"context"
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
	const window = time.Second
	runCoordinator(t, ctx, New(cli, Config{Debounce: window, Engine: policy.Config{MinStablePeriod: -1}}))
	job := func(name string, prio, nodes int) fleet.JobSpec {
		return fleet.JobSpec{Job: policy.Job{Name: name, Team: "a", Priority: &prio, PerNode: policy.Resources{Accelerators: 16}, MinNodes: nodes, MaxNodes: nodes}}
	}
	if err := st.SubmitJob(ctx, job("big", 50, 3)); err != nil {
		t.Fatal(err)
	}
	waitTarget(t, ctx, cli, "big", "3")
	if err := st.SubmitJob(ctx, job("low", 10, 1)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 15*time.Second, "low waits", func() (bool, string) {
		s, err := st.Status(ctx, "low")
		return err == nil && s.Kind == policy.KindPending, "low's status"
	})
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
	if err := st.SubmitJob(ctx, job("high", 90, 3)); err != nil {
		t.Fatal(err)
	}
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

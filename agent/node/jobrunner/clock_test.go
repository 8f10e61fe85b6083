package jobrunner

import (
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// stepping returns cond, first stepping clk by d whenever a timer is armed
// on it: each restart's backoff passes as soon as it is armed.
func stepping(clk *clocktesting.FakeClock, d time.Duration, cond func() bool) func() bool {
	return func() bool {
		if clk.HasWaiters() {
			clk.Step(d)
		}
		return cond()
	}
}

// reconciledNow returns once the runner's Run loop has reconciled after
// the call began: it pokes the loop and waits for it to take the kick,
// twice; the loop takes the second only once the first reconcile (or the
// one of a kick already pending) has returned.
func reconciledNow(t testing.TB, r *Runner) {
	t.Helper()
	for range 2 {
		r.poke()
		testutil.Eventually(t, 10*time.Second, "the runner's loop to take a kick", testutil.True(func() bool { return len(r.kick) == 0 }))
	}
}

// startedRuns counts the runs the runner's log says it started.
func startedRuns(logs string) int { return strings.Count(logs, `msg="started job"`) }

package coordinator

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// A submit beyond its team's full quota, in a team that preempts lower
// priorities, whose victim is a lower-priority job of its own team is
// decided on the fast path (issue 27: each cost a full cycle), and, as
// after the full cycle's preemption, a follow-up cycle comes at once.
func TestOwnTeamPreemptionOnTheFastPathIsFollowedUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	const flavor = "trainium2"
	putNeuronNodes(t, ctx, cli, st, flavor, 2)
	team := policy.Team{Name: "a", Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 16}}, Preemption: policy.PreemptLowerPriority}
	if err := st.PutTeam(ctx, team); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var cycles []CycleStats
	observe := func(s CycleStats) {
		mu.Lock()
		defer mu.Unlock()
		cycles = append(cycles, s)
	}
	c := New(cli, Config{Debounce: 5 * time.Millisecond, OnCycle: observe, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	defer func() { stop(); <-done }()

	// decided waits for the cycle that admits job name and returns its
	// index.
	decided := func(name string) int {
		t.Helper()
		at := -1
		until(t, "job "+name+" admitted", func() bool {
			mu.Lock()
			defer mu.Unlock()
			for i, s := range cycles {
				if r, ok := s.Decision.Reason(name); ok && r.Kind == policy.KindAdmitted {
					at = i
					return true
				}
			}
			return false
		})
		return at
	}
	submit := func(name string, prio int) {
		t.Helper()
		j := policy.Job{Name: name, Team: "a", Priority: &prio, PerNode: policy.Resources{Accelerators: 8}}
		if err := st.SubmitJob(ctx, fleet.JobSpec{Job: j, Run: fleet.RunSpec{Script: "train.py"}}); err != nil {
			t.Fatal(err)
		}
	}
	submit("a-low1", 0)
	decided("a-low1")
	submit("a-low2", 0)
	decided("a-low2")
	time.Sleep(100 * time.Millisecond) // the cycles settle
	submit("a-high", 10)
	at := decided("a-high")
	mu.Lock()
	s := cycles[at]
	r, _ := s.Decision.Reason("a-high")
	victim, _ := s.Decision.Reason("a-low2") // the newer of the two
	mu.Unlock()
	if !s.Fast {
		t.Fatal("a-high was decided by a full cycle")
	}
	if r.Code != policy.CodePriorityPreemption || victim.Kind != policy.KindPreempted {
		t.Fatalf("a-high %s/%s, a-low2 %s: want a-high admitted by preempting a-low2", r.Kind, r.Code, victim.Kind)
	}
	until(t, "a follow-up cycle after the fast path's preemption", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(cycles) > at+1
	})
	mu.Lock()
	defer mu.Unlock()
	if next := cycles[at+1]; next.Fast {
		t.Errorf("the cycle after the preemption took the fast path (no fixed point to start from)")
	}
}

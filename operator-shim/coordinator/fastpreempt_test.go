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
	"github.com/hyperpodrun/hyperpodrun/internal/idlegc"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// A submit that takes capacity from other jobs is decided on the fast
// path (issue 27: each cost a full cycle of up to 430 ms at 20,000
// nodes), and, as after the full cycle's preemption, a follow-up cycle
// comes at once, decided on the fast path too: beyond its team's full quota, in a team that preempts
// lower priorities, from a lower-priority job of its own team (rule 6);
// within its team's nominal quota, from another team that borrowed what
// the cohort lent (rule 3). The victim's desired record stops it.
func TestPreemptionOnTheFastPathIsFollowedUp(t *testing.T) {
	const flavor = "trainium2"
	for _, tc := range []struct {
		rule   string
		teams  []policy.Team
		before []policy.Job // submitted one by one, each admitted
		submit policy.Job
		victim string
		code   policy.ReasonCode
		nodes  int
		next   policy.Job // submitted after the follow-up: the fast path decides it
	}{
		{"a submit beyond its team's quota preempts a lower-priority job of its team",
			[]policy.Team{{Name: "a", Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 16}}, Preemption: policy.PreemptLowerPriority}},
			[]policy.Job{gpuJob("a-low1", "a", 0), gpuJob("a-low2", "a", 0)},
			gpuJob("a-high", "a", 10), "a-low2", policy.CodePriorityPreemption, 2, smallJob("z-small", "a")},
		{"a submit within its team's nominal quota reclaims it from another team's borrower",
			[]policy.Team{{Name: "a", Cohort: "c", Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 8}}},
				{Name: "b", Cohort: "c", Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 8}}},
				{Name: "d", Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 8}}}},
			[]policy.Job{smallJob("d1", "d"), gpuJob("b1", "b", 0), gpuJob("b2", "b", 0)},
			gpuJob("a-new", "a", 0), "b2", policy.CodeReclaim, 3, smallJob("z-small", "d")},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, cli := etcdtest.Start(t)
			st := fleet.New(cli, "")
			putNeuronNodes(t, ctx, cli, st, flavor, tc.nodes)
			for _, team := range tc.teams {
				if err := st.PutTeam(ctx, team); err != nil {
					t.Fatal(err)
				}
			}
			var mu sync.Mutex
			var cycles []CycleStats
			observe := func(s CycleStats) {
				mu.Lock()
				defer mu.Unlock()
				cycles = append(cycles, kept(s))
			}
			c := New(cli, Config{Debounce: 5 * time.Millisecond, OnCycle: observe, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			// idle[i] is what the cycle loop told the idle collector at
			// the end of cycle i: whether a wait follows.
			var idle []bool
			c.idleGC = gcRecorder(func(wait bool) {
				mu.Lock()
				defer mu.Unlock()
				idle = append(idle, wait)
			})
			cctx, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { c.Run(cctx); close(done) }()
			defer func() { stop(); <-done }()

			// decided waits for the cycle that admits job name and
			// returns its index.
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
			submit := func(j policy.Job) {
				t.Helper()
				if err := st.SubmitJob(ctx, fleet.JobSpec{Job: j, Run: fleet.RunSpec{Script: "train.py"}}); err != nil {
					t.Fatal(err)
				}
			}
			for _, j := range tc.before {
				submit(j)
				decided(j.Name)
			}
			// The cycles settle: the last one is a fixed point (a fast
			// path's admission, or a full cycle that writes nothing).
			until(t, "the cycles settle", func() bool {
				mu.Lock()
				defer mu.Unlock()
				n := len(cycles)
				return n > 0 && (cycles[n-1].Fast || cycles[n-1].Ops == 0)
			})
			submit(tc.submit)
			at := decided(tc.submit.Name)
			mu.Lock()
			s := cycles[at]
			r, _ := s.Decision.Reason(tc.submit.Name)
			victim, _ := s.Decision.Reason(tc.victim)
			mu.Unlock()
			if !s.Fast {
				t.Fatalf("%s was decided by a full cycle", tc.submit.Name)
			}
			if r.Code != tc.code || victim.Kind != policy.KindPreempted {
				t.Fatalf("%s %s/%s, %s %s: want %s admitted by preempting %s (%s)", tc.submit.Name, r.Kind, r.Code, tc.victim, victim.Kind, tc.submit.Name, tc.victim, tc.code)
			}
			until(t, "the victim's desired record stops it", func() bool {
				d, err := st.Desired(ctx, tc.victim)
				return err == nil && d.Stop != nil && d.Stop.Kind == fleet.StopPreemption
			})
			until(t, "a follow-up cycle after the fast path's preemption", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(cycles) > at+1
			})
			// The follow-up requeues the victim, and the engine decides
			// it on its fast path too (policy.Engine.FollowUp): at fleet
			// scale a full follow-up took 150-360 ms, and the next
			// submit waited for it.
			mu.Lock()
			next := cycles[at+1]
			mu.Unlock()
			if !next.Fast {
				t.Errorf("the follow-up of the preemption took a full cycle")
			}
			if r, _ := next.Decision.Reason(tc.victim); r.Kind != policy.KindPending {
				t.Errorf("after the follow-up %s is %s (%s), want Pending", tc.victim, r.Kind, r.Message)
			}
			// No collection may start between the preemption and its
			// follow-up (Config.IdleGC): the follow-up comes at once, and
			// a collection's mark would slow it. After the follow-up the
			// coordinator waits, and one may.
			until(t, "the follow-up's end told to the idle collector", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(idle) > at+1
			})
			mu.Lock()
			if idle[at] || !idle[at+1] {
				t.Errorf("idle collector told wait=%v after the preempting cycle and %v after its follow-up; want false, true", idle[at], idle[at+1])
			}
			mu.Unlock()
			// The follow-up left a fixed point: the next submit takes
			// the fast path.
			submit(tc.next)
			until(t, tc.next.Name+" decided", func() bool {
				mu.Lock()
				defer mu.Unlock()
				for _, s := range cycles[at+1:] {
					if _, ok := s.Decision.Reason(tc.next.Name); ok {
						return true
					}
				}
				return false
			})
			mu.Lock()
			defer mu.Unlock()
			for _, s := range cycles[at+1:] {
				if _, ok := s.Decision.Reason(tc.next.Name); ok {
					if !s.Fast {
						t.Errorf("the submit after the follow-up took a full cycle")
					}
					break
				}
			}
		})
	}
}

// gcRecorder is an idle collector (burstGC) that records what each
// cycle's end says and never collects.
type gcRecorder func(idle bool)

func (gcRecorder) Begin() {}

func (r gcRecorder) End(idle bool) bool {
	r(idle)
	return false
}

func (gcRecorder) Stop() {}

func (gcRecorder) Returned() idlegc.Returned { return idlegc.Returned{} }

// gpuJob is a single-node job of 8 accelerators (a whole Trainium2 node).
func gpuJob(name, team string, prio int) policy.Job {
	return policy.Job{Name: name, Team: team, Priority: &prio, PerNode: policy.Resources{Accelerators: 8}}
}

// smallJob is a job of one accelerator.
func smallJob(name, team string) policy.Job {
	return policy.Job{Name: name, Team: team, PerNode: policy.Resources{Accelerators: 1}}
}

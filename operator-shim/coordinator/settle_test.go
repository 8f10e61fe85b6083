package coordinator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// Issue 27: a cycle that changes allocations re-explains waiting jobs
// (the capacity it freed) and its follow-up explains them back: at 20,000
// nodes 2,000-3,000 status writes each way per churn round. A waiting
// job's new explanation is written only by the last cycle of the chain
// (settle); the follow-up compares the job in full. So is a running
// elastic job's (why it does not grow: 50-170 jobs a churn round written
// Running/NoCapacity, then Running/CohortExhausted), and a job's first
// (37-66 new jobs a round), with its first event: the chain writes one
// status and one event for it. Other events are written at once.
func TestWaitingJobsStatusIsWrittenByTheLastCycleOfAChain(t *testing.T) {
	t0 := time.Unix(1000, 0)
	k := fleet.NewKeys("")
	pending := func(job string, code policy.ReasonCode) policy.Reason {
		return policy.Reason{Job: job, Team: "t", Kind: policy.KindPending, Code: code, Message: string(code)}
	}
	// e: an elastic job that runs on one node and could grow.
	running := func(job string, code policy.ReasonCode) policy.Reason {
		return policy.Reason{Job: job, Team: "t", Kind: policy.KindRunning, Code: code, FromSize: 1, ToSize: 1, Message: "cannot grow: " + string(code)}
	}
	alloc := api.Allocation{Job: "a", Team: "t", Flavor: "f", Size: 1, AcceleratorsPerNode: 8, Nodes: []string{"n1"}, Since: t0}
	allocE := api.Allocation{Job: "e", Team: "t", Flavor: "f", Size: 1, AcceleratorsPerNode: 8, Nodes: []string{"n2"}, Since: t0}
	start := policy.Decision{Now: t0, Allocations: []api.Allocation{allocE}, Reasons: []policy.Reason{
		pending("a", policy.CodeNoCapacity), running("e", policy.CodeCohortExhausted), pending("w", policy.CodeCohortExhausted)}}
	// a admitted into freed capacity; e and w told capacity was freed;
	// n, submitted meanwhile, too.
	admit := policy.Decision{Now: t0.Add(time.Second), Allocations: []api.Allocation{alloc, allocE}, Reasons: []policy.Reason{
		{Job: "a", Team: "t", Kind: policy.KindAdmitted, ToSize: 1, Message: "admitted"},
		running("e", policy.CodeNoCapacity), pending("n", policy.CodeNoCapacity), pending("w", policy.CodeNoCapacity)}}
	// The follow-up: their cohort is exhausted again.
	back := policy.Decision{Now: t0.Add(2 * time.Second), Allocations: []api.Allocation{alloc, allocE}, Reasons: []policy.Reason{
		{Job: "a", Team: "t", Kind: policy.KindRunning, FromSize: 1, ToSize: 1, Message: "running"},
		running("e", policy.CodeCohortExhausted), pending("n", policy.CodeCohortExhausted), pending("w", policy.CodeCohortExhausted)}}
	// The follow-up: they wait for nodes now.
	stays := back
	stays.Reasons = []policy.Reason{back.Reasons[0], running("e", policy.CodeNoCapacity), pending("n", policy.CodeNoCapacity), pending("w", policy.CodeNoCapacity)}
	statusW, statusE, statusN := "put "+k.Status("w"), "put "+k.Status("e"), "put "+k.Status("n")
	// eventsOfN counts the puts of n's events in writes.
	eventsOfN := func(writes []string) int {
		n := 0
		for _, w := range writes {
			if strings.HasPrefix(w, "put "+k.EventsPrefix()) && strings.HasSuffix(w, "-n") {
				n++
			}
		}
		return n
	}
	for _, tc := range []struct {
		rule      string
		followed  bool              // a follow-up comes after admit
		next      []policy.Decision // the chain's next cycles (followed: none after the last)
		wantAdmit bool              // admit's plan writes w's, e's and n's statuses (and n's event)
		wantNext  []bool            // each next plan writes w's and e's statuses
		wantCode  policy.ReasonCode // w's, e's and n's statuses at the end
		// n waits since the chain first saw it, or since a follow-up
		// explained its wait otherwise (Since: when it entered its code).
		wantSinceN time.Time
	}{
		{rule: "an explanation the follow-up takes back is never written", followed: true, next: []policy.Decision{back}, wantNext: []bool{false}, wantCode: policy.CodeCohortExhausted, wantSinceN: back.Now},
		{rule: "an explanation the follow-up keeps is written by the follow-up", followed: true, next: []policy.Decision{stays}, wantNext: []bool{true}, wantCode: policy.CodeNoCapacity, wantSinceN: admit.Now},
		{rule: "a cycle no follow-up comes after writes it at once", wantAdmit: true, wantCode: policy.CodeNoCapacity, wantSinceN: admit.Now},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			c := newPlanCoordinator(t)
			cm := &fakeCommitter{}
			run := func(d policy.Decision, followed bool) []string {
				p := c.plan(d, !c.view.haveLast)
				p.settle(followed)
				if _, err := c.commitPlan(context.Background(), cm, p); err != nil {
					t.Fatal(err)
				}
				return opKeys(p)
			}
			run(start, false)
			writes := run(admit, tc.followed)
			// a waited: its Pending status goes at once (it runs as its
			// desired record places it: no status record).
			if !slices.Contains(writes, "delete "+k.Status("a")) || slices.Contains(writes, "put "+k.Status("a")) {
				t.Errorf("the admitted job's waiting status is not deleted at once: %v", writes)
			}
			for _, st := range []string{statusW, statusE, statusN} {
				if got := slices.Contains(writes, st); got != tc.wantAdmit {
					t.Errorf("the admitting cycle writes %s: %v, want %v (%v)", st, got, tc.wantAdmit, writes)
				}
			}
			statusesN, eventsN := 0, eventsOfN(writes)
			if slices.Contains(writes, statusN) {
				statusesN++
			}
			for i, d := range tc.next {
				writes := run(d, i < len(tc.next)-1)
				for _, st := range []string{statusW, statusE} {
					if got := slices.Contains(writes, st); got != tc.wantNext[i] {
						t.Errorf("follow-up %d writes %s: %v, want %v (%v)", i+1, st, got, tc.wantNext[i], writes)
					}
				}
				if slices.Contains(writes, statusN) {
					statusesN++
				}
				eventsN += eventsOfN(writes)
			}
			// The new job: one status and one event over the chain.
			if statusesN != 1 || eventsN != 1 {
				t.Errorf("the new job's status was written %d times and its event %d times over the chain, want 1 and 1", statusesN, eventsN)
			}
			if evs := c.view.events.byJob["n"]; len(evs) != 1 || evs[0].e.Reason.Code != tc.wantCode {
				t.Errorf("the new job's history: %+v, want one event saying %s", evs, tc.wantCode)
			}
			if s := c.view.statuses["n"]; s == nil || !s.Since.Equal(tc.wantSinceN) {
				t.Errorf("the new job's status: %+v, want it waiting since %v", s, tc.wantSinceN)
			}
			for _, job := range []string{"w", "e", "n"} {
				if s := c.view.statuses[job]; s == nil || s.Code != tc.wantCode {
					t.Errorf("%s's status at the end: %+v, want %s", job, s, tc.wantCode)
				}
			}
		})
	}
}

func TestExplanationOnly(t *testing.T) {
	status := func(kind policy.ReasonKind, code policy.ReasonCode) *fleet.Status {
		return &fleet.Status{Reason: policy.Reason{Job: "j", Kind: kind, Code: code}}
	}
	taken := status(policy.KindPending, policy.CodeNoCapacity)
	taken.For, taken.ForTeam = []string{"high"}, "a"
	for _, tc := range []struct {
		rule string
		prev *fleet.Status
		had  bool
		r    policy.Reason
		want bool
	}{
		{rule: "a waiting job's new explanation is held", prev: status(policy.KindPending, policy.CodeCohortExhausted), had: true,
			r: policy.Reason{Kind: policy.KindPending, Code: policy.CodeNoCapacity}, want: true},
		{rule: "a running job's new explanation is held", prev: status(policy.KindRunning, policy.CodeCohortExhausted), had: true,
			r: policy.Reason{Kind: policy.KindRunning, Code: policy.CodeNoCapacity}, want: true},
		{rule: "a new job's first status is held", prev: &fleet.Status{}, had: false,
			r: policy.Reason{Kind: policy.KindPending, Code: policy.CodeNoCapacity}, want: true},
		{rule: "a new job that does not wait is written", prev: &fleet.Status{}, had: false,
			r: policy.Reason{Kind: policy.KindInvalid, Code: policy.CodeInvalidSpec}, want: false},
		{rule: "a change of kind is written", prev: status(policy.KindRunning, ""), had: true,
			r: policy.Reason{Kind: policy.KindPending, Code: policy.CodeNoCapacity}, want: false},
		{rule: "a status that names who took the capacity is written", prev: taken, had: true,
			r: policy.Reason{Kind: policy.KindPending, Code: policy.CodeCohortExhausted}, want: false},
		{rule: "a job that neither waits nor runs has no explanation held", prev: status(policy.KindShrunk, policy.CodeReclaim), had: true,
			r: policy.Reason{Kind: policy.KindShrunk, Code: policy.CodePriorityPreemption}, want: false},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := explanationOnly(tc.prev, &tc.r, tc.had); got != tc.want {
				t.Errorf("explanationOnly(%+v, %+v, %v) = %v, want %v", tc.prev.Reason, tc.r, tc.had, got, tc.want)
			}
		})
	}
}

// A new job that the follow-up admits, after its first cycle held its
// status: its pending time (the coordinator's pending-time histogram)
// counts from that first cycle, and no waiting status is ever written.
func TestAHeldNewJobsWaitIsCountedWhenTheFollowUpAdmitsIt(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := newPlanCoordinator(t)
	cm := &fakeCommitter{}
	seen := policy.Decision{Now: t0, Reasons: []policy.Reason{
		{Job: "n", Team: "t", Kind: policy.KindPending, Code: policy.CodeNoCapacity, Message: "waits"}}}
	admitted := policy.Decision{Now: t0.Add(1500 * time.Millisecond),
		Allocations: []api.Allocation{{Job: "n", Team: "t", Flavor: "f", Size: 1, AcceleratorsPerNode: 8, Nodes: []string{"n1"}, Since: t0}},
		Reasons:     []policy.Reason{{Job: "n", Team: "t", Kind: policy.KindAdmitted, ToSize: 1, Message: "admitted"}}}
	var writes []string
	for i, d := range []policy.Decision{seen, admitted} {
		p := c.plan(d, !c.view.haveLast)
		p.settle(i == 0)
		if _, err := c.commitPlan(context.Background(), cm, p); err != nil {
			t.Fatal(err)
		}
		writes = append(writes, opKeys(p)...)
	}
	if !slices.Equal(c.waited, []time.Duration{1500 * time.Millisecond}) {
		t.Errorf("pending times counted by the admitting cycle: %v, want [1.5s]", c.waited)
	}
	if slices.Contains(writes, "put "+fleet.NewKeys("").Status("n")) {
		t.Errorf("a waiting status was written for a job the chain admitted: %v", writes)
	}
}

// A new job's first event, held by a cycle with its status, counts in the
// history's bound: written by settle, it does not leave the history over
// the bound (and its 10% slack) until the next prune.
func TestAHeldFirstEventCountsInTheHistorysBound(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, followed := range []bool{false, true} {
		t.Run(fmt.Sprintf("followed=%v", followed), func(t *testing.T) {
			c := newPlanCoordinator(t)
			c.cfg.MaxEvents, c.cfg.MaxEventsPerJob = 10, 20
			// The history at its bound and slack: 11 events of job o.
			for i := range 11 {
				c.view.events.record(policy.Reason{Job: "o", Kind: policy.KindShrunk, FromSize: i + 2, ToSize: i + 1}, t0.Add(time.Duration(i)*time.Second), time.Hour)
			}
			d := policy.Decision{Now: t0.Add(time.Minute), Reasons: []policy.Reason{
				{Job: "n", Team: "t", Kind: policy.KindPending, Code: policy.CodeNoCapacity, Message: "waits"}}}
			p := c.plan(d, !c.view.haveLast)
			p.settle(followed)
			if _, err := c.commitPlan(context.Background(), &fakeCommitter{}, p); err != nil {
				t.Fatal(err)
			}
			if got := c.view.events.total; got > 11 {
				t.Errorf("the history holds %d events after the cycle, want at most the bound and its slack (11)", got)
			}
			if _, ok := c.view.statuses["n"]; ok == followed {
				t.Errorf("the new job has a status after a cycle followed=%v: %v", followed, ok)
			}
		})
	}
}

// BenchmarkPlanManyNewWaitingJobs plans a cycle that sees 20,000 waiting
// jobs for the first time (a burst past the fast path, or a leader's
// first cycle after submits while none led) and is followed: every first
// status and event is held, and counted in the history's bound once.
func BenchmarkPlanManyNewWaitingJobs(b *testing.B) {
	t0 := time.Unix(1000, 0)
	d := policy.Decision{Now: t0}
	for i := range 20000 {
		d.Reasons = append(d.Reasons, policy.Reason{Job: fmt.Sprintf("j%05d", i), Team: "t", Kind: policy.KindPending, Code: policy.CodeNoCapacity, Message: "waits"})
	}
	for b.Loop() {
		b.StopTimer()
		c := newPlanCoordinator(b)
		b.StartTimer()
		p := c.plan(d, true)
		p.settle(false)
		if len(p.events) != len(d.Reasons) {
			b.Fatalf("%d first events written, want %d", len(p.events), len(d.Reasons))
		}
	}
}

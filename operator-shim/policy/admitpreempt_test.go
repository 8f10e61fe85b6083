package policy

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// settledEngine brings st to the engine's fixed point (as the coordinator
// runs its follow-up cycles) and returns the engine and the state with its
// allocations.
func settledEngine(st State) (*Engine, State) {
	st.Now = t0
	var e Engine
	for i := 0; i < 6; i++ {
		d := e.Schedule(st)
		st.Allocations = d.Allocations
		st.Now = st.Now.Add(time.Second)
	}
	return &e, st
}

// placed is a running single-node job's allocation.
func placed(job, team string, gpus int, node string) Allocation {
	return Allocation{Job: job, Team: team, Flavor: h100, Size: 1, Nodes: []string{node}, AcceleratorsPerNode: gpus, Since: t0, LastResize: t0}
}

// withSubmit is st with j submitted now, its jobs in name order.
func withSubmit(st State, j Job) State {
	j.SubmitTime = st.Now
	st.Jobs = append(slices.Clone(st.Jobs), j)
	slices.SortFunc(st.Jobs, func(a, b Job) int { return strings.Compare(a.Name, b.Name) })
	return st
}

// TestAdmitPreemptsOnTheFastPath: a single submit is decided on the fast
// path where it takes capacity from other jobs (at fleet scale each such
// submit cost a full cycle of 170-430 ms): beyond its team's full quota,
// in a team that preempts lower priorities, where rule 6 finds its victims
// in its own team; within its team's nominal quota, where rule 3 reclaims
// what its cohort lent to a team that borrows. Exactly the full cycle's
// decision (allocations, every reason, team usage), the victim preempted
// or shrunk, and the engine says a follow-up is due (Settled false), as it
// is after the full cycle.
func TestAdmitPreemptsOnTheFastPath(t *testing.T) {
	for _, tc := range []struct {
		rule   string
		st     State
		submit Job
		code   ReasonCode
		victim string
		kind   ReasonKind
		also   string // a waiting job admitted in the same cycle
	}{
		{"a submit beyond its team's full quota preempts a lower-priority job of its team", State{
			Nodes: mkNodes("n", 2, 8),
			Teams: []Team{preempting(mkTeam("a", 16))},
			Jobs:  []Job{frac("a-low1", "a", 0, 8), frac("a-low2", "a", 0, 8)},
		}, frac("a-high", "a", 10, 8), CodePriorityPreemption, "a-low1", KindPreempted, ""},
		{"a submit beyond its team's full quota shrinks the team's lower-priority elastic job", State{
			Nodes: mkNodes("n", 2, 8),
			Teams: []Team{preempting(mkTeam("a", 16))},
			Jobs:  []Job{job("a-el", "a", 0, 1, 2, true)},
		}, frac("a-high", "a", 10, 8), CodePriorityPreemption, "a-el", KindShrunk, ""},
		{"a submit within its team's nominal quota reclaims it from another team's borrower", State{
			Nodes: mkNodes("n", 2, 8),
			Teams: []Team{inCohort(mkTeam("a", 8), "c"), inCohort(mkTeam("b", 8), "c")},
			Jobs:  []Job{frac("b1", "b", 0, 8), frac("b2", "b", 0, 8)},
		}, frac("a-new", "a", 0, 8), CodeReclaim, "b1", KindPreempted, ""},
		{"a submit within its team's nominal quota shrinks another team's elastic borrower", State{
			Nodes: mkNodes("n", 3, 8),
			Teams: []Team{inCohort(mkTeam("a", 8), "c"), inCohort(mkTeam("b", 16), "c")},
			Jobs:  []Job{job("b-el", "b", 0, 1, 3, true)},
		}, frac("a-new", "a", 5, 8), CodeReclaim, "b-el", KindShrunk, ""},
		{"a waiting job that fits what a reclaim left free is admitted by rule 5 in the same decision", State{
			Nodes: mkNodes("n", 1, 8),
			Teams: []Team{inCohort(mkTeam("a", 4), "c"), inCohort(mkTeam("b", 4), "c")},
			Jobs:  []Job{frac("b-big", "b", 0, 8), frac("b-small", "b", 0, 2)},
			// b-small came after b-big borrowed the node whole.
			Allocations: []Allocation{placed("b-big", "b", 8, "n-000")},
		}, frac("a-new", "a", 0, 4), CodeReclaim, "b-big", KindPreempted, "b-small"},
		{"a waiting job of another team that rule 6 tries after the submit, and fails for again, keeps it on the fast path", State{
			Nodes: mkNodes("n", 4, 8),
			Teams: []Team{preempting(mkTeam("a", 16)), mkTeam("b", 8), preempting(mkTeam("c", 16))},
			Jobs: []Job{frac("a-low1", "a", 0, 8), frac("a-low2", "a", 0, 8), frac("b1", "b", 0, 8),
				frac("c-low", "c", 0, 4), job("c-wait", "c", 5, 2, 2, false)},
			// c-wait came last: one node is free once c-low is preempted,
			// and rule 6 fails for it every cycle.
			Allocations: []Allocation{placed("a-low1", "a", 8, "n-000"), placed("a-low2", "a", 8, "n-001"),
				placed("b1", "b", 8, "n-002"), placed("c-low", "c", 4, "n-003")},
		}, frac("a-high", "a", 10, 8), CodePriorityPreemption, "a-low1", KindPreempted, ""},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			e, st := settledEngine(tc.st)
			st = withSubmit(st, tc.submit)
			full := Schedule(st)
			got, ok := e.Admit(st, []string{tc.submit.Name})
			if !ok {
				t.Fatalf("declined: %s", e.Declined())
			}
			if r := reasonOf(t, got, tc.submit.Name); r.Kind != KindAdmitted || r.Code != tc.code {
				t.Fatalf("%s: %s/%s (%s), want Admitted/%s", tc.submit.Name, r.Kind, r.Code, r.Message, tc.code)
			}
			if r := reasonOf(t, got, tc.victim); r.Kind != tc.kind {
				t.Fatalf("%s: %s (%s), want %s", tc.victim, r.Kind, r.Message, tc.kind)
			}
			if tc.also != "" {
				if r := reasonOf(t, got, tc.also); r.Kind != KindAdmitted {
					t.Fatalf("%s: %s (%s), want Admitted", tc.also, r.Kind, r.Message)
				}
			}
			if !reflect.DeepEqual(got.Allocations, full.Allocations) {
				t.Fatalf("allocations differ:\nfast %+v\nfull %+v", got.Allocations, full.Allocations)
			}
			if !reflect.DeepEqual(got.Reasons, full.Reasons) {
				t.Fatalf("reasons differ:\nfast %+v\nfull %+v", got.Reasons, full.Reasons)
			}
			if !reflect.DeepEqual(got.Teams, full.Teams) {
				t.Fatalf("team usage differs:\nfast %+v\nfull %+v", got.Teams, full.Teams)
			}
			if e.Settled() {
				t.Fatal("Settled after a preemption: the coordinator would run no follow-up")
			}
			// The next submit has no fixed point to start from.
			st.Allocations = got.Allocations
			st = withSubmit(st, frac("z-next", tc.submit.Team, 0, 1))
			if _, ok := e.Admit(st, []string{"z-next"}); ok {
				t.Fatal("the submit after a preemption was decided on the fast path")
			}
		})
	}
}

// TestAdmitLeavesOtherPreemptionsToTheFullCycle names the rule 6
// preemptions the fast path declines: the full cycle decides them.
func TestAdmitLeavesOtherPreemptionsToTheFullCycle(t *testing.T) {
	for _, tc := range []struct {
		rule   string
		st     State
		submit Job
		why    string
	}{
		{"a preemption that also takes from another team's borrower goes to the full cycle", State{
			Nodes: mkNodes("n", 2, 8),
			Teams: []Team{preempting(inCohort(mkTeam("a", 16), "c")), inCohort(mkTeam("b", 0), "c")},
			Jobs:  []Job{frac("a-low", "a", 0, 8), frac("b1", "b", 0, 8)},
		}, job("a-high", "a", 10, 2, 2, false), "rule 6 takes from another team"},
		{"a submit under StrictFIFO goes to the full cycle", State{
			Config: Config{Queueing: StrictFIFO},
			Nodes:  mkNodes("n", 2, 8),
			Teams:  []Team{preempting(mkTeam("a", 16))},
			Jobs:   []Job{frac("a-low1", "a", 0, 8), frac("a-low2", "a", 0, 8)},
		}, frac("a-high", "a", 10, 8), "StrictFIFO"},
		{"a preemption that frees a node another elastic job grows onto goes to the full cycle", State{
			Config: Config{MinStablePeriod: -1},
			Nodes:  mkNodes("n", 3, 8),
			Teams:  []Team{preempting(mkTeam("a", 24))},
			Jobs:   []Job{job("a-low", "a", 0, 2, 2, false), job("a-elastic", "a", 5, 1, 2, true)},
		}, job("a-high", "a", 10, 1, 1, false), "an elastic job could grow"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			e, st := settledEngine(tc.st)
			st = withSubmit(st, tc.submit)
			if _, ok := e.Admit(st, []string{tc.submit.Name}); ok {
				t.Fatal("the fast path decided it")
			}
			if !strings.Contains(e.Declined(), tc.why) {
				t.Fatalf("declined: %s, want %q", e.Declined(), tc.why)
			}
			if r := reasonOf(t, Schedule(st), tc.submit.Name); r.Code != CodePriorityPreemption && tc.why != "StrictFIFO" {
				t.Fatalf("the full cycle: %s/%s (%s): not the preemption this row is about", r.Kind, r.Code, r.Message)
			}
		})
	}
}

package policy

import (
	"strings"
	"testing"
	"time"
)

// Rule 2: admission within the team's nominal quota.
func TestAdmitWithinNominalQuota(t *testing.T) {
	e := newEnv(t, mkNodes("n", 4, 8), []Team{mkTeam("a", 16), mkTeam("b", 16)},
		job("a1", "a", 50, 2, 2, false))
	d := e.cycle()
	if size(d, "a1") != 2 {
		t.Fatalf("a1 size %d", size(d, "a1"))
	}
	wantKind(t, d, "a1", KindAdmitted, CodeWithinQuota)
	d = e.cycle()
	wantKind(t, d, "a1", KindRunning, "")
}

// Rule 5: borrowing idle quota of other teams in the cohort.
func TestAdmitByBorrowingIdleQuota(t *testing.T) {
	e := newEnv(t, mkNodes("n", 4, 8), []Team{mkTeam("a", 16), mkTeam("b", 16)},
		job("a1", "a", 50, 3, 3, false))
	d := e.cycle()
	if size(d, "a1") != 3 {
		t.Fatalf("a1 size %d", size(d, "a1"))
	}
	wantKind(t, d, "a1", KindAdmitted, CodeBorrowing)
	u := d.Teams[0]
	if u.Team != "a" || u.Used != 24 || u.Borrowed != 8 {
		t.Fatalf("usage %+v", u)
	}
}

func TestBorrowingLimit(t *testing.T) {
	a := mkTeam("a", 16)
	a.Quotas[0].BorrowingLimit = ip(8)
	e := newEnv(t, mkNodes("n", 6, 8), []Team{a, mkTeam("b", 32)},
		job("a1", "a", 50, 3, 3, false), job("a2", "a", 40, 1, 1, false), job("a3", "a", 60, 4, 4, false))
	d := e.cycle()
	// a3 needs 32 > nominal 16 + limit 8: it can never run.
	wantKind(t, d, "a3", KindPending, CodeQuotaExceeded)
	// a2 fits within nominal and goes first; a1 would take a to 32 > 24.
	if size(d, "a2") != 1 {
		t.Fatalf("a2 size %d", size(d, "a2"))
	}
	r := wantKind(t, d, "a1", KindPending, CodeBorrowingLimit)
	if len(r.Holders) == 0 || r.Holders[0].Job != "a2" {
		t.Fatalf("holders %+v", r.Holders)
	}
	if !strings.Contains(r.Message, "borrowing limit 8") {
		t.Fatalf("message %q", r.Message)
	}
}

func TestLendingLimit(t *testing.T) {
	b := mkTeam("b", 24)
	b.Quotas[0].LendingLimit = ip(8) // b lends at most 8 of its 24
	e := newEnv(t, mkNodes("n", 4, 8), []Team{mkTeam("a", 8), b},
		job("a1", "a", 50, 1, 4, true))
	d := e.cycle()
	if got := size(d, "a1"); got != 2 {
		t.Fatalf("a1 grew to %d, want 2 (8 own + 8 lendable)", got)
	}
	r := reasonOf(t, d, "a1")
	if r.Kind != KindAdmitted || !strings.Contains(r.Message, "grown to 2") {
		t.Fatalf("reason %+v", r)
	}
	// b can still use all of its non-lendable quota at once.
	e.add(job("b1", "b", 50, 2, 2, false))
	d = e.cycle()
	if size(d, "b1") != 2 || size(d, "a1") != 2 {
		t.Fatalf("b1 %d a1 %d", size(d, "b1"), size(d, "a1"))
	}
	// A pending borrower explains the cohort is exhausted.
	e.add(job("a2", "a", 50, 1, 1, false))
	d = e.cycle()
	r = wantKind(t, d, "a2", KindPending, CodeCohortExhausted)
	if len(r.Holders) == 0 || r.Holders[0].Job != "a1" || !r.Holders[0].Borrowing {
		t.Fatalf("holders %+v", r.Holders)
	}
}

func TestCohortsAreIsolated(t *testing.T) {
	a, b := mkTeam("a", 8), mkTeam("b", 8)
	a.Cohort, b.Cohort = "x", "y"
	e := newEnv(t, mkNodes("n", 2, 8), []Team{a, b}, job("a1", "a", 50, 2, 2, false))
	d := e.cycle()
	wantKind(t, d, "a1", KindPending, CodeCohortExhausted)
	// Same cohort: it borrows.
	b.Cohort = "x"
	e.st.Teams = []Team{a, b}
	d = e.cycle()
	wantKind(t, d, "a1", KindAdmitted, CodeBorrowing)
}

func TestUnownedCapacityIsBorrowable(t *testing.T) {
	a := mkTeam("a", 8)
	a.Cohort = "x"
	e := newEnv(t, mkNodes("n", 3, 8), []Team{a}, job("a1", "a", 50, 3, 3, false))
	d := e.cycle()
	if size(d, "a1") != 3 {
		t.Fatalf("a1 size %d (%s)", size(d, "a1"), reasonOf(t, d, "a1").Message)
	}
}

// Rule 7: growth by weighted fair share, in steps and discrete sizes.
func TestGrowByWeightedFairShare(t *testing.T) {
	a, b := mkTeam("a", 0), mkTeam("b", 0)
	b.Weight = 3
	e := newEnv(t, mkNodes("n", 16, 8), []Team{a, b},
		job("a1", "a", 50, 1, 16, true), job("b1", "b", 50, 1, 16, true))
	d := e.cycle()
	if size(d, "a1") != 4 || size(d, "b1") != 12 {
		t.Fatalf("a1 %d b1 %d, want 4 and 12", size(d, "a1"), size(d, "b1"))
	}
}

func TestGrowWithinNominalBeforeBorrowing(t *testing.T) {
	// Team b is below its nominal quota: it grows first even with a lower weight.
	a, b := mkTeam("a", 8), mkTeam("b", 56)
	a.Weight = 10
	e := newEnv(t, mkNodes("n", 8, 8), []Team{a, b},
		job("a1", "a", 50, 1, 8, true), job("b1", "b", 50, 1, 7, true))
	d := e.cycle()
	if size(d, "b1") != 7 || size(d, "a1") != 1 {
		t.Fatalf("a1 %d b1 %d", size(d, "a1"), size(d, "b1"))
	}
}

func TestGrowInStepsAndDiscreteSizes(t *testing.T) {
	stepJob := job("s", "a", 50, 2, 9, true)
	stepJob.Step = 3 // 2, 5, 8
	disc := job("d", "b", 50, 0, 0, true)
	disc.Sizes = []int{1, 2, 4, 8}
	e := newEnv(t, mkNodes("n", 14, 8), []Team{mkTeam("a", 64), mkTeam("b", 48)}, stepJob, disc)
	d := e.cycle()
	if size(d, "s") != 8 {
		t.Fatalf("s size %d, want 8", size(d, "s"))
	}
	if size(d, "d") != 4 { // 8 would need 4 more nodes; only 2 left
		t.Fatalf("d size %d, want 4", size(d, "d"))
	}
}

// Rule 3: reclaim shrinks borrowers' elastic jobs before preempting, and the
// reason says for whom.
func TestReclaimShrinksBorrowerFirst(t *testing.T) {
	e := newEnv(t, mkNodes("n", 4, 8), []Team{mkTeam("a", 16), mkTeam("b", 16)},
		job("a1", "a", 50, 1, 4, true))
	d := e.cycle()
	if size(d, "a1") != 4 {
		t.Fatalf("a1 %d", size(d, "a1"))
	}
	e.add(job("b1", "b", 10, 2, 2, false)) // low priority: reclaim does not depend on priority
	d = e.cycle()
	if size(d, "a1") != 2 || size(d, "b1") != 2 {
		t.Fatalf("a1 %d b1 %d", size(d, "a1"), size(d, "b1"))
	}
	r := wantKind(t, d, "a1", KindShrunk, CodeReclaim)
	if len(r.For) != 1 || r.For[0] != "b1" || r.ForTeam != "b" || r.FromSize != 4 || r.ToSize != 2 {
		t.Fatalf("reason %+v", r)
	}
	wantKind(t, d, "b1", KindAdmitted, CodeReclaim)
}

func TestReclaimLowestPriorityFirst(t *testing.T) {
	e := newEnv(t, mkNodes("n", 6, 8), []Team{mkTeam("a", 8), mkTeam("c", 8), mkTeam("b", 32)},
		job("hi", "a", 80, 1, 3, true), job("lo", "c", 20, 1, 3, true))
	d := e.cycle()
	if size(d, "hi") != 3 || size(d, "lo") != 3 {
		t.Fatalf("hi %d lo %d", size(d, "hi"), size(d, "lo"))
	}
	e.add(job("b1", "b", 50, 2, 2, false))
	d = e.cycle()
	if size(d, "lo") != 1 || size(d, "hi") != 3 {
		t.Fatalf("after reclaim: hi %d lo %d, want 3 and 1", size(d, "hi"), size(d, "lo"))
	}
	// More demand: lo is at its minimum, so hi shrinks next, still before any preemption.
	e.add(job("b2", "b", 50, 1, 1, false))
	d = e.cycle()
	if size(d, "lo") != 1 || size(d, "hi") != 2 {
		t.Fatalf("second reclaim: hi %d lo %d", size(d, "hi"), size(d, "lo"))
	}
	wantKind(t, d, "hi", KindShrunk, CodeReclaim)
}

func TestReclaimPreemptsWhenShrinkingIsNotEnough(t *testing.T) {
	e := newEnv(t, mkNodes("n", 4, 8), []Team{mkTeam("a", 16), mkTeam("b", 16)},
		job("a1", "a", 90, 1, 1, false))
	e.cycle()
	e.add(job("a2", "a", 90, 3, 3, false))
	d := e.cycle()
	if size(d, "a1")+size(d, "a2") != 4 {
		t.Fatalf("a1 %d a2 %d", size(d, "a1"), size(d, "a2"))
	}
	e.add(job("b1", "b", 10, 1, 1, false))
	d = e.cycle()
	if size(d, "b1") != 1 {
		t.Fatalf("b1 not admitted: %s", reasonOf(t, d, "b1").Message)
	}
	// Preempt the newest lowest-priority borrower; only one job is needed.
	r := wantKind(t, d, "a2", KindPreempted, CodeReclaim)
	if r.For[0] != "b1" || !strings.Contains(r.Message, "reclaimed its nominal quota") {
		t.Fatalf("reason %+v", r)
	}
	if size(d, "a1") != 1 {
		t.Fatalf("a1 was preempted too")
	}
}

func TestReclaimKeepsOnlyNeededVictims(t *testing.T) {
	// Two borrowers; b needs one node: exactly one step of one job is taken.
	e := newEnv(t, mkNodes("n", 8, 8), []Team{mkTeam("a", 16), mkTeam("c", 16), mkTeam("b", 32)},
		job("a1", "a", 50, 1, 4, true), job("c1", "c", 50, 1, 4, true))
	d := e.cycle()
	if size(d, "a1")+size(d, "c1") != 8 {
		t.Fatalf("a1 %d c1 %d", size(d, "a1"), size(d, "c1"))
	}
	e.add(job("b1", "b", 50, 1, 1, false))
	d = e.cycle()
	if size(d, "a1")+size(d, "c1") != 7 || size(d, "b1") != 1 {
		t.Fatalf("a1 %d c1 %d b1 %d", size(d, "a1"), size(d, "c1"), size(d, "b1"))
	}
}

func TestReclaimNeverTakesFromTeamsWithinQuota(t *testing.T) {
	// a holds exactly its nominal quota: b's job that would overflow
	// physically (overcommitted fleet) waits and says who holds the nodes.
	e := newEnv(t, mkNodes("n", 2, 8), []Team{mkTeam("a", 16), mkTeam("b", 16)},
		job("a1", "a", 10, 2, 2, false))
	e.cycle()
	e.add(job("b1", "b", 90, 1, 1, false))
	d := e.cycle()
	if size(d, "a1") != 2 {
		t.Fatalf("a1 was disturbed: %d", size(d, "a1"))
	}
	r := wantKind(t, d, "b1", KindPending, CodeNoCapacity)
	if len(r.Holders) != 1 || r.Holders[0].Job != "a1" || r.Holders[0].Borrowing {
		t.Fatalf("holders %+v", r.Holders)
	}
}

func TestReclaimOverridesStablePeriod(t *testing.T) {
	e := newEnv(t, mkNodes("n", 4, 8), []Team{mkTeam("a", 16), mkTeam("b", 16)},
		job("a1", "a", 50, 1, 4, true))
	e.tick = time.Second
	e.cycle()
	e.add(job("b1", "b", 50, 2, 2, false))
	d := e.cycle() // 1 s after a1 grew
	if size(d, "b1") != 2 || size(d, "a1") != 2 {
		t.Fatalf("b1 %d a1 %d", size(d, "b1"), size(d, "a1"))
	}
}

// Rule 6: priority preemption within a team at its quota.
func TestPriorityPreemptionWithinTeam(t *testing.T) {
	for _, pol := range []PreemptionPolicy{PreemptLowerPriority, PreemptNever} {
		a := mkTeam("a", 16)
		a.Preemption = pol
		a.Quotas[0].BorrowingLimit = ip(0)
		e := newEnv(t, mkNodes("n", 4, 8), []Team{a, mkTeam("b", 16)},
			job("lo1", "a", 10, 1, 1, false), job("lo2", "a", 20, 1, 1, false))
		e.cycle()
		e.add(job("hi", "a", 90, 1, 1, false), job("mid", "a", 20, 1, 1, false))
		d := e.cycle()
		if pol == PreemptNever {
			wantKind(t, d, "hi", KindPending, CodeBorrowingLimit)
			continue
		}
		wantKind(t, d, "hi", KindAdmitted, CodePriorityPreemption)
		r := wantKind(t, d, "lo1", KindPreempted, CodePriorityPreemption)
		if r.For[0] != "hi" {
			t.Fatalf("reason %+v", r)
		}
		if size(d, "lo2") != 1 {
			t.Fatalf("lo2 preempted too")
		}
		// Equal priority never preempts.
		wantKind(t, d, "mid", KindPending, "")
	}
}

func TestPriorityPreemptionShrinksElasticFirst(t *testing.T) {
	a := mkTeam("a", 32)
	a.Preemption = PreemptLowerPriority
	a.Quotas[0].BorrowingLimit = ip(0)
	e := newEnv(t, mkNodes("n", 4, 8), []Team{a}, job("el", "a", 10, 1, 3, true), job("fixed", "a", 5, 1, 1, false))
	d := e.cycle()
	if size(d, "el") != 3 {
		t.Fatalf("el %d", size(d, "el"))
	}
	e.add(job("hi", "a", 90, 1, 1, false))
	d = e.cycle()
	if size(d, "hi") != 1 || size(d, "el") != 2 || size(d, "fixed") != 1 {
		t.Fatalf("hi %d el %d fixed %d", size(d, "hi"), size(d, "el"), size(d, "fixed"))
	}
	wantKind(t, d, "el", KindShrunk, CodePriorityPreemption)
}

// No thrash: the stable period between growths.
func TestStablePeriodBetweenResizes(t *testing.T) {
	e := newEnv(t, mkNodes("n", 4, 8), []Team{mkTeam("a", 16), mkTeam("b", 16)},
		job("a1", "a", 50, 1, 4, true), job("b1", "b", 50, 3, 3, false))
	d := e.cycle()
	if size(d, "a1") != 1 || size(d, "b1") != 3 {
		t.Fatalf("a1 %d b1 %d", size(d, "a1"), size(d, "b1"))
	}
	e.remove("b1") // capacity frees 10 s after a1 started
	d = e.cycle()
	r := wantKind(t, d, "a1", KindRunning, CodeStablePeriod)
	if !strings.Contains(r.Message, "may grow again after 00:01:00") {
		t.Fatalf("message %q", r.Message)
	}
	for e.st.Now.Sub(t0) < 60*time.Second {
		if d = e.cycle(); size(d, "a1") != 1 {
			t.Fatalf("grew at %s, inside the stable period", e.st.Now.Sub(t0))
		}
	}
	d = e.cycle()
	wantKind(t, d, "a1", KindGrown, CodeFairShare)
	e.st.Config.MinStablePeriod = -1
	if d = e.cycle(); size(d, "a1") != 4 {
		t.Fatalf("a1 %d", size(d, "a1"))
	}
}

// Reserve: idle capacity a team with guaranteed demand cannot use yet is
// not lent to others.
func TestReservedCapacityIsNotLent(t *testing.T) {
	// An overcommitted fleet: 3 nodes for 32 GPUs of nominal quota.
	e := newEnv(t, mkNodes("n", 3, 8), []Team{mkTeam("a", 8), mkTeam("b", 24)},
		job("b1", "b", 50, 1, 1, false), job("a1", "a", 50, 1, 1, false))
	e.cycle()
	e.add(job("b4", "b", 50, 2, 2, false), job("a2", "a", 50, 1, 4, true))
	d := e.cycle()
	// b4 fits within b's quota (8+16 <= 24) but only 1 node is free and
	// nobody borrows: the free node is reserved and a2 may not borrow it.
	r := wantKind(t, d, "b4", KindPending, CodeNoCapacity)
	if !strings.Contains(r.Message, "within the team's nominal quota") {
		t.Fatalf("message %q", r.Message)
	}
	wantKind(t, d, "a2", KindPending, CodeReserved)
}

// Fractional single-node jobs are bin-packed; multi-node jobs take whole nodes.
func TestFractionalBinPacking(t *testing.T) {
	e := newEnv(t, mkNodes("n", 3, 8), []Team{mkTeam("a", 24)},
		frac("f1", "a", 50, 2), frac("f2", "a", 50, 4), frac("f3", "a", 50, 2), job("w", "a", 40, 2, 2, false))
	d := e.cycle()
	nodes := map[string]bool{}
	for _, j := range []string{"f1", "f2", "f3"} {
		a, ok := d.Allocation(j)
		if !ok {
			t.Fatalf("%s not admitted", j)
		}
		nodes[a.Nodes[0]] = true
	}
	if len(nodes) != 1 {
		t.Fatalf("fractional jobs spread over %v", nodes)
	}
	if size(d, "w") != 2 {
		t.Fatalf("whole-node job w: %s", reasonOf(t, d, "w").Message)
	}
	// A 1-GPU job now fits nowhere... the shared node has exactly 0 free; add one more frac: pending.
	e.add(frac("f4", "a", 50, 1))
	d = e.cycle()
	wantKind(t, d, "f4", KindPending, "")
}

func TestBestFitPrefersPartlyUsedNodes(t *testing.T) {
	e := newEnv(t, mkNodes("n", 2, 8), []Team{mkTeam("a", 16)}, frac("f1", "a", 50, 6))
	e.cycle()
	e.add(frac("f2", "a", 50, 2), job("w", "a", 40, 1, 1, false))
	e.st.Jobs[2].MaxNodes = 1
	d := e.cycle()
	a1, _ := d.Allocation("f1")
	a2, _ := d.Allocation("f2")
	if a1.Nodes[0] != a2.Nodes[0] || size(d, "w") != 1 {
		t.Fatalf("f1 %v f2 %v w %d", a1.Nodes, a2.Nodes, size(d, "w"))
	}
}

// Draining, cordoned and unhealthy nodes get no new work.
func TestNoNewWorkOnDrainingOrUnhealthyNodes(t *testing.T) {
	nodes := mkNodes("n", 4, 8)
	nodes[0].Draining = true
	nodes[1].Unschedulable = true
	nodes[2].Unhealthy = true
	e := newEnv(t, nodes, []Team{mkTeam("a", 32)}, job("a1", "a", 50, 1, 4, true), job("a2", "a", 50, 1, 1, false))
	d := e.cycle()
	if size(d, "a1")+size(d, "a2") != 1 {
		t.Fatalf("a1 %d a2 %d", size(d, "a1"), size(d, "a2"))
	}
	for _, a := range d.Allocations {
		if a.Nodes[0] != "n-003" {
			t.Fatalf("placed on %v", a.Nodes)
		}
	}
}

func TestDrainingKeepsWorkAndShrinksItFirst(t *testing.T) {
	e := newEnv(t, mkNodes("n", 4, 8), []Team{mkTeam("a", 16), mkTeam("b", 16)}, job("a1", "a", 50, 1, 4, true))
	d := e.cycle()
	first := d.Allocations[0].Nodes[0]
	for i := range e.st.Nodes {
		if e.st.Nodes[i].Name == first {
			e.st.Nodes[i].Draining = true
		}
	}
	d = e.cycle()
	if size(d, "a1") != 4 {
		t.Fatalf("draining node's work was dropped")
	}
	e.add(job("b1", "b", 50, 1, 1, false))
	d = e.cycle()
	a, _ := d.Allocation("a1")
	for _, n := range a.Nodes {
		if n == first {
			t.Fatalf("shrink kept the draining node %s: %v", first, a.Nodes)
		}
	}
}

func TestLostNodeIsRepairedOrShrunk(t *testing.T) {
	e := newEnv(t, mkNodes("n", 4, 8), []Team{mkTeam("a", 32)}, job("a1", "a", 50, 2, 3, true))
	e.st.Config.MinStablePeriod = time.Hour
	d := e.cycle()
	if size(d, "a1") != 3 {
		t.Fatalf("a1 %d", size(d, "a1"))
	}
	lost := d.Allocations[0].Nodes[1]
	for i := range e.st.Nodes {
		if e.st.Nodes[i].Name == lost {
			e.st.Nodes[i].Unhealthy = true
		}
	}
	d = e.cycle()
	r := wantKind(t, d, "a1", KindRepaired, CodeNodeLost)
	a, _ := d.Allocation("a1")
	if a.Size != 3 || a.Nodes[0] != "n-000" || a.Nodes[1] != "n-002" {
		t.Fatalf("repaired allocation %v (%s); kept nodes must keep their order", a.Nodes, r.Message)
	}
	// Lose another: no spare left, the elastic job shrinks to 2 and stays.
	e.st.Nodes = e.st.Nodes[:2]
	e.st.Nodes[1].Unhealthy = false
	d = e.cycle()
	wantKind(t, d, "a1", KindShrunk, CodeNodeLost)
	if size(d, "a1") != 2 {
		t.Fatalf("a1 %d", size(d, "a1"))
	}
}

func TestUnhealthyAcceleratorsReduceCapacity(t *testing.T) {
	nodes := mkNodes("n", 1, 8)
	nodes[0].UnhealthyAccelerators = 2
	e := newEnv(t, nodes, []Team{mkTeam("a", 8)}, frac("big", "a", 60, 8), frac("six", "a", 50, 6))
	d := e.cycle()
	wantKind(t, d, "big", KindPending, "")
	wantKind(t, d, "six", KindAdmitted, CodeWithinQuota)
}

func TestVCPUAndMemory(t *testing.T) {
	nodes := mkNodes("n", 1, 8)
	nodes[0].VCPUs = 32
	a := mkTeam("a", 8)
	a.Quotas[0].Memory = ByteSize(100 << 30)
	j1 := frac("j1", "a", 50, 2)
	j1.PerNode.VCPUs = 24
	j2 := frac("j2", "a", 50, 2)
	j2.PerNode.VCPUs = 16
	j3 := frac("j3", "a", 40, 2)
	j3.PerNode.Memory = ByteSize(200 << 30)
	e := newEnv(t, nodes, []Team{a}, j1, j2, j3)
	d := e.cycle()
	if size(d, "j1") != 1 || size(d, "j2") != 0 {
		t.Fatalf("j1 %d j2 %d", size(d, "j1"), size(d, "j2"))
	}
	r := wantKind(t, d, "j3", KindPending, CodeQuotaExceeded)
	if !strings.Contains(r.Message, "memory quota") {
		t.Fatalf("message %q", r.Message)
	}
}

func TestStrictFIFO(t *testing.T) {
	e := newEnv(t, mkNodes("n", 2, 8), []Team{mkTeam("a", 16)},
		job("big", "a", 50, 3, 3, false), job("small", "a", 50, 1, 1, false))
	e.st.Jobs[1].SubmitTime = t0.Add(time.Second)
	d := e.cycle()
	if size(d, "small") != 1 {
		t.Fatalf("best effort: small should run")
	}
	e.st.Allocations = nil
	e.st.Config.Queueing = StrictFIFO
	d = e.cycle()
	r := wantKind(t, d, "small", KindPending, CodeStrictFIFO)
	if !strings.Contains(r.Message, "big") {
		t.Fatalf("message %q", r.Message)
	}
}

func TestSuspendReleases(t *testing.T) {
	e := newEnv(t, mkNodes("n", 2, 8), []Team{mkTeam("a", 16)}, job("a1", "a", 50, 2, 2, false))
	e.cycle()
	e.st.Jobs[0].Suspended = true
	d := e.cycle()
	r := wantKind(t, d, "a1", KindSuspended, CodeSuspended)
	if size(d, "a1") != 0 || r.FromSize != 2 || !strings.Contains(r.Message, "released 2 nodes") {
		t.Fatalf("reason %+v", r)
	}
}

func TestSpecChangeShrinks(t *testing.T) {
	e := newEnv(t, mkNodes("n", 4, 8), []Team{mkTeam("a", 32)}, job("a1", "a", 50, 1, 4, true))
	e.cycle()
	e.st.Jobs[0].MaxNodes = 2
	d := e.cycle()
	wantKind(t, d, "a1", KindShrunk, CodeSpecChanged)
	e.st.Jobs[0].MinNodes, e.st.Jobs[0].MaxNodes = 3, 3
	e.st.Jobs[0].Elastic = false
	d = e.cycle()
	wantKind(t, d, "a1", KindPreempted, CodeSpecChanged)
	d = e.cycle()
	wantKind(t, d, "a1", KindAdmitted, "")
}

func TestDeletedJobIsReleased(t *testing.T) {
	e := newEnv(t, mkNodes("n", 2, 8), []Team{mkTeam("a", 16)}, job("a1", "a", 50, 1, 1, false))
	e.cycle()
	e.remove("a1")
	d := e.cycle()
	if len(d.Released) != 1 || d.Released[0] != "a1" || len(d.Allocations) != 0 {
		t.Fatalf("%+v", d)
	}
}

func TestPriorityClasses(t *testing.T) {
	hi := job("hi", "a", 0, 1, 1, false)
	hi.Priority, hi.PriorityClass = nil, "high"
	lo := job("lo", "a", 0, 1, 1, false)
	lo.Priority, lo.PriorityClass = nil, "low"
	lo.SubmitTime = t0.Add(-time.Hour)
	e := newEnv(t, mkNodes("n", 1, 8), []Team{mkTeam("a", 8)}, lo, hi)
	d := e.cycle()
	if size(d, "hi") != 1 || size(d, "lo") != 0 {
		t.Fatalf("hi %d lo %d", size(d, "hi"), size(d, "lo"))
	}
	bad := job("bad", "a", 0, 1, 1, false)
	bad.Priority, bad.PriorityClass = nil, "urgent"
	e.add(bad)
	d = e.cycle()
	r := wantKind(t, d, "bad", KindInvalid, CodeInvalidSpec)
	if !strings.Contains(r.Message, "priorityClass") || !strings.Contains(r.Message, "critical, high, low, lowest, normal") {
		t.Fatalf("message %q", r.Message)
	}
}

func TestUnknownTeamAndFlavor(t *testing.T) {
	j := job("x", "ghost", 50, 1, 1, false)
	k := job("y", "a", 50, 1, 1, false)
	k.Flavor = "trainium2"
	e := newEnv(t, mkNodes("n", 1, 8), []Team{mkTeam("a", 8)}, j, k)
	d := e.cycle()
	wantKind(t, d, "x", KindPending, CodeTeamNotFound)
	r := wantKind(t, d, "y", KindPending, CodeNoFlavor)
	if !strings.Contains(r.Message, "trainium2") {
		t.Fatalf("message %q", r.Message)
	}
}

func TestMultipleFlavorsAreIndependent(t *testing.T) {
	nodes := mkNodes("g", 2, 8)
	for i := 0; i < 2; i++ {
		nodes = append(nodes, Node{Name: "trn-" + string(rune('a'+i)), Flavor: "trainium2", Accelerators: 16})
	}
	a := Team{Name: "a", Quotas: []FlavorQuota{{Flavor: h100, Nominal: 16}, {Flavor: "trainium2", Nominal: 32}}}
	tj := Job{Name: "t1", Team: "a", Flavor: "trainium2", PerNode: Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 2, Elastic: true}
	gj := job("g1", "a", 50, 1, 2, true)
	gj.Flavor = h100
	e := newEnv(t, nodes, []Team{a}, tj, gj)
	d := e.cycle()
	at, _ := d.Allocation("t1")
	if at.Size != 2 || !strings.HasPrefix(at.Nodes[0], "trn-") || size(d, "g1") != 2 {
		t.Fatalf("t1 %+v g1 %d", at, size(d, "g1"))
	}
}

// Rule 3b: guaranteed demand blocked only by fragmentation moves
// single-node jobs (never ones resized or moved within the stable period).
func TestDefragmentForGuaranteedQuota(t *testing.T) {
	for _, c := range []struct {
		name    string
		age     time.Duration
		disable bool
		moved   bool
	}{{"moves", time.Hour, false, true}, {"stable period protects", 10 * time.Second, false, false}, {"disabled", time.Hour, true, false}} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, mkNodes("n", 2, 8), []Team{mkTeam("a", 8), mkTeam("b", 4), mkTeam("c", 4)},
				frac("b-f", "b", 50, 4), frac("c-f", "c", 50, 4))
			e.st.Config.DisableMoves = c.disable
			// Both were moved or resized c.age ago (admitted long before).
			since, last := t0.Add(-2*time.Hour), t0.Add(-c.age)
			e.st.Allocations = []Allocation{
				{Job: "b-f", Size: 1, Nodes: []string{"n-000"}, Since: since, LastResize: last},
				{Job: "c-f", Size: 1, Nodes: []string{"n-001"}, Since: since, LastResize: last},
			}
			e.add(frac("a-big", "a", 10, 8))
			d := e.cycle()
			if !c.moved {
				wantKind(t, d, "a-big", KindPending, CodeNoCapacity)
				return
			}
			wantKind(t, d, "a-big", KindAdmitted, CodeReclaim)
			r := wantKind(t, d, "b-f", KindMoved, CodeDefragment)
			if r.For[0] != "a-big" || !strings.Contains(r.Message, "moved from node n-000 to n-001") {
				t.Fatalf("reason %+v", r)
			}
			wantKind(t, d, "c-f", KindRunning, "")
		})
	}
}

// A whole-node job first takes only victims whose preemption frees a whole
// node: here the lowest-priority borrower shares its node, so the next one
// (alone on its node) goes instead, and the sharing one is spared.
func TestReclaimWholeNodeJobsTakeVictimsThatFreeNodes(t *testing.T) {
	e := newEnv(t, mkNodes("n", 3, 8), []Team{mkTeam("a", 4), mkTeam("b", 16), mkTeam("c", 4)},
		frac("a-shared", "a", 5, 4), frac("c-shared", "c", 50, 4), frac("a-alone", "a", 20, 8), frac("a-alone2", "a", 30, 8))
	d := e.cycle()
	sa, _ := d.Allocation("a-shared")
	sc, _ := d.Allocation("c-shared")
	if sa.Nodes[0] != sc.Nodes[0] || size(d, "a-alone") != 1 || size(d, "a-alone2") != 1 {
		t.Fatalf("setup: %+v", d.Allocations)
	}
	// a uses 20 of nominal 4. b needs one whole node.
	e.add(job("b1", "b", 50, 1, 2, true))
	d = e.cycle()
	wantKind(t, d, "b1", KindAdmitted, CodeReclaim)
	wantKind(t, d, "a-alone", KindPreempted, CodeReclaim)
	wantKind(t, d, "a-shared", KindRunning, "")
	wantKind(t, d, "a-alone2", KindRunning, "")
}

// The demo, at engine level: a low-priority elastic job grows into idle
// nodes, a high-priority job of the other team takes its quota back by
// shrinking it, and it grows back (after the stable period) when the
// capacity frees.
func TestDemoScenarioSizesOverTime(t *testing.T) {
	e := newEnv(t, mkNodes("node", 4, 8), []Team{mkTeam("team-a", 16), mkTeam("team-b", 16)},
		job("elastic-low", "team-a", 10, 1, 4, true))
	var got []int
	for c := 0; c < 30; c++ {
		switch c {
		case 3:
			e.add(job("urgent-high", "team-b", 90, 2, 2, false))
		case 12:
			e.remove("urgent-high")
		}
		d := e.cycle()
		got = append(got, size(d, "elastic-low"))
		if c == 3 {
			r := wantKind(t, d, "elastic-low", KindShrunk, CodeReclaim)
			if r.For[0] != "urgent-high" || r.ForTeam != "team-b" {
				t.Fatalf("reason %+v", r)
			}
		}
	}
	// 10 s cycles: shrunk at cycle 3 (30 s), b leaves at cycle 12 (120 s),
	// growth allowed 60 s after the shrink (cycle 9), so it grows at 12.
	want := []int{4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("sizes %v, want %v", got, want)
		}
	}
}

// No pair of jobs preempts each other back and forth: b1 took a1's
// capacity, so when a1 later reclaims from team b it takes b2 (higher
// priority) rather than b1.
func TestNoPairPreemptsBackAndForth(t *testing.T) {
	e := newEnv(t, mkNodes("n", 2, 8), []Team{mkTeam("a", 8), mkTeam("b", 8)}, job("a1", "a", 50, 2, 2, false))
	e.cycle()
	e.add(job("b1", "b", 10, 1, 1, false))
	d := e.cycle()
	wantKind(t, d, "a1", KindPreempted, CodeReclaim)
	if a, _ := d.Allocation("b1"); len(a.TookFrom) != 1 || a.TookFrom[0] != "a1" {
		t.Fatalf("b1 allocation %+v", a)
	}
	e.add(job("b2", "b", 90, 1, 1, false))
	d = e.cycle()
	wantKind(t, d, "b2", KindAdmitted, CodeBorrowing)
	for i := range e.st.Jobs {
		if e.st.Jobs[i].Name == "a1" {
			e.st.Jobs[i].MinNodes, e.st.Jobs[i].MaxNodes = 1, 1
		}
	}
	d = e.cycle()
	wantKind(t, d, "a1", KindAdmitted, CodeReclaim)
	wantKind(t, d, "b2", KindPreempted, CodeReclaim)
	wantKind(t, d, "b1", KindRunning, "")
}

package policy

import (
	"fmt"
	"testing"
)

// Issue 15's thrash: a priority-99 one-GPU job of a team far over its
// nominal quota (borrowing idle quota of another team) on a full fleet used
// to preempt most of the team's own jobs (every one needed to bring the team
// back within nominal), and the next cycle re-admitted them by borrowing,
// with hundreds of pending reasons flipping. Priority preemption takes only
// what the preemptor needs: one GPU, one victim; and nothing it preempted
// comes back while the preemptor holds the capacity.
func TestPriorityPreemptionTakesOnlyWhatItNeedsAndDoesNotThrash(t *testing.T) {
	a := mkTeam("a", 8)
	a.Preemption = PreemptLowerPriority
	teams := []Team{a, mkTeam("b", 40)}
	var jobs []Job
	for i := range 48 {
		jobs = append(jobs, frac(fmt.Sprintf("a-%02d", i), "a", 10, 1))
	}
	e := newEnv(t, mkNodes("n", 6, 8), teams, jobs...)
	d := e.cycle()
	if len(d.Allocations) != 48 {
		t.Fatalf("setup: %d jobs running, want all 48 (8 within a's nominal, 40 borrowed from b)", len(d.Allocations))
	}
	e.add(frac("urgent", "a", 99, 1))
	d = e.cycle()
	wantKind(t, d, "urgent", KindAdmitted, CodePriorityPreemption)
	var preempted []string
	for _, r := range d.Reasons {
		if r.Kind == KindPreempted {
			preempted = append(preempted, r.Job)
		}
	}
	if len(preempted) != 1 {
		t.Fatalf("a one-GPU job preempted %d jobs (%v), want exactly one", len(preempted), preempted)
	}
	// The following cycles are stable: the victim waits, nobody flips.
	prev := map[string]Reason{}
	for _, r := range d.Reasons {
		prev[r.Job] = r
	}
	for c := range 3 {
		d = e.cycle()
		if size(d, preempted[0]) != 0 {
			t.Fatalf("cycle %d: the victim %s was re-admitted while urgent holds its GPU", c+1, preempted[0])
		}
		if size(d, "urgent") != 1 {
			t.Fatalf("cycle %d: urgent lost its GPU", c+1)
		}
		for _, r := range d.Reasons {
			if p, ok := prev[r.Job]; ok && c > 0 && (p.Kind != r.Kind || p.Code != r.Code) {
				t.Errorf("cycle %d: %s flipped from %s/%s to %s/%s", c+1, r.Job, p.Kind, p.Code, r.Kind, r.Code)
			}
			prev[r.Job] = r
		}
	}
}

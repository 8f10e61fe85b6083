package policy

import (
	"fmt"
	"testing"
	"time"
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

// The same scenario at fleet scale, as the issue measured it: on a full
// fleet of random jobs (bigState: Helios-like shapes, every team preempts
// lower priorities), a priority-99 one-GPU job goes to the team that
// borrows most, at its borrowing limit. It preempts at most the one GPU it needs (one victim), no
// victim is re-admitted in the next cycles while the preemptor runs, and
// the pending jobs' reasons do not flip between cycles.
func TestPriorityPreemptionAtFleetScaleDoesNotThrash(t *testing.T) {
	st := bigState(300, 900, 10, 15)
	// Teams 3, 6 and 9 are idle: team 0, in their cohort, borrows.
	jobs := st.Jobs[:0]
	for _, j := range st.Jobs {
		if j.Team != "team-003" && j.Team != "team-006" && j.Team != "team-009" {
			jobs = append(jobs, j)
		}
	}
	st.Jobs = jobs
	e := &env{t: t, st: st, tick: 10 * time.Second}
	var d Decision
	for range 4 { // settle
		d = e.cycle()
	}
	team, most := "", -1
	for _, u := range d.Teams {
		if u.Borrowed > most {
			team, most = u.Team, u.Borrowed
		}
	}
	if most <= 0 {
		t.Fatalf("setup: no team borrows; usage %+v", d.Teams)
	}
	// The team is at its borrowing limit: the urgent job can only take
	// from the team's own lower-priority jobs.
	for i := range e.st.Teams {
		if e.st.Teams[i].Name == team {
			e.st.Teams[i].Quotas[0].BorrowingLimit = ip(most)
		}
	}
	e.add(frac("urgent", team, 99, 1))
	d = e.cycle()
	if size(d, "urgent") != 1 {
		t.Fatalf("urgent (team %s, borrowing %d) was not admitted: %+v", team, most, reasonOf(t, d, "urgent"))
	}
	var victims []string
	for _, r := range d.Reasons {
		if r.Kind == KindPreempted || (r.Kind == KindShrunk && slicesContains(r.For, "urgent")) {
			victims = append(victims, r.Job)
		}
	}
	t.Logf("team %s borrows %d accelerators; urgent: %s/%s; it took from %v", team, most, reasonOf(t, d, "urgent").Kind, reasonOf(t, d, "urgent").Code, victims)
	if len(victims) > 1 {
		t.Fatalf("a one-GPU job took capacity from %d jobs (%v), want at most one", len(victims), victims)
	}
	prev := map[string]Reason{}
	for _, r := range d.Reasons {
		prev[r.Job] = r
	}
	for c := range 3 {
		d = e.cycle()
		if size(d, "urgent") != 1 {
			t.Fatalf("cycle %d: urgent lost its GPU", c+1)
		}
		for _, v := range victims {
			if size(d, v) != 0 && reasonOf(t, d, v).Code == CodeBorrowing {
				t.Fatalf("cycle %d: the victim %s was re-admitted by borrowing while urgent holds its GPU", c+1, v)
			}
		}
		flips := 0
		for _, r := range d.Reasons {
			if p, ok := prev[r.Job]; ok && c > 0 && p.Kind == KindPending && r.Kind == KindPending && p.Code != r.Code {
				flips++
			}
			prev[r.Job] = r
		}
		if flips > 0 {
			t.Errorf("cycle %d: %d pending jobs flipped their reason", c+1, flips)
		}
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

package policy

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestSortVictimsKeepsTheVictimOrders: the borrower and own-team victim
// lists are sorted on keys held in the list (sortVictims), and must come
// out exactly as shrinkOrder and preemptOrder order them: ties of
// priority and time broken by name, zero times (an allocation written
// without them) and times within one second included.
func TestSortVictimsKeepsTheVictimOrders(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var keys []victimKey
	for round := 0; round < 200; round++ {
		var list []*jobRT
		for i := 0; i < 1+rng.IntN(60); i++ {
			j := &jobRT{name: fmt.Sprintf("job-%03d", rng.IntN(1000)+i*1000), sp: spec{prio: rng.IntN(3) * 10}}
			times := []time.Time{{}, t0, t0.Add(time.Duration(rng.IntN(3)) * time.Nanosecond), t0.Add(-time.Duration(rng.IntN(3)) * time.Second)}
			j.since, j.lastResize = times[rng.IntN(len(times))], times[rng.IntN(len(times))]
			list = append(list, j)
		}
		for _, byResize := range []bool{false, true} {
			want := slices.Clone(list)
			order := preemptOrder
			if byResize {
				order = shrinkOrder
			}
			slices.SortFunc(want, order)
			got := slices.Clone(list)
			keys = sortVictims(got, byResize, keys)
			if !slices.Equal(got, want) {
				t.Fatalf("round %d (by resize %v): sortVictims differs from the comparison order", round, byResize)
			}
		}
	}
}

// A job FollowUp requeues is listed once in its queues, though the kept
// queues still list it from when a fast path decision admitted it there:
// listed twice, rule 5 admitted it twice (two allocations of one job, a
// transaction with a duplicate key at 20,000 nodes with elastic submits).
func TestEnqueueListsAJobOnce(t *testing.T) {
	fl, tf := &flavorRT{}, &teamFlavor{}
	mk := func(name string, prio int) *jobRT {
		return &jobRT{name: name, sp: spec{prio: prio}, spec: &Job{Name: name, SubmitTime: t0}, fl: fl, tf: tf}
	}
	a, b, c := mk("a", 5), mk("b", 0), mk("c", 0)
	for _, j := range []*jobRT{b, a, c, b} {
		enqueue(j)
	}
	for what, q := range map[string][]*jobRT{"flavor's pending": fl.pending, "team's queue": tf.queue} {
		if !slices.Equal(q, []*jobRT{a, b, c}) {
			var names []string
			for _, j := range q {
				names = append(names, j.name)
			}
			t.Errorf("%s: %v, want [a b c] (priority first, then name; each once)", what, names)
		}
	}
}

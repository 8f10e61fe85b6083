package sim

import (
	"testing"
)

// The oracle is a bound: on traces at several loads and elastic fractions,
// no policy (the engine or a baseline) completes its jobs sooner on
// average or at any percentile, finishes the trace sooner, or does more
// productive work in the window or the busy period.
func TestNoPolicyBeatsTheBound(t *testing.T) {
	teams := []TeamLoad{{Name: "a", Share: 1}, {Name: "b", Share: 1}}
	for _, tc := range []struct {
		load, elastic float64
		seed          uint64
	}{{0.7, 0.5, 1}, {1.2, 1, 2}, {1.0, 0, 3}} {
		trace := Generate(GenOptions{Seed: tc.seed, Jobs: 300, Capacity: 32, Load: tc.load, ElasticFraction: tc.elastic, Teams: teams})
		o := Options{Teams: twoTeams(), RestartDelay: 1.74, ResizeDelay: 0.14, CheckpointInterval: 600}
		reps, err := Compare(trace, Modes, o)
		if err != nil {
			t.Fatal(err)
		}
		b := reps[len(reps)-1]
		if b.Policy != "oracle" || b.MeanJCT <= 0 || b.Makespan <= 0 {
			t.Fatalf("bound %+v", b)
		}
		for _, r := range reps[:len(reps)-1] {
			if r.Completed+r.Rejected != r.Jobs {
				t.Errorf("load %v %s: %d of %d completed, %d rejected", tc.load, r.Policy, r.Completed, r.Jobs, r.Rejected)
			}
			if r.Rejected != b.Rejected {
				continue // FIFO rejects more: its JCT figures are over fewer jobs
			}
			const eps = 1e-6
			for _, c := range []struct {
				what       string
				got, bound float64
				atLeast    bool
			}{
				{"mean JCT", r.MeanJCT, b.MeanJCT, true},
				{"p50 JCT", r.JCTP50, b.JCTP50, true},
				{"p95 JCT", r.JCTP95, b.JCTP95, true},
				{"p99 JCT", r.JCTP99, b.JCTP99, true},
				{"makespan", r.Makespan, b.Makespan, true},
				{"utilization", r.Utilization, b.Utilization, false},
				{"busy utilization", r.BusyUtilization, b.BusyUtilization, false},
			} {
				if (c.atLeast && c.got < c.bound*(1-eps)) || (!c.atLeast && c.got > c.bound*(1+eps)) {
					t.Errorf("load %v elastic %v: %s %s %.3f beats the bound %.3f", tc.load, tc.elastic, r.Policy, c.what, c.got, c.bound)
				}
			}
			t.Logf("load %v elastic %v: %-16s meanJCT %8.0f (bound %8.0f) util %5.1f (bound %5.1f) rejected %d", tc.load, tc.elastic, r.Policy, r.MeanJCT, b.MeanJCT, r.Utilization, b.Utilization, r.Rejected)
		}
	}
}

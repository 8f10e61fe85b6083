package sim

import (
	"math"
	"strings"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// The series follow the lend-reclaim-grow-back story: a uses the whole
// fleet, b reclaims (one reclaim mark), a grows back; the HTML draws it.
func TestRunSeriesAndHTML(t *testing.T) {
	trace := []TraceJob{
		{Name: "a-el", Team: "a", Submit: 0, GPUsPerNode: 8, Nodes: 2, MinNodes: 1, MaxNodes: 4, Elastic: true, Work: 32 * 1000},
		{Name: "b-1", Team: "b", Submit: 100, GPUsPerNode: 8, Nodes: 2, Work: 16 * 200},
	}
	rep, err := RunSeries(trace, Options{Teams: twoTeams(), Config: policy.Config{MinStablePeriod: -1}})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Series
	if s == nil || len(s.T) < 3 || len(s.Used) != len(s.T) || len(s.Queue) != len(s.T) || len(s.Utilization) != len(s.T) || len(s.Teams) != 2 {
		t.Fatalf("series: %+v", s)
	}
	for _, ts := range s.Teams {
		if len(ts.Used) != len(s.T) || ts.Nominal != 16 {
			t.Fatalf("team series %+v", ts)
		}
	}
	if s.Used[0] != 32 || s.Utilization[0] != 100 || s.Teams[0].Used[0] != 32 {
		t.Errorf("at t=0 a should hold the whole fleet: used %d (%v%%), a %d", s.Used[0], s.Utilization[0], s.Teams[0].Used[0])
	}
	if len(s.Reclaims) != 1 || s.Reclaims[0].T != 100 {
		t.Errorf("reclaims: %+v, want one at 100 s", s.Reclaims)
	}
	var b strings.Builder
	if err := WriteHTML(&b, "test <run>", []*Report{rep}); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if strings.Count(page, "<svg") != 3 || !strings.Contains(page, `class="reclaim"`) || !strings.Contains(page, "test &lt;run&gt;") || strings.Contains(page, "<script") {
		t.Errorf("html:\n%s", page)
	}
}

func TestSeriesThin(t *testing.T) {
	s := &Series{Teams: []TeamSeries{{Team: "a"}}}
	for i := range 5000 {
		s.T = append(s.T, float64(i))
		s.Used = append(s.Used, i)
		s.Queue = append(s.Queue, i)
		s.Teams[0].Used = append(s.Teams[0].Used, i)
	}
	s.thin(1000)
	// The first and the last sample stay: the last is the end of the run.
	if len(s.T) != 1000 || len(s.Teams[0].Used) != 1000 || s.T[0] != 0 || s.T[999] != 4999 || s.Teams[0].Used[999] != 4999 {
		t.Errorf("thinned to %d samples, last %v", len(s.T), s.T[len(s.T)-1])
	}
}

// Issue 28: every policy's charts end where its run ends. On a run long
// enough to be thinned (more cycles than maxSamples) whose first
// submission is not at 0, each series' last sample is at the report's
// makespan (both from the first submission), with every job done, and the
// HTML report's x axis reaches the makespan.
func TestSeriesEndAtMakespan(t *testing.T) {
	trace := Generate(GenOptions{Seed: 1, Jobs: 1200, Capacity: 32, Load: 1, ElasticFraction: 0.5,
		Teams: []TeamLoad{{Name: "a", Share: 1}, {Name: "b", Share: 1}}})
	if trace[0].Submit <= 0 {
		t.Fatalf("the trace should start after 0 s, first submission at %v", trace[0].Submit)
	}
	modes := []Mode{ModeFIFO, ModeKueue, ModeBatch, ModeEngine}
	instants := map[string]int{} // distinct cycle times per policy: the samples before thinning
	var mode string
	last := math.Inf(-1)
	count := func(tm float64, _ *policy.Decision) {
		if tm != last {
			instants[mode]++
		}
		last = tm
	}
	var reps []*Report
	for _, m := range modes {
		mode, last = string(m), math.Inf(-1)
		r, err := Compare(trace, []Mode{m}, Options{Teams: twoTeams(), OnCycle: count})
		if err != nil {
			t.Fatal(err)
		}
		reps = append(reps, r...)
	}
	for _, r := range reps {
		s := r.Series
		if s == nil || len(s.T) == 0 {
			t.Fatalf("%s: no series", r.Policy)
		}
		if r.Completed != r.Jobs-r.Rejected {
			t.Errorf("%s: %d of %d jobs completed (%d rejected)", r.Policy, r.Completed, r.Jobs, r.Rejected)
		}
		if instants[r.Policy] <= maxSamples {
			t.Errorf("%s: %d samples: the series is not thinned, the trace is too short for this test", r.Policy, instants[r.Policy])
		}
		if len(s.T) > maxSamples || len(s.Used) != len(s.T) || len(s.Queue) != len(s.T) || len(s.Teams[0].Used) != len(s.T) {
			t.Errorf("%s: %d samples (%d used, %d queue), want at most %d", r.Policy, len(s.T), len(s.Used), len(s.Queue), maxSamples)
		}
		if end := s.T[len(s.T)-1]; math.Abs(end-r.Makespan) > 1e-6 {
			t.Errorf("%s: the series ends at %s, the makespan is %s", r.Policy, dur(end), dur(r.Makespan))
		}
		if s.T[0] != 0 || s.Queue[len(s.Queue)-1] != 0 || s.Used[len(s.Used)-1] != 0 {
			t.Errorf("%s: first sample at %v, last queue %d and used %d: want from 0 s to an empty fleet",
				r.Policy, s.T[0], s.Queue[len(s.Queue)-1], s.Used[len(s.Used)-1])
		}
		var page strings.Builder
		if err := WriteHTML(&page, "issue 28", []*Report{r}); err != nil {
			t.Fatal(err)
		}
		if tick := `class="tick" text-anchor="middle">` + dur(r.Makespan) + "<"; !strings.Contains(page.String(), tick) {
			t.Errorf("%s: the charts' x axis does not end at the makespan %s", r.Policy, dur(r.Makespan))
		}
	}
}

package sim

import (
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
	if len(s.T) != 1000 || len(s.Teams[0].Used) != 1000 || s.T[0] != 0 || s.T[999] != 4995 {
		t.Errorf("thinned to %d samples, last %v", len(s.T), s.T[len(s.T)-1])
	}
}

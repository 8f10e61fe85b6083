package main

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/idlegc"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

func decisionWith(teams ...api.TeamUsage) coordinator.CycleStats {
	d := policy.Decision{Teams: teams}
	for _, u := range teams {
		for i := 0; i < u.Pending; i++ {
			d.Reasons = append(d.Reasons, policy.Reason{Job: u.Team + "-p", Team: u.Team, Kind: policy.KindPending})
		}
	}
	return coordinator.CycleStats{Duration: 3 * time.Millisecond, Decision: d, Ops: 4,
		Changed: map[policy.ReasonKind]int{policy.KindAdmitted: 2}, Waited: []time.Duration{time.Second}}
}

// A team's series show its quota and usage, and go when the team does.
func TestTeamSeriesFollowTheTeams(t *testing.T) {
	m := newMetrics()
	m.cycle(decisionWith(
		api.TeamUsage{Team: "a", Cohort: "c", Flavor: "h100", Nominal: 16, Used: 24, Borrowed: 8, Pending: 1, PendingAccelerators: 8},
		api.TeamUsage{Team: "b", Cohort: "c", Flavor: "h100", Nominal: 16, Used: 4},
	))
	if got := value(t, m.lent.WithLabelValues("b", "h100")); got != 8 {
		t.Errorf("team b lends %v, want 8 (team a borrows 8 of b's 12 unused)", got)
	}
	if got := value(t, m.borrowed.WithLabelValues("a", "h100")); got != 8 {
		t.Errorf("team a borrows %v, want 8", got)
	}
	if got := value(t, m.queue.WithLabelValues("a")); got != 1 {
		t.Errorf("team a's queue %v, want 1", got)
	}
	if n := count(m.nominal); n != 2 {
		t.Fatalf("%d nominal series, want 2", n)
	}
	// Team b is deleted: its series go.
	m.cycle(decisionWith(api.TeamUsage{Team: "a", Cohort: "c", Flavor: "h100", Nominal: 16, Used: 16}))
	for _, v := range []struct {
		name string
		n    int
	}{
		{"nominal", count(m.nominal)}, {"used", count(m.used)},
		{"borrowed", count(m.borrowed)}, {"lent", count(m.lent)},
		{"pending accelerators", count(m.pendingAccel)}, {"queue", count(m.queue)},
	} {
		if v.n != 1 {
			t.Errorf("%d %s series after team b was deleted, want 1 (team a's)", v.n, v.name)
		}
	}
	if got := value(t, m.decisions.WithLabelValues("Admitted")); got != 4 {
		t.Errorf("admitted decisions %v, want 4 over two cycles", got)
	}
}

// The Grafana dashboard parses and charts only metrics the coordinator
// exports (plus the Go and process collectors' series).
func TestGrafanaDashboardNamesExportedMetrics(t *testing.T) {
	b, err := os.ReadFile("../../examples/grafana/coordinator-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if dash.Title == "" || len(dash.Panels) < 8 {
		t.Fatalf("dashboard %q has %d panels", dash.Title, len(dash.Panels))
	}
	m := newMetrics()
	m.cycle(decisionWith(api.TeamUsage{Team: "a", Flavor: "h100", Nominal: 8, Used: 8, Pending: 1}))
	m.etcdError("write")
	m.setLeader(true)
	exported := m.names()
	metricName := regexp.MustCompile(`\b(hyperpod_coordinator_[a-z_]+|process_[a-z_]+|go_[a-z_]+)\b`)
	charted := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, name := range metricName.FindAllString(tg.Expr, -1) {
				base := name
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if s, ok := strings.CutSuffix(name, suf); ok && slices.Contains(exported, s) {
						base = s
					}
				}
				if !slices.Contains(exported, base) {
					t.Errorf("panel %q charts %s, which the coordinator does not export", p.Title, name)
				}
				charted[base] = true
			}
		}
	}
	for _, want := range []string{"hyperpod_coordinator_team_nominal_accelerators", "hyperpod_coordinator_team_borrowed_accelerators",
		"hyperpod_coordinator_team_lent_accelerators", "hyperpod_coordinator_team_pending_accelerators", "hyperpod_coordinator_queue_length",
		"hyperpod_coordinator_pending_seconds", "hyperpod_coordinator_cycle_seconds", "hyperpod_coordinator_decisions_total",
		"hyperpod_coordinator_leader", "hyperpod_coordinator_etcd_errors_total", "process_cpu_seconds_total", "go_goroutines"} {
		if !slices.Contains(exported, want) {
			t.Errorf("the coordinator does not export %s", want)
		}
		if !charted[want] {
			t.Errorf("the dashboard does not chart %s", want)
		}
	}
}

// The next wake is the time of the cycle that comes without an input
// change, or 0 when none is due before the resync; the memory returns are
// counted with their CPU.
func TestNextWakeAndMemoryReturns(t *testing.T) {
	m := newMetrics()
	s := decisionWith()
	s.NextWake = time.Unix(1_800_000_000, 500_000_000)
	m.cycle(s)
	if got := value(t, m.nextWake); got != 1_800_000_000.5 {
		t.Errorf("next wake %v, want 1800000000.5 (the cycle's NextWake)", got)
	}
	m.cycle(decisionWith())
	if got := value(t, m.nextWake); got != 0 {
		t.Errorf("next wake %v after a cycle with none due, want 0", got)
	}
	m.cycle(s)
	m.setLeader(false)
	if got := value(t, m.nextWake); got != 0 {
		t.Errorf("next wake %v after leadership was lost, want 0 (a follower runs no cycle)", got)
	}
	m.countReturns(func() idlegc.Returned { return idlegc.Returned{Count: 2, CPU: 750 * time.Millisecond} })
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "hyperpod_coordinator_memory_returns_total" || mf.GetName() == "hyperpod_coordinator_memory_return_cpu_seconds_total" {
			got[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if got["hyperpod_coordinator_memory_returns_total"] != 2 || got["hyperpod_coordinator_memory_return_cpu_seconds_total"] != 0.75 {
		t.Errorf("memory return series %v, want 2 returns and 0.75 s of CPU", got)
	}
}

// value reads one gauge or counter.
func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Gauge != nil {
		return m.Gauge.GetValue()
	}
	return m.Counter.GetValue()
}

// count is how many series a collector has.
func count(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 1000)
	c.Collect(ch)
	close(ch)
	return len(ch)
}

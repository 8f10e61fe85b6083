package main

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/idlegc"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// metrics are the coordinator's Prometheus series (examples/grafana has a
// dashboard of them).
type metrics struct {
	reg                                *prometheus.Registry
	cycles                             prometheus.Counter
	running, pending, leader           prometheus.Gauge
	used, nominal, borrowed, lent      *prometheus.GaugeVec
	pendingAccel, queue                *prometheus.GaugeVec
	pendingTime, cycleTime, engineTime prometheus.Histogram
	decisions, etcdErrors              *prometheus.CounterVec
	writes                             prometheus.Counter
	nextWake                           prometheus.Gauge
	teams                              map[[2]string]bool // the (team, flavor) series set last cycle
	queueTeams                         map[string]bool
}

func newMetrics() *metrics {
	tf := []string{"team", "flavor"}
	m := &metrics{
		reg:     prometheus.NewRegistry(),
		cycles:  prometheus.NewCounter(prometheus.CounterOpts{Name: "hyperpod_coordinator_cycles_total", Help: "Scheduling cycles run."}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hyperpod_coordinator_running_jobs", Help: "Jobs holding an allocation."}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hyperpod_coordinator_pending_jobs", Help: "Jobs waiting for capacity."}),
		leader:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "hyperpod_coordinator_leader", Help: "1 while this coordinator is the elected leader."}),
		used:    prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hyperpod_coordinator_team_used_accelerators", Help: "Accelerators held by a team's jobs."}, tf),
		nominal: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hyperpod_coordinator_team_nominal_accelerators", Help: "A team's nominal quota."}, tf),
		borrowed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hyperpod_coordinator_team_borrowed_accelerators",
			Help: "Accelerators a team's jobs hold above its nominal quota."}, tf),
		lent: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hyperpod_coordinator_team_lent_accelerators",
			Help: "A team's unused nominal quota in use by borrowers of its cohort (the cohort's borrowing shared in proportion to the unused quotas)."}, tf),
		pendingAccel: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hyperpod_coordinator_team_pending_accelerators",
			Help: "Accelerators a team's pending jobs need at their minimum size."}, tf),
		queue: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hyperpod_coordinator_queue_length", Help: "Pending jobs of a team."}, []string{"team"}),
		pendingTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hyperpod_coordinator_pending_seconds",
			Help: "How long admitted jobs were pending.", Buckets: prometheus.ExponentialBuckets(0.1, 4, 10)}),
		cycleTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hyperpod_coordinator_cycle_seconds",
			Help: "Scheduling cycle latency: engine, diff and etcd writes.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		engineTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hyperpod_coordinator_engine_seconds",
			Help: "The policy engine's part of a cycle (policy.Schedule).", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hyperpod_coordinator_decisions_total",
			Help: "Jobs whose desired record a cycle changed, by the kind of decision."}, []string{"kind"}),
		etcdErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hyperpod_coordinator_etcd_errors_total",
			Help: "Failed etcd operations by kind (read, write, watch, compact, session)."}, []string{"op"}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{Name: "hyperpod_coordinator_etcd_writes_total",
			Help: "etcd operations (puts and deletes) the cycles wrote."}),
		nextWake: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hyperpod_coordinator_next_wake_timestamp_seconds",
			Help: "When the coordinator runs its next cycle if no input changes first (a stable period's end, a retry), in Unix seconds; 0: not before the resync."}),
		teams:      map[[2]string]bool{},
		queueTeams: map[string]bool{},
	}
	m.reg.MustRegister(m.cycles, m.running, m.pending, m.leader, m.used, m.nominal, m.borrowed, m.lent, m.pendingAccel, m.queue,
		m.pendingTime, m.cycleTime, m.engineTime, m.decisions, m.etcdErrors, m.writes, m.nextWake,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// setLeader is Config.OnLeader.
func (m *metrics) setLeader(on bool) {
	if on {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
		m.nextWake.Set(0) // a follower runs no cycle
	}
}

// etcdError is Config.OnEtcdError.
func (m *metrics) etcdError(op string) { m.etcdErrors.WithLabelValues(op).Inc() }

// countReturns exports the idle coordinator's returns of memory to the
// operating system (coordinator.MemoryReturns) and their CPU.
func (m *metrics) countReturns(returned func() idlegc.Returned) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "hyperpod_coordinator_memory_returns_total",
		Help: "Times the idle coordinator returned its heap's free memory to the operating system (--idle-return-after)."},
		func() float64 { return float64(returned().Count) }))
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "hyperpod_coordinator_memory_return_cpu_seconds_total",
		Help: "The process's CPU time during those returns (their full collections and the release of the pages)."},
		func() float64 { return returned().CPU.Seconds() }))
}

// cycle is Config.OnCycle.
func (m *metrics) cycle(s coordinator.CycleStats) {
	d := s.Decision
	m.cycles.Inc()
	m.cycleTime.Observe(s.Duration.Seconds())
	m.engineTime.Observe(s.Engine.Seconds())
	m.writes.Add(float64(s.Ops))
	if s.NextWake.IsZero() {
		m.nextWake.Set(0)
	} else {
		m.nextWake.Set(float64(s.NextWake.UnixNano()) / 1e9)
	}
	for kind, n := range s.Changed {
		m.decisions.WithLabelValues(string(kind)).Add(float64(n))
	}
	for _, w := range s.Waited {
		m.pendingTime.Observe(w.Seconds())
	}
	m.running.Set(float64(len(d.Allocations)))
	queue := map[string]int{}
	n := 0
	for _, r := range d.Reasons {
		if r.Kind == policy.KindPending {
			n++
			queue[r.Team]++
		}
	}
	m.pending.Set(float64(n))
	seen := map[[2]string]bool{}
	lent := lentBy(d.Teams)
	for i, u := range d.Teams {
		k := [2]string{u.Team, u.Flavor}
		seen[k] = true
		m.used.WithLabelValues(k[:]...).Set(float64(u.Used))
		m.nominal.WithLabelValues(k[:]...).Set(float64(u.Nominal))
		m.borrowed.WithLabelValues(k[:]...).Set(float64(u.Borrowed))
		m.lent.WithLabelValues(k[:]...).Set(float64(lent[i]))
		m.pendingAccel.WithLabelValues(k[:]...).Set(float64(u.PendingAccelerators))
	}
	// A deleted team's series go with it.
	for k := range m.teams {
		if !seen[k] {
			for _, v := range []*prometheus.GaugeVec{m.used, m.nominal, m.borrowed, m.lent, m.pendingAccel} {
				v.DeleteLabelValues(k[:]...)
			}
		}
	}
	m.teams = seen
	teams := map[string]bool{}
	for _, u := range d.Teams {
		teams[u.Team] = true
		m.queue.WithLabelValues(u.Team).Set(float64(queue[u.Team]))
	}
	for t := range m.queueTeams {
		if !teams[t] {
			m.queue.DeleteLabelValues(t)
		}
	}
	m.queueTeams = teams
}

// lentBy is each usage row's lent accelerators: its unused nominal quota
// times the share of its cohort's unused quota that the cohort's
// borrowers use.
func lentBy(us []api.TeamUsage) []int {
	type key struct{ cohort, flavor string }
	borrowed, unused := map[key]int{}, map[key]int{}
	for _, u := range us {
		k := key{u.Cohort, u.Flavor} // "" is the default cohort
		borrowed[k] += u.Borrowed
		unused[k] += max(0, u.Nominal-u.Used)
	}
	out := make([]int, len(us))
	for i, u := range us {
		k := key{u.Cohort, u.Flavor}
		if unused[k] == 0 {
			continue
		}
		free := max(0, u.Nominal-u.Used)
		out[i] = free * min(borrowed[k], unused[k]) / unused[k]
	}
	return out
}

// names lists the registry's metric families (tests, the dashboard check).
func (m *metrics) names() []string {
	mfs, _ := m.reg.Gather()
	var out []string
	for _, mf := range mfs {
		out = append(out, mf.GetName())
	}
	sort.Strings(out)
	return out
}

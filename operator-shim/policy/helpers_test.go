package policy

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

const h100 = "nvidia-h100-80gb"

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func ip(n int) *int { return &n }

func mkNodes(prefix string, n, accel int) []Node {
	out := make([]Node, n)
	for i := range out {
		out[i] = Node{Name: fmt.Sprintf("%s-%03d", prefix, i), Flavor: h100, Accelerators: accel, VCPUs: 96, Memory: 1 << 40}
	}
	return out
}

func mkTeam(name string, nominal int) Team {
	return Team{Name: name, Quotas: []FlavorQuota{{Flavor: h100, Nominal: nominal}}}
}

// job makes a whole-node job of 8 accelerators per node.
func job(name, team string, prio, minN, maxN int, elastic bool) Job {
	return Job{Name: name, Team: team, Priority: ip(prio), PerNode: Resources{Accelerators: 8},
		MinNodes: minN, MaxNodes: maxN, Elastic: elastic, SubmitTime: t0}
}

func frac(name, team string, prio, gpus int) Job {
	return Job{Name: name, Team: team, Priority: ip(prio), PerNode: Resources{Accelerators: gpus}, SubmitTime: t0}
}

type env struct {
	t    *testing.T
	st   State
	tick time.Duration
	last Decision
}

func newEnv(t *testing.T, nodes []Node, teams []Team, jobs ...Job) *env {
	t.Helper()
	return &env{t: t, st: State{Now: t0, Nodes: nodes, Teams: teams, Jobs: jobs}, tick: 10 * time.Second}
}

// cycle runs one engine cycle, feeds the allocations back and advances time.
func (e *env) cycle() Decision {
	e.t.Helper()
	d := Schedule(e.st)
	checkInvariants(e.t, e.st, d)
	e.st.Allocations = d.Allocations
	e.st.Now = e.st.Now.Add(e.tick)
	e.last = d
	return d
}

func (e *env) add(jobs ...Job) {
	for _, j := range jobs {
		if j.SubmitTime.IsZero() || j.SubmitTime.Equal(t0) {
			j.SubmitTime = e.st.Now
		}
		e.st.Jobs = append(e.st.Jobs, j)
	}
}

func (e *env) remove(name string) {
	for i, j := range e.st.Jobs {
		if j.Name == name {
			e.st.Jobs = append(e.st.Jobs[:i], e.st.Jobs[i+1:]...)
			return
		}
	}
}

func size(d Decision, job string) int {
	a, ok := d.Allocation(job)
	if !ok {
		return 0
	}
	return a.Size
}

func reasonOf(t *testing.T, d Decision, job string) Reason {
	t.Helper()
	r, ok := d.Reason(job)
	if !ok {
		t.Fatalf("no reason for %s", job)
	}
	return r
}

func wantKind(t *testing.T, d Decision, job string, kind ReasonKind, code ReasonCode) Reason {
	t.Helper()
	r := reasonOf(t, d, job)
	if r.Kind != kind || (code != "" && r.Code != code) {
		t.Fatalf("%s: got %s/%s (%s), want %s/%s", job, r.Kind, r.Code, r.Message, kind, code)
	}
	return r
}

// checkInvariants verifies what must hold for every decision: no node
// over-committed, whole-node jobs alone on their nodes, sizes within the
// spec, nothing placed on nodes that take no new work unless it was there
// before, one reason per job.
func checkInvariants(t *testing.T, st State, d Decision) {
	t.Helper()
	nodes := map[string]Node{}
	for _, n := range st.Nodes {
		if n.Validate() != nil {
			continue
		}
		if _, dup := nodes[n.Name]; !dup {
			nodes[n.Name] = n
		}
	}
	jobs := map[string]Job{}
	for _, j := range st.Jobs {
		if _, dup := jobs[j.Name]; !dup {
			jobs[j.Name] = j
		}
	}
	prev := map[string]map[string]bool{}
	for _, a := range st.Allocations {
		if prev[a.Job] != nil {
			continue
		}
		m := map[string]bool{}
		for _, n := range a.Nodes {
			m[n] = true
		}
		prev[a.Job] = m
	}
	used := map[string]int{}
	excl := map[string]int{}
	tenants := map[string]int{}
	for _, a := range d.Allocations {
		j, ok := jobs[a.Job]
		if !ok {
			t.Fatalf("allocation for unknown job %s", a.Job)
		}
		if a.Size != len(a.Nodes) || a.Size < 1 {
			t.Fatalf("%s: size %d nodes %v", a.Job, a.Size, a.Nodes)
		}
		if j.Suspended {
			t.Fatalf("%s: suspended but allocated", a.Job)
		}
		sp, err := normalize(j, st.Config)
		if err != nil {
			t.Fatalf("%s: invalid job allocated", a.Job)
		}
		if a.Size < sp.min || a.Size > sp.max {
			t.Fatalf("%s: size %d outside [%d,%d]", a.Job, a.Size, sp.min, sp.max)
		}
		seen := map[string]bool{}
		for _, nn := range a.Nodes {
			if seen[nn] {
				t.Fatalf("%s: node %s twice", a.Job, nn)
			}
			seen[nn] = true
			n, ok := nodes[nn]
			if !ok || n.Unhealthy {
				t.Fatalf("%s: on missing/unhealthy node %s", a.Job, nn)
			}
			if (n.Draining || n.Unschedulable) && !prev[a.Job][nn] {
				t.Fatalf("%s: new work on draining/cordoned node %s", a.Job, nn)
			}
			used[nn] += j.PerNode.Accelerators
			tenants[nn]++
			if sp.max > 1 {
				excl[nn]++
			}
		}
	}
	for nn, u := range used {
		if u > nodes[nn].HealthyAccelerators() {
			t.Fatalf("node %s over-committed: %d > %d", nn, u, nodes[nn].HealthyAccelerators())
		}
		if excl[nn] > 0 && tenants[nn] > 1 {
			t.Fatalf("node %s: whole-node job shares it (%d tenants)", nn, tenants[nn])
		}
	}
	if len(d.Reasons) != len(jobs) {
		t.Fatalf("%d reasons for %d jobs", len(d.Reasons), len(jobs))
	}
	for i := 1; i < len(d.Reasons); i++ {
		if d.Reasons[i-1].Job >= d.Reasons[i].Job {
			t.Fatalf("reasons not sorted")
		}
	}
}

// toFixedPoint runs e's full cycles on st, feeding the allocations back and
// advancing a second each, for at most cycles or until the engine reached
// its fixed point (reported).
func toFixedPoint(e *Engine, st *State, cycles int) (Decision, bool) {
	var d Decision
	for i := 0; i < cycles && (i == 0 || !e.fix); i++ {
		d = e.Schedule(*st)
		st.Allocations = d.Allocations
		st.Now = st.Now.Add(time.Second)
	}
	return d, e.fix
}

// sameLists reports whether a and b hold equal reasons and allocations.
func sameLists(a, b Decision) bool {
	return reflect.DeepEqual(a.Reasons, b.Reasons) && reflect.DeepEqual(a.Allocations, b.Allocations)
}

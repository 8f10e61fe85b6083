package policy

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
)

// build validates and indexes nodes, teams and jobs.
func (s *sched) build(st State) {
	s.flavorByNm = map[string]*flavorRT{}
	order := s.buildNodes(st)
	s.buildTeams(st, order)
	s.buildJobs(st, order)
}

// buildNodes indexes the valid nodes, sorted by name for determinism, by
// flavor and shape. It returns a buffer for the teams' and jobs' order.
func (s *sched) buildNodes(st State) []int {
	order := make([]int, len(st.Nodes), max(len(st.Nodes), len(st.Teams), len(st.Jobs)))
	for i := range order {
		order[i] = i
	}
	sortByName(order, len(st.Nodes), func(i int) string { return st.Nodes[i].Name })
	s.nodes = make([]nodeRT, 0, len(st.Nodes))
	s.nodeByName = make(map[string]*nodeRT, len(st.Nodes))
	for _, i := range order {
		n := &st.Nodes[i]
		if err := n.Validate(); err != nil {
			s.problem("node", n.Name, err)
			continue
		}
		if len(s.nodes) > 0 && s.nodes[len(s.nodes)-1].name == n.Name {
			s.problem("node", n.Name, fmt.Errorf("node %q: listed twice; the first entry is used", n.Name))
			continue
		}
		s.nodes = append(s.nodes, nodeRT{
			spec: n, name: n.Name, cap: n.HealthyAccelerators(),
			vcpuCap: n.VCPUs, memCap: int64(n.Memory),
			usable: !n.Unhealthy && !n.Draining && !n.Unschedulable,
			bucket: -1,
		})
	}
	shapes := map[string]map[int]*shape{}
	for i := range s.nodes {
		n := &s.nodes[i]
		s.nodeByName[n.name] = n
		if n.spec.Unhealthy {
			continue
		}
		f := s.flavor(n.spec.Flavor)
		n.fl = f
		m := shapes[f.name]
		if m == nil {
			m = map[int]*shape{}
			shapes[f.name] = m
		}
		sh := m[n.cap]
		if sh == nil {
			sh = &shape{cap: n.cap, buckets: make([]bitset, n.cap+1)}
			m[n.cap] = sh
			f.shapes = append(f.shapes, sh)
			f.maxCap = max(f.maxCap, n.cap)
		}
		n.sh, n.local = sh, len(sh.nodes)
		sh.nodes = append(sh.nodes, n)
		if n.usable {
			f.capacity += n.cap
		}
	}
	for _, f := range s.flavors {
		slices.SortFunc(f.shapes, func(a, b *shape) int { return a.cap - b.cap })
	}
	for i := range s.nodes {
		if s.nodes[i].fl != nil {
			s.nodes[i].reindex()
		}
	}
	return order
}

// buildTeams indexes the teams, sorted by name, and their quotas by
// flavor and cohort.
func (s *sched) buildTeams(st State, order []int) {
	order = order[:0]
	for i := range st.Teams {
		order = append(order, i)
	}
	sortByName(order, len(st.Teams), func(i int) string { return st.Teams[i].Name })
	s.teams = make([]teamRT, 0, len(st.Teams))
	s.teamByName = make(map[string]*teamRT, len(st.Teams))
	for _, i := range order {
		t := &st.Teams[i]
		if len(s.teams) > 0 && s.teams[len(s.teams)-1].name == t.Name {
			s.problem("team", t.Name, fmt.Errorf("team %q: listed twice; the first entry is used", t.Name))
			continue
		}
		rt := teamRT{spec: t, name: t.Name, weight: t.Weight, policy: t.Preemption, cohort: t.Cohort, valid: true}
		if err := t.Validate(); err != nil {
			s.problem("team", t.Name, err)
			rt.valid = false
		}
		if rt.weight <= 0 {
			rt.weight = 1
		}
		if rt.policy == "" {
			rt.policy = PreemptNever
		}
		s.teams = append(s.teams, rt)
	}
	for i := range s.teams {
		t := &s.teams[i]
		s.teamByName[t.name] = t
		if !t.valid {
			continue
		}
		t.flavors = make(map[string]*teamFlavor, len(t.spec.Quotas))
		for _, q := range t.spec.Quotas {
			f := s.flavor(q.Flavor)
			co := f.cohorts[t.cohort]
			if co == nil {
				co = &cohortRT{name: t.cohort}
				f.cohorts[t.cohort] = co
			}
			lend := q.Nominal
			if q.LendingLimit != nil {
				lend = min(*q.LendingLimit, q.Nominal)
			}
			bl := unlimited
			if q.BorrowingLimit != nil {
				bl = *q.BorrowingLimit
			}
			tf := &teamFlavor{
				team: t, fl: f, co: co, nominal: q.Nominal, borrowLimit: bl,
				guaranteed: q.Nominal - lend, vcpuCap: q.VCPUs, memCap: int64(q.Memory),
			}
			co.pool += lend
			f.nominal += q.Nominal
			f.teams = append(f.teams, tf)
			t.flavors[q.Flavor] = tf
		}
	}
	slices.SortFunc(s.flavors, func(a, b *flavorRT) int { return strings.Compare(a.name, b.name) })
	for _, f := range s.flavors {
		f.slack = max(0, f.capacity-f.nominal)
	}
}

// buildJobs indexes the jobs, sorted by name (their rank), and resolves
// each valid one's team and quota.
func (s *sched) buildJobs(st State, order []int) {
	order = order[:0]
	for i := range st.Jobs {
		order = append(order, i)
	}
	sortByName(order, len(st.Jobs), func(i int) string { return st.Jobs[i].Name })
	s.jobs = getJobs(len(st.Jobs))
	s.jobByName = make(map[string]*jobRT, len(st.Jobs))
	for _, i := range order {
		j := &st.Jobs[i]
		if len(s.jobs) > 0 && s.jobs[len(s.jobs)-1].name == j.Name {
			s.problem("job", j.Name, fmt.Errorf("job %q: listed twice; the first entry is used", j.Name))
			continue
		}
		rt := jobRT{spec: j, name: j.Name, valid: true}
		sp, err := normalize(*j, s.cfg)
		if err != nil {
			s.problem("job", j.Name, err)
			rt.valid = false
			rt.setInvalid(err)
		}
		rt.sp = sp
		rt.per, rt.vcpu, rt.mem = j.PerNode.Accelerators, j.PerNode.VCPUs, int64(j.PerNode.Memory)
		rt.exclusive = sp.max > 1
		s.jobs = append(s.jobs, rt)
	}
	for i := range s.jobs {
		j := &s.jobs[i]
		j.rank = i
		s.jobByName[j.name] = j
		if !j.valid {
			continue
		}
		s.resolve(j)
		if j.spec.Suspended {
			// Suspension is reported whatever else is wrong with the job.
			j.setSuspended()
		}
	}
}

// resolve finds j's team and flavor quota and records j as pending: with
// the cause when there is none (the job cannot be scheduled until the teams
// change), else until a phase admits it.
func (s *sched) resolve(j *jobRT) {
	t := s.teamByName[j.spec.Team]
	switch {
	case t == nil:
		j.setPending(CodeTeamNotFound, fmt.Sprintf("team %q does not exist; apply it with elasticctl apply -f teams.yaml", j.spec.Team))
		return
	case !t.valid:
		j.setPending(CodeTeamNotFound, fmt.Sprintf("team %q is invalid (see its problems); fix and re-apply it", t.name))
		return
	}
	j.team = t
	fname := j.spec.Flavor
	if fname == "" {
		if len(t.spec.Quotas) == 1 {
			fname = t.spec.Quotas[0].Flavor
		} else {
			j.setPending(CodeNoFlavor, fmt.Sprintf("flavor: not set and team %q has quotas for %d flavors (%s); set flavor", t.name, len(t.spec.Quotas), flavorList(t)))
			return
		}
	}
	j.flavor = fname
	tf := t.flavors[fname]
	if tf == nil {
		j.setPending(CodeNoFlavor, fmt.Sprintf("team %q has no quota for flavor %q (it has: %s); add a quota entry (nominal: 0 to only borrow)", t.name, fname, flavorList(t)))
		return
	}
	j.tf, j.fl = tf, tf.fl
	tf.jobs = append(tf.jobs, j)
	tf.fl.jobs = append(tf.fl.jobs, j)
	j.setPending("", "")
}

// flavorList names the flavors team t has quotas for.
func flavorList(t *teamRT) string {
	var names []string
	for _, q := range t.spec.Quotas {
		names = append(names, q.Flavor)
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// jobsPool keeps the job records' array from one Schedule call to the
// next: at 10,000 jobs it is about 5 MB, half of what a cycle allocates,
// and allocating it every cycle made the garbage collector run twice as
// often. Nothing in a Decision points into it.
var jobsPool sync.Pool // of *[]jobRT

// getJobs returns an empty job record array with room for n.
func getJobs(n int) []jobRT {
	if p, ok := jobsPool.Get().(*[]jobRT); ok && cap(*p) >= n {
		return (*p)[:0]
	}
	return make([]jobRT, 0, n)
}

// putJobs returns the array to the pool, cleared (it holds pointers into
// the cycle's other records).
func putJobs(jobs []jobRT) {
	jobs = jobs[:cap(jobs)]
	clear(jobs)
	jobs = jobs[:0]
	jobsPool.Put(&jobs)
}

// sortByName orders the indexes 0..n-1 in order (which holds them in that
// order) stably by name(i). Input already in name order (as the
// coordinator keeps it) is left as it is without sorting: a stable sort
// would not move it either.
func sortByName(order []int, n int, name func(int) string) {
	sorted := true
	for i := 1; i < n; i++ {
		if name(i-1) > name(i) {
			sorted = false
			break
		}
	}
	if sorted {
		return
	}
	sort.SliceStable(order, func(a, b int) bool { return name(order[a]) < name(order[b]) })
}

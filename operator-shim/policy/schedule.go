package policy

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// unlimited stands for a missing borrowing limit.
const unlimited = math.MaxInt32

type flavorRT struct {
	name      string
	shapes    []*shape // ascending cap
	maxCap    int
	freeAccel int // free accelerators on nodes that take new work
	wholeFree int // fully free nodes that take new work
	capacity  int // accelerators on nodes that take new work
	nominal   int // sum of nominal quotas
	slack     int // capacity no nominal quota covers
	overUsed  int // sum over cohorts of pool use beyond the cohort's pool
	// reservedPhys is unplaceable within-nominal demand others may not borrow.
	reservedPhys int
	cohorts      map[string]*cohortRT
	teams        []*teamFlavor // by team name
	jobs         []*jobRT      // by job name
	pending      []*jobRT      // admission order
	// reclaim fail-fast memo: (team, exclusive, per) -> smallest failed minNodes.
	failMemo map[memoKey]int
	// borrower victim lists for the current phase: elastic jobs to shrink,
	// jobs to preempt.
	bShrink, bPreempt []*jobRT
	bsPos, bpPos      int
}

type memoKey struct {
	tf        *teamFlavor
	exclusive bool
	per       int
}

type cohortRT struct {
	name     string
	pool     int // sum of lendable quota
	poolUsed int // sum of teams' use beyond their guaranteed part
}

func (c *cohortRT) over(pu int) int { return max(0, pu-c.pool) }

type teamRT struct {
	spec    *Team
	name    string
	weight  float64
	policy  PreemptionPolicy
	cohort  string
	valid   bool
	flavors map[string]*teamFlavor
}

type teamFlavor struct {
	team        *teamRT
	fl          *flavorRT
	co          *cohortRT
	nominal     int
	borrowLimit int
	guaranteed  int
	used        int
	reserved    int
	vcpuCap     int
	vcpuUsed    int
	memCap      int64
	memUsed     int64
	jobs        []*jobRT // the team's jobs of this flavor, by name
	queue       []*jobRT // pending, admission order
	head        int      // StrictFIFO: first queue entry not admitted
	running     int
	// own victim lists (LowerPriority), built on first use in a phase.
	ownShrink, ownPreempt []*jobRT
	ownBuilt              bool
}

func (tf *teamFlavor) pu(u int) int { return max(0, u-tf.guaranteed) }

type jobRT struct {
	spec      *Job
	name      string
	sp        spec
	team      *teamRT
	tf        *teamFlavor
	fl        *flavorRT
	flavor    string
	per       int
	vcpu      int
	mem       int64
	exclusive bool
	valid     bool
	invalid   string
	// pre-classified pending cause (team not found, no flavor)
	preCode ReasonCode
	preMsg  string

	prevSize  int
	prevNodes []string
	// tookFrom: jobs this job took capacity from during its allocation.
	tookFrom   []string
	size       int
	nodes      []*nodeRT
	since      time.Time
	lastResize time.Time
	repairNeed int

	// events of this cycle
	code         ReasonCode
	detail       string
	forJobs      []string
	forTeam      string
	admittedNow  bool
	shrunkNow    bool
	preemptedNow bool
	grownNow     bool
	grewBorrow   bool
	repairedNow  bool
	movedNow     bool
	released     bool // suspended/invalid/team gone: allocation dropped
	stuck        bool // fits within nominal quota but could not be placed
	reservedAcc  int
	growBlock    ReasonCode
	pendingWhy   ReasonCode
	inQueue      bool
}

type sched struct {
	now        time.Time
	cfg        Config
	stable     time.Duration
	strict     bool
	nodes      []nodeRT
	nodeByName map[string]*nodeRT
	teams      []teamRT
	teamByName map[string]*teamRT
	jobs       []jobRT
	jobByName  map[string]*jobRT
	flavors    []*flavorRT
	flavorByNm map[string]*flavorRT
	problems   []Problem
	released   []string
	scratch    []*nodeRT
}

// Schedule runs one engine cycle. It is a pure function of st.
func Schedule(st State) Decision {
	s := &sched{
		now:    st.Now,
		cfg:    st.Config,
		stable: st.Config.StablePeriod(),
		strict: st.Config.Queueing == StrictFIFO,
	}
	s.build(st)
	s.carryOver(st.Allocations)
	for _, f := range s.flavors {
		s.repair(f)
		s.finishSetup(f)
		s.admitWithinNominal(f)
		s.reclaim(f)
		s.reserve(f)
		s.admitBorrowing(f)
		s.priorityPreempt(f)
		if !s.cfg.DisableGrowth {
			s.grow(f)
		}
	}
	return s.decide()
}

func (s *sched) flavor(name string) *flavorRT {
	if f, ok := s.flavorByNm[name]; ok {
		return f
	}
	f := &flavorRT{name: name, cohorts: map[string]*cohortRT{}, failMemo: map[memoKey]int{}}
	s.flavorByNm[name] = f
	s.flavors = append(s.flavors, f)
	return f
}

func (s *sched) problem(obj, name string, err error) {
	s.problems = append(s.problems, Problem{Object: obj, Name: name, Error: err.Error()})
}

// build validates and indexes nodes, teams and jobs.
func (s *sched) build(st State) {
	s.flavorByNm = map[string]*flavorRT{}

	// Nodes, sorted by name for determinism.
	order := make([]int, len(st.Nodes))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return st.Nodes[order[a]].Name < st.Nodes[order[b]].Name })
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

	// Teams.
	order = order[:0]
	for i := range st.Teams {
		order = append(order, i)
	}
	sort.SliceStable(order, func(a, b int) bool { return st.Teams[order[a]].Name < st.Teams[order[b]].Name })
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

	// Jobs.
	order = order[:0]
	for i := range st.Jobs {
		order = append(order, i)
	}
	sort.SliceStable(order, func(a, b int) bool { return st.Jobs[order[a]].Name < st.Jobs[order[b]].Name })
	s.jobs = make([]jobRT, 0, len(st.Jobs))
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
			rt.valid, rt.invalid = false, err.Error()
		}
		rt.sp = sp
		rt.per, rt.vcpu, rt.mem = j.PerNode.Accelerators, j.PerNode.VCPUs, int64(j.PerNode.Memory)
		rt.exclusive = sp.max > 1
		s.jobs = append(s.jobs, rt)
	}
	for i := range s.jobs {
		j := &s.jobs[i]
		s.jobByName[j.name] = j
		if !j.valid {
			continue
		}
		t := s.teamByName[j.spec.Team]
		switch {
		case t == nil:
			j.preCode, j.preMsg = CodeTeamNotFound, fmt.Sprintf("team %q does not exist; apply it with elasticctl apply -f teams.yaml", j.spec.Team)
			continue
		case !t.valid:
			j.preCode, j.preMsg = CodeTeamNotFound, fmt.Sprintf("team %q is invalid (see its problems); fix and re-apply it", t.name)
			continue
		}
		j.team = t
		fname := j.spec.Flavor
		if fname == "" {
			if len(t.spec.Quotas) == 1 {
				fname = t.spec.Quotas[0].Flavor
			} else {
				j.preCode, j.preMsg = CodeNoFlavor, fmt.Sprintf("flavor: not set and team %q has quotas for %d flavors (%s); set flavor", t.name, len(t.spec.Quotas), flavorList(t))
				continue
			}
		}
		j.flavor = fname
		tf := t.flavors[fname]
		if tf == nil {
			j.preCode, j.preMsg = CodeNoFlavor, fmt.Sprintf("team %q has no quota for flavor %q (it has: %s); add a quota entry (nominal: 0 to only borrow)", t.name, fname, flavorList(t))
			continue
		}
		j.tf, j.fl = tf, tf.fl
		tf.jobs = append(tf.jobs, j)
		tf.fl.jobs = append(tf.fl.jobs, j)
	}
}

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

// jobOrder is the admission order: priority desc, submit time asc, name asc.
func jobOrder(a, b *jobRT) int {
	if a.sp.prio != b.sp.prio {
		return b.sp.prio - a.sp.prio
	}
	if c := a.spec.SubmitTime.Compare(b.spec.SubmitTime); c != 0 {
		return c
	}
	return strings.Compare(a.name, b.name)
}

// Sizes.

func (j *jobRT) allowedMax() int {
	if j.sp.sizes != nil {
		return j.sp.sizes[len(j.sp.sizes)-1]
	}
	return j.sp.min + (j.sp.max-j.sp.min)/j.sp.step*j.sp.step
}

// floorSize is the largest allowed size <= n, or 0.
func (j *jobRT) floorSize(n int) int {
	if n < j.sp.min {
		return 0
	}
	if j.sp.sizes != nil {
		i := sort.SearchInts(j.sp.sizes, n+1)
		return j.sp.sizes[i-1]
	}
	return min(j.allowedMax(), j.sp.min+(n-j.sp.min)/j.sp.step*j.sp.step)
}

// nextSize is the smallest allowed size > n, or 0.
func (j *jobRT) nextSize(n int) int {
	if n < j.sp.min {
		return j.sp.min
	}
	if j.sp.sizes != nil {
		i := sort.SearchInts(j.sp.sizes, n+1)
		if i < len(j.sp.sizes) {
			return j.sp.sizes[i]
		}
		return 0
	}
	nx := j.floorSize(n) + j.sp.step
	if nx > j.allowedMax() {
		return 0
	}
	return nx
}

// smallerSize is the largest allowed size < n, or 0.
func (j *jobRT) smallerSize(n int) int { return j.floorSize(n - 1) }

// Accounting.

// setEff changes a team's used and reserved accelerators, keeping the
// cohort pool and the flavor's overflow in step.
func (s *sched) setEff(tf *teamFlavor, used, reserved int) {
	old := tf.pu(tf.used + tf.reserved)
	tf.used, tf.reserved = used, reserved
	nw := tf.pu(tf.used + tf.reserved)
	if nw == old {
		return
	}
	c := tf.co
	oldOver := c.over(c.poolUsed)
	c.poolUsed += nw - old
	tf.fl.overUsed += c.over(c.poolUsed) - oldOver
}

// poolOK reports whether tf may take d more accelerators from its cohort's
// lendable pool (and the flavor's unowned slack).
func (s *sched) poolOK(tf *teamFlavor, d int) bool {
	if d <= 0 {
		return true
	}
	eff := tf.used + tf.reserved
	delta := tf.pu(eff+d) - tf.pu(eff)
	if delta == 0 {
		return true
	}
	c := tf.co
	return tf.fl.overUsed-c.over(c.poolUsed)+c.over(c.poolUsed+delta) <= tf.fl.slack
}

// quotaCheck returns "" when tf may take acc more accelerators (and dv vCPUs,
// dm memory); within restricts it to the nominal quota.
func (s *sched) quotaCheck(tf *teamFlavor, acc, dv int, dm int64, within bool) ReasonCode {
	if tf.vcpuCap > 0 && tf.vcpuUsed+dv > tf.vcpuCap {
		return CodeQuotaExceeded
	}
	if tf.memCap > 0 && tf.memUsed+dm > tf.memCap {
		return CodeQuotaExceeded
	}
	u := tf.used + tf.reserved + acc
	if u > tf.nominal {
		if within {
			return CodeQuotaExceeded
		}
		if u-tf.nominal > tf.borrowLimit {
			return CodeBorrowingLimit
		}
		if r := tf.fl.reservedPhys; r > 0 && tf.fl.freeAccel >= acc && tf.fl.freeAccel-acc < r {
			return CodeReserved
		}
	}
	if !s.poolOK(tf, acc) {
		return CodeCohortExhausted
	}
	return ""
}

// Placement.

func (s *sched) attach(j *jobRT, n *nodeRT) {
	n.used += j.per
	n.vcpuUsed += j.vcpu
	n.memUsed += j.mem
	if j.exclusive {
		n.exclusive = true
	}
	n.jobs = append(n.jobs, j)
	n.reindex()
	j.nodes = append(j.nodes, n)
	j.size++
	tf := j.tf
	s.setEff(tf, tf.used+j.per, tf.reserved)
	tf.vcpuUsed += j.vcpu
	tf.memUsed += j.mem
	if j.size == 1 {
		tf.running++
	}
}

func (s *sched) detachNode(j *jobRT, n *nodeRT) {
	n.used -= j.per
	n.vcpuUsed -= j.vcpu
	n.memUsed -= j.mem
	if j.exclusive {
		n.exclusive = false
	}
	if i := slices.Index(n.jobs, j); i >= 0 {
		n.jobs = slices.Delete(n.jobs, i, i+1)
	}
	n.reindex()
	j.size--
	tf := j.tf
	s.setEff(tf, tf.used-j.per, tf.reserved)
	tf.vcpuUsed -= j.vcpu
	tf.memUsed -= j.mem
	if j.size == 0 {
		tf.running--
	}
}

// removeNodes releases k of j's nodes (nodes that take no new work first,
// then the most recently added) and returns them.
func (s *sched) removeNodes(j *jobRT, k int) []*nodeRT {
	if k <= 0 {
		return nil
	}
	drop := make([]bool, len(j.nodes))
	var rel []*nodeRT
	for pass := 0; pass < 2 && len(rel) < k; pass++ {
		for i := len(j.nodes) - 1; i >= 0 && len(rel) < k; i-- {
			n := j.nodes[i]
			if drop[i] || (pass == 0 && n.usable) {
				continue
			}
			drop[i] = true
			rel = append(rel, n)
		}
	}
	keep := j.nodes[:0:0]
	for i, n := range j.nodes {
		if !drop[i] {
			keep = append(keep, n)
		}
	}
	for _, n := range rel {
		s.detachNode(j, n)
	}
	j.nodes = keep
	return rel
}

// findNodes returns count more nodes for j (scratch slice), or nil.
func (s *sched) findNodes(j *jobRT, count int) []*nodeRT {
	f := j.fl
	if j.exclusive {
		if f.wholeFree < count {
			return nil
		}
		s.scratch = f.pickWhole(j.per, j.vcpu, j.mem, count, s.scratch[:0])
		if len(s.scratch) < count {
			return nil
		}
		return s.scratch
	}
	if count != 1 || j.size != 0 {
		return nil
	}
	n := f.pickFrac(j.per, j.vcpu, j.mem)
	if n == nil {
		return nil
	}
	s.scratch = append(s.scratch[:0], n)
	return s.scratch
}

func (s *sched) canPlace(j *jobRT, count int) bool { return s.findNodes(j, count) != nil }

// carryOver places the current allocations.
func (s *sched) carryOver(allocs []Allocation) {
	type carried struct {
		a *Allocation
		j *jobRT
	}
	var list []carried
	seen := map[string]bool{}
	for i := range allocs {
		a := &allocs[i]
		if seen[a.Job] {
			s.problem("allocation", a.Job, fmt.Errorf("allocation %q: listed twice; the first entry is used", a.Job))
			continue
		}
		seen[a.Job] = true
		j := s.jobByName[a.Job]
		if j == nil {
			s.released = append(s.released, a.Job)
			continue
		}
		j.prevSize = len(a.Nodes)
		j.prevNodes = a.Nodes
		if a.Size != len(a.Nodes) {
			s.problem("allocation", a.Job, fmt.Errorf("allocation %q: size %d but %d nodes; the node list is used", a.Job, a.Size, len(a.Nodes)))
		}
		if j.prevSize == 0 {
			continue
		}
		j.since, j.lastResize = a.Since, a.LastResize
		j.tookFrom = a.TookFrom
		switch {
		case !j.valid:
			j.released = true
			continue
		case j.tf == nil:
			j.released = true
			j.code = j.preCode
			continue
		case j.spec.Suspended:
			j.released = true
			continue
		case (a.Flavor != "" && a.Flavor != j.flavor) || (a.AcceleratorsPerNode != 0 && a.AcceleratorsPerNode != j.per):
			j.code, j.detail = CodeSpecChanged, "flavor or perNode.accelerators changed"
			continue
		}
		list = append(list, carried{a, j})
	}
	slices.SortFunc(list, func(x, y carried) int {
		if x.j.sp.prio != y.j.sp.prio {
			return y.j.sp.prio - x.j.sp.prio
		}
		if c := x.a.Since.Compare(y.a.Since); c != 0 {
			return c
		}
		return strings.Compare(x.j.name, y.j.name)
	})
	for _, c := range list {
		j, a := c.j, c.a
		want := len(a.Nodes)
		if !j.exclusive {
			want = 1
		}
		lost := 0
		dup := map[string]bool{}
		for _, name := range a.Nodes {
			if dup[name] {
				continue
			}
			dup[name] = true
			if j.size >= want {
				break
			}
			n := s.nodeByName[name]
			ok := n != nil && n.fl == j.fl && n.fitsExtra(j.vcpu, j.mem)
			if ok && j.exclusive {
				ok = len(n.jobs) == 0 && n.cap >= j.per
			} else if ok {
				ok = !n.exclusive && n.free() >= j.per
			}
			if !ok {
				lost++
				continue
			}
			s.attach(j, n)
		}
		if len(dup) < want {
			want = len(dup)
		}
		// Clamp to the spec (maxNodes lowered, sizes changed).
		target := j.floorSize(min(want, j.sp.max))
		if target == 0 {
			j.code, j.detail = CodeSpecChanged, fmt.Sprintf("minNodes %d is above the allocated %d nodes", j.sp.min, want)
			s.removeNodes(j, j.size)
			continue
		}
		if target < want && lost == 0 {
			j.code, j.detail = CodeSpecChanged, fmt.Sprintf("size %d is not allowed by the spec (min %d, max %d)", want, j.sp.min, j.sp.max)
		}
		if j.size > target {
			s.removeNodes(j, j.size-target)
		}
		if j.size < target {
			j.repairNeed = target - j.size
		}
	}
}

// repair replaces lost nodes (highest priority first), or shrinks or
// requeues jobs that cannot be repaired.
func (s *sched) repair(f *flavorRT) {
	var need []*jobRT
	for _, j := range f.jobs {
		if j.repairNeed > 0 {
			need = append(need, j)
		}
	}
	slices.SortFunc(need, jobOrder)
	for _, j := range need {
		var nodes []*nodeRT
		if j.exclusive {
			s.scratch = j.fl.pickWhole(j.per, j.vcpu, j.mem, j.repairNeed, s.scratch[:0])
			nodes = s.scratch
		} else {
			nodes = s.findNodes(j, 1)
		}
		for _, n := range nodes {
			s.attach(j, n)
		}
		if len(nodes) == j.repairNeed {
			j.repairedNow = true
			j.code = CodeNodeLost
			j.lastResize = s.now
			continue
		}
		target := j.floorSize(j.size)
		j.code = CodeNodeLost
		if target == 0 {
			s.removeNodes(j, j.size)
			continue
		}
		s.removeNodes(j, j.size-target)
		j.lastResize = s.now
	}
}

// finishSetup builds the pending queues of flavor f.
func (s *sched) finishSetup(f *flavorRT) {
	for _, j := range f.jobs {
		if j.size == 0 {
			j.since, j.lastResize = time.Time{}, time.Time{}
		}
		if j.size > 0 || j.spec.Suspended || j.prevSize > 0 && j.size == 0 {
			// Requeued jobs (lost nodes, spec change) wait one cycle.
			continue
		}
		f.pending = append(f.pending, j)
	}
	slices.SortFunc(f.pending, jobOrder)
	for _, j := range f.pending {
		j.inQueue = true
		j.tf.queue = append(j.tf.queue, j)
	}
}

// eligible reports whether j may be admitted now under the queueing strategy.
func (s *sched) eligible(j *jobRT) bool {
	if j.size > 0 || j.preemptedNow {
		return false
	}
	if !s.strict {
		return true
	}
	tf := j.tf
	for tf.head < len(tf.queue) && tf.queue[tf.head].size > 0 {
		tf.head++
	}
	return tf.head < len(tf.queue) && tf.queue[tf.head] == j
}

func (s *sched) admit(j *jobRT, nodes []*nodeRT, code ReasonCode) {
	for _, n := range nodes {
		s.attach(j, n)
	}
	j.admittedNow = true
	j.code = code
	j.since, j.lastResize = s.now, s.now
}

// tryAdmit admits j at its minimum size if quota and nodes allow.
func (s *sched) tryAdmit(j *jobRT, within bool) bool {
	acc := j.per * j.sp.min
	tf := j.tf
	if c := s.quotaCheck(tf, acc, j.vcpu*j.sp.min, j.mem*int64(j.sp.min), within); c != "" {
		return false
	}
	nodes := s.findNodes(j, j.sp.min)
	if nodes == nil {
		return false
	}
	code := CodeWithinQuota
	if tf.used+acc > tf.nominal {
		code = CodeBorrowing
	}
	s.admit(j, nodes, code)
	return true
}

// admitWithinNominal is rule 2.
func (s *sched) admitWithinNominal(f *flavorRT) {
	for _, j := range f.pending {
		if !s.eligible(j) {
			continue
		}
		tf := j.tf
		if tf.used+j.per*j.sp.min > tf.nominal {
			continue
		}
		if !s.tryAdmit(j, true) {
			j.stuck = true
		}
	}
}

// reclaim is rule 3.
func (s *sched) reclaim(f *flavorRT) {
	f.bShrink, f.bPreempt = nil, nil
	built := false
	for _, j := range f.pending {
		if !j.stuck || !s.eligible(j) {
			continue
		}
		if j.tf.used+j.per*j.sp.min > j.tf.nominal {
			j.stuck = false
			continue
		}
		key := memoKey{j.tf, j.exclusive, j.per}
		if m, ok := f.failMemo[key]; ok && j.sp.min >= m && j.vcpu == 0 && j.mem == 0 {
			continue
		}
		if !built {
			s.buildBorrowerLists(f)
			built = true
		}
		if s.tryPreempt(j, false) {
			j.stuck = false
		} else if j.vcpu == 0 && j.mem == 0 {
			if m, ok := f.failMemo[key]; !ok || j.sp.min < m {
				f.failMemo[key] = j.sp.min
			}
		}
	}
}

// reserve is rule 4.
func (s *sched) reserve(f *flavorRT) {
	for _, j := range f.pending {
		if !j.stuck || j.size > 0 {
			continue
		}
		tf := j.tf
		acc := j.per * j.sp.min
		if tf.used+tf.reserved+acc > tf.nominal {
			continue
		}
		s.setEff(tf, tf.used, tf.reserved+acc)
		f.reservedPhys += acc
		j.reservedAcc = acc
	}
}

func (s *sched) unreserve(j *jobRT) {
	if j.reservedAcc == 0 {
		return
	}
	s.setEff(j.tf, j.tf.used, j.tf.reserved-j.reservedAcc)
	j.fl.reservedPhys -= j.reservedAcc
	j.reservedAcc = 0
}

// teamKey orders teams for weighted fair share: the lowest (used - nominal)
// / weight first, so teams below their nominal quota come before borrowers
// and borrowers share idle capacity in proportion to their weights.
func teamKey(a, b *teamFlavor) int {
	ka := float64(a.used-a.nominal) / a.team.weight
	kb := float64(b.used-b.nominal) / b.team.weight
	if ka != kb {
		return cmp.Compare(ka, kb)
	}
	return strings.Compare(a.team.name, b.team.name)
}

// admitBorrowing is rule 5.
func (s *sched) admitBorrowing(f *flavorRT) {
	h := newHeap(func(a, b *teamFlavor) bool { return teamKey(a, b) < 0 })
	cursor := map[*teamFlavor]int{}
	for _, tf := range f.teams {
		if len(tf.queue) > 0 {
			h.push(tf)
		}
	}
	for h.len() > 0 {
		tf := h.top()
		admitted := false
		i := cursor[tf]
		for ; i < len(tf.queue); i++ {
			j := tf.queue[i]
			if j.stuck || !s.eligible(j) {
				if s.strict && j.size == 0 && !j.preemptedNow {
					i = len(tf.queue)
					break
				}
				continue
			}
			if s.tryAdmit(j, false) {
				admitted = true
				i++
				break
			}
			if s.strict {
				i = len(tf.queue)
				break
			}
		}
		cursor[tf] = i
		if admitted && i < len(tf.queue) {
			h.fix(0)
		} else {
			h.pop()
		}
	}
}

// priorityPreempt is rule 6.
func (s *sched) priorityPreempt(f *flavorRT) {
	built := false
	for _, j := range f.pending {
		tf := j.tf
		if tf.team.policy != PreemptLowerPriority || !s.eligible(j) {
			continue
		}
		acc := j.per * j.sp.min
		if acc > tf.nominal {
			continue
		}
		s.buildOwnLists(tf)
		if len(tf.ownPreempt) == 0 || tf.ownPreempt[0].sp.prio >= j.sp.prio {
			continue
		}
		if !built {
			s.buildBorrowerLists(f)
			built = true
		}
		res := j.reservedAcc
		s.unreserve(j)
		if s.tryPreempt(j, true) {
			j.stuck = false
		} else if res > 0 {
			s.setEff(tf, tf.used, tf.reserved+res)
			f.reservedPhys += res
			j.reservedAcc = res
		}
	}
}

func (s *sched) buildBorrowerLists(f *flavorRT) {
	f.bShrink, f.bPreempt = f.bShrink[:0], f.bPreempt[:0]
	f.bsPos, f.bpPos = 0, 0
	for _, v := range f.jobs {
		if v.size == 0 || v.tf.used <= v.tf.nominal {
			continue
		}
		f.bPreempt = append(f.bPreempt, v)
		if v.spec.Elastic && v.size > v.sp.min {
			f.bShrink = append(f.bShrink, v)
		}
	}
	slices.SortFunc(f.bShrink, shrinkOrder)
	slices.SortFunc(f.bPreempt, preemptOrder)
}

func (s *sched) buildOwnLists(tf *teamFlavor) {
	if tf.ownBuilt {
		return
	}
	tf.ownBuilt = true
	for _, v := range tf.jobs {
		if v.size == 0 {
			continue
		}
		tf.ownPreempt = append(tf.ownPreempt, v)
		if v.spec.Elastic && v.size > v.sp.min {
			tf.ownShrink = append(tf.ownShrink, v)
		}
	}
	slices.SortFunc(tf.ownShrink, shrinkOrder)
	slices.SortFunc(tf.ownPreempt, preemptOrder)
}

// shrinkOrder: lowest priority first, then the most recently resized, then name.
func shrinkOrder(a, b *jobRT) int {
	if a.sp.prio != b.sp.prio {
		return a.sp.prio - b.sp.prio
	}
	if c := b.lastResize.Compare(a.lastResize); c != 0 {
		return c
	}
	return strings.Compare(a.name, b.name)
}

// preemptOrder: lowest priority first, then the newest, then name.
func preemptOrder(a, b *jobRT) int {
	if a.sp.prio != b.sp.prio {
		return a.sp.prio - b.sp.prio
	}
	if c := b.since.Compare(a.since); c != 0 {
		return c
	}
	return strings.Compare(a.name, b.name)
}

type action struct {
	v        *jobRT
	oldSize  int
	oldNodes []*nodeRT
	released []*nodeRT
	undone   bool
}

func (s *sched) undo(a *action) {
	for _, n := range a.released {
		s.attach(a.v, n)
	}
	a.v.nodes = append(a.v.nodes[:0], a.oldNodes...)
	a.undone = true
}

func (s *sched) redo(a *action) {
	a.released = s.removeNodesExact(a.v, a.released)
	a.undone = false
}

// removeNodesExact releases exactly the given nodes of j.
func (s *sched) removeNodesExact(j *jobRT, rel []*nodeRT) []*nodeRT {
	drop := make(map[*nodeRT]bool, len(rel))
	for _, n := range rel {
		drop[n] = true
	}
	keep := j.nodes[:0:0]
	for _, n := range j.nodes {
		if !drop[n] {
			keep = append(keep, n)
		}
	}
	for _, n := range rel {
		s.detachNode(j, n)
	}
	j.nodes = keep
	return rel
}

// tryPreempt admits j at its minimum within its team's nominal quota by
// shrinking, then preempting, victims: with own, first the team's own
// lower-priority jobs (rule 6); then jobs of teams above their nominal quota
// (rule 3). It keeps only the victims needed, or changes nothing. Without
// own, when victims alone cannot make room because free capacity is
// fragmented, it falls back to tryDefrag.
func (s *sched) tryPreempt(j *jobRT, own bool) bool {
	tf := j.tf
	acc := j.per * j.sp.min
	fits := func() bool { return s.quotaOK(j) && s.canPlace(j, j.sp.min) }
	if fits() {
		s.admit(j, s.findNodes(j, j.sp.min), CodeWithinQuota)
		return true
	}
	acts, done := s.takeVictims(j, own, fits)
	if !done && own && tf.used+tf.reserved+acc > tf.nominal {
		s.undoAll(acts)
		return false
	}
	if !done {
		s.undoAll(acts)
		if own || s.cfg.DisableMoves {
			return false
		}
		return s.tryDefrag(j)
	}
	// Minimise: give back every step that is not needed, newest first. A
	// job's earlier step can only be undone if its later steps were.
	kept := map[*jobRT]bool{}
	for i := len(acts) - 1; i >= 0; i-- {
		a := &acts[i]
		if kept[a.v] {
			continue
		}
		s.undo(a)
		if !fits() {
			s.redo(a)
			kept[a.v] = true
		}
	}
	code := CodeReclaim
	if own {
		code = CodePriorityPreemption
	}
	s.commitVictims(j, acts, code)
	s.admit(j, s.findNodes(j, j.sp.min), code)
	return true
}

func (s *sched) quotaOK(j *jobRT) bool {
	return s.quotaCheck(j.tf, j.per*j.sp.min, j.vcpu*j.sp.min, j.mem*int64(j.sp.min), true) == ""
}

// takeVictims applies victim steps in order until goal holds.
func (s *sched) takeVictims(j *jobRT, own bool, goal func() bool) ([]action, bool) {
	tf, f := j.tf, j.fl
	var acts []action
	step := func(v *jobRT, newSize int) {
		a := action{v: v, oldSize: v.size, oldNodes: slices.Clone(v.nodes)}
		a.released = s.removeNodes(v, v.size-newSize)
		acts = append(acts, a)
	}
	// A job never takes capacity back from a job that took capacity from it
	// (no pair of jobs preempts each other back and forth).
	borrowing := func(v *jobRT) bool {
		return v.tf != tf && v.tf.used > v.tf.nominal && !slices.Contains(v.tookFrom, j.name)
	}
	lower := func(v *jobRT) bool {
		return v.tf == tf && v.sp.prio < j.sp.prio && !slices.Contains(v.tookFrom, j.name)
	}
	shrinkFrom := func(list []*jobRT, pos *int, ok func(*jobRT) bool, ordered bool) bool {
		for i := *pos; i < len(list); i++ {
			v := list[i]
			if i == *pos && (v.size <= v.sp.min || v.preemptedNow) {
				*pos = i + 1
				continue
			}
			if ordered && !lower(v) {
				break
			}
			for v.size > v.sp.min && ok(v) {
				step(v, v.smallerSize(v.size))
				if goal() {
					return true
				}
			}
		}
		return false
	}
	preemptFrom := func(list []*jobRT, pos *int, ok func(*jobRT) bool, ordered bool) bool {
		for i := *pos; i < len(list); i++ {
			v := list[i]
			if i == *pos && v.size == 0 {
				*pos = i + 1
				continue
			}
			if ordered && !lower(v) {
				break
			}
			if v.size > 0 && v != j && ok(v) {
				step(v, 0)
				if goal() {
					return true
				}
			}
		}
		return false
	}
	if goal() {
		return nil, true
	}
	zero1, zero2 := 0, 0
	if own && (shrinkFrom(tf.ownShrink, &zero1, lower, true) || preemptFrom(tf.ownPreempt, &zero2, lower, true)) {
		return acts, true
	}
	if own && tf.used+tf.reserved+j.per*j.sp.min > tf.nominal {
		return acts, false
	}
	if shrinkFrom(f.bShrink, &f.bsPos, borrowing, false) {
		return acts, true
	}
	if j.exclusive {
		// A whole-node job needs whole nodes: first only victims whose
		// preemption frees a whole node (whole-node jobs, single-node jobs
		// alone on their node), then any.
		freesNode := func(v *jobRT) bool {
			return borrowing(v) && (v.exclusive || (len(v.nodes) == 1 && len(v.nodes[0].jobs) == 1))
		}
		if preemptFrom(f.bPreempt, &f.bpPos, freesNode, false) {
			return acts, true
		}
	}
	return acts, preemptFrom(f.bPreempt, &f.bpPos, borrowing, false)
}

func (s *sched) undoAll(acts []action) {
	for i := len(acts) - 1; i >= 0; i-- {
		if !acts[i].undone {
			s.undo(&acts[i])
		}
	}
}

// commitVictims records the reasons of the victim steps that were kept:
// victims of j's own team lost to priority, others to reclaim (code).
func (s *sched) commitVictims(j *jobRT, acts []action, code ReasonCode) {
	for i := range acts {
		a := &acts[i]
		if a.undone {
			continue
		}
		v := a.v
		v.code = code
		if v.tf != j.tf {
			v.code = CodeReclaim
		}
		v.forTeam = j.tf.team.name
		if !slices.Contains(v.forJobs, j.name) {
			v.forJobs = append(v.forJobs, j.name)
		}
		if !slices.Contains(j.tookFrom, v.name) {
			j.tookFrom = append(j.tookFrom, v.name)
		}
		v.shrunkNow = true
		if v.size == 0 {
			v.preemptedNow = true
			v.since, v.lastResize = time.Time{}, time.Time{}
			v.tookFrom = nil
		} else {
			v.lastResize = s.now
		}
	}
}

type move struct {
	v        *jobRT
	from, to *nodeRT
}

func (s *sched) moveJob(v *jobRT, from, to *nodeRT) {
	s.detachNode(v, from)
	v.nodes = v.nodes[:0]
	s.attach(v, to)
}

// tryDefrag is rule 3b: free capacity within the quota exists but is
// fragmented. Borrowers are shrunk or preempted only as far as the quota
// needs, then single-node jobs are moved off the nodes that need the fewest
// moves (each moved job keeps its size; jobs resized or moved within the
// stable period are never moved). All or nothing.
func (s *sched) tryDefrag(j *jobRT) bool {
	// Victims only until the quota allows j and enough accelerators are
	// free in total, with one node's worth of slack to move jobs into;
	// moves consolidate them.
	acc := j.per*j.sp.min + j.fl.maxCap
	acts, ok := s.takeVictims(j, false, func() bool { return s.quotaOK(j) && j.fl.freeAccel >= acc })
	if !ok && s.quotaOK(j) {
		ok = true // no borrower left: try with the slack there is
	}
	if !ok {
		s.undoAll(acts)
		return false
	}
	moves, ok := s.defrag(j)
	if !ok {
		s.undoAll(acts)
		return false
	}
	s.commitVictims(j, acts, CodeReclaim)
	for _, m := range moves {
		v := m.v
		v.movedNow = true
		v.code = CodeDefragment
		v.forTeam = j.tf.team.name
		if !slices.Contains(v.forJobs, j.name) {
			v.forJobs = append(v.forJobs, j.name)
		}
		v.lastResize = s.now
	}
	s.admit(j, s.findNodes(j, j.sp.min), CodeReclaim)
	return true
}

// defrag clears nodes for j by moving single-node jobs elsewhere. On
// success j fits (findNodes finds its nodes); on failure nothing changed.
func (s *sched) defrag(j *jobRT) ([]move, bool) {
	f := j.fl
	need := 1
	var targets []*nodeRT
	if j.exclusive {
		// Whole nodes already free count, and are kept out of the moves.
		targets = slices.Clone(f.pickWhole(j.per, j.vcpu, j.mem, j.sp.min, s.scratch[:0]))
		need = j.sp.min
		for _, n := range targets {
			n.usable = false
			n.reindex()
		}
	}
	restore := func() {
		for _, n := range targets {
			n.usable = true
			n.reindex()
		}
	}
	if len(targets) >= need {
		restore()
		return nil, true
	}
	// A job moves at most once per stable period: one never resized or
	// moved since admission may move; one resized or moved before only
	// after the stable period.
	movable := func(v *jobRT) bool {
		return !v.exclusive && !v.movedNow && !v.shrunkNow && v.size == 1 &&
			(v.admittedNow || v.since.Equal(v.lastResize) || s.stable <= 0 || s.now.Sub(v.lastResize) >= s.stable)
	}
	type cand struct {
		n    *nodeRT
		cost int
		take []*jobRT
	}
	var cands []cand
	for _, sh := range f.shapes {
		if sh.cap < j.per {
			continue
		}
		for _, n := range sh.nodes {
			if !n.usable || n.exclusive || len(n.jobs) == 0 {
				continue
			}
			var take []*jobRT
			free := n.free()
			fitsNow := func(free, vfree int, mfree int64) bool {
				return free >= j.per && (j.vcpu == 0 || n.vcpuCap == 0 || vfree >= j.vcpu) && (j.mem == 0 || n.memCap == 0 || mfree >= j.mem)
			}
			okNode := true
			if j.exclusive {
				// Every tenant must go, largest first.
				take = slices.Clone(n.jobs)
				slices.SortFunc(take, func(a, b *jobRT) int {
					if a.per != b.per {
						return b.per - a.per
					}
					return strings.Compare(a.name, b.name)
				})
				for _, v := range take {
					okNode = okNode && movable(v)
				}
				free = n.cap
			} else {
				// The fewest accelerators that close the gap: the smallest
				// single tenant that does, else smallest first.
				ts := slices.Clone(n.jobs)
				slices.SortFunc(ts, func(a, b *jobRT) int {
					if a.per != b.per {
						return a.per - b.per
					}
					return strings.Compare(a.name, b.name)
				})
				vfree, mfree := n.vcpuCap-n.vcpuUsed, n.memCap-n.memUsed
				for _, v := range ts {
					if movable(v) && fitsNow(free+v.per, vfree+v.vcpu, mfree+v.mem) {
						take = []*jobRT{v}
						free += v.per
						break
					}
				}
				if take == nil {
					for _, v := range ts {
						if fitsNow(free, vfree, mfree) {
							break
						}
						if movable(v) {
							take = append(take, v)
							free += v.per
							vfree += v.vcpu
							mfree += v.mem
						}
					}
					okNode = fitsNow(free, vfree, mfree)
				}
			}
			cost := 0
			for _, v := range take {
				cost += v.per
			}
			if okNode && free >= j.per {
				cands = append(cands, cand{n, cost, take})
			}
		}
	}
	if len(targets)+len(cands) < need {
		restore()
		return nil, false
	}
	slices.SortStableFunc(cands, func(a, b cand) int { return a.cost - b.cost })
	var moves []move
	undo := func(ms []move) {
		for i := len(ms) - 1; i >= 0; i-- {
			s.moveJob(ms[i].v, ms[i].to, ms[i].from)
		}
	}
	tries := 0
	for _, c := range cands {
		if len(targets) == need || tries > 4*need+8 {
			break
		}
		tries++
		c.n.usable = false
		c.n.reindex()
		var mine []move
		ok := true
		for _, v := range c.take {
			to := f.pickFrac(v.per, v.vcpu, v.mem)
			if to == nil {
				ok = false
				break
			}
			s.moveJob(v, c.n, to)
			mine = append(mine, move{v, c.n, to})
		}
		if !ok {
			undo(mine)
			c.n.usable = true
			c.n.reindex()
			continue
		}
		moves = append(moves, mine...)
		targets = append(targets, c.n)
	}
	restore()
	if len(targets) < need || !s.canPlace(j, j.sp.min) {
		undo(moves)
		return nil, false
	}
	return moves, true
}

// grow is rule 7.
func (s *sched) grow(f *flavorRT) {
	type teamJobs struct {
		tf   *teamFlavor
		jobs *heap[*jobRT]
	}
	byTeam := map[*teamFlavor]*teamJobs{}
	var order []*teamJobs
	for _, j := range f.jobs {
		if !j.spec.Elastic || j.size == 0 || j.shrunkNow || j.preemptedNow || !j.exclusive {
			continue
		}
		if j.nextSize(j.size) == 0 {
			j.growBlock = CodeAtMax
			continue
		}
		if !j.admittedNow && s.stable > 0 && s.now.Sub(j.lastResize) < s.stable {
			j.growBlock = CodeStablePeriod
			continue
		}
		tj := byTeam[j.tf]
		if tj == nil {
			tj = &teamJobs{tf: j.tf, jobs: newHeap(func(a, b *jobRT) bool {
				if a.sp.prio != b.sp.prio {
					return a.sp.prio > b.sp.prio
				}
				if a.size != b.size {
					return a.size < b.size
				}
				return jobOrder(a, b) < 0
			})}
			byTeam[j.tf] = tj
			order = append(order, tj)
		}
		tj.jobs.push(j)
	}
	th := newHeap(func(a, b *teamJobs) bool { return teamKey(a.tf, b.tf) < 0 })
	for _, tj := range order {
		th.push(tj)
	}
	for th.len() > 0 {
		tj := th.top()
		j := tj.jobs.top()
		if s.growStep(j) {
			tj.jobs.fix(0)
			th.fix(0)
			continue
		}
		tj.jobs.pop()
		if tj.jobs.len() == 0 {
			th.pop()
		}
	}
}

func (s *sched) growStep(j *jobRT) bool {
	nx := j.nextSize(j.size)
	if nx == 0 {
		j.growBlock = CodeAtMax
		return false
	}
	d := nx - j.size
	tf := j.tf
	acc := d * j.per
	if c := s.quotaCheck(tf, acc, d*j.vcpu, int64(d)*j.mem, false); c != "" {
		j.growBlock = c
		return false
	}
	nodes := s.findNodes(j, d)
	if nodes == nil {
		j.growBlock = CodeNoCapacity
		return false
	}
	for _, n := range nodes {
		s.attach(j, n)
	}
	if tf.used > tf.nominal {
		j.grewBorrow = true
	}
	j.grownNow = true
	j.growBlock = ""
	j.lastResize = s.now
	return true
}

// heap is a small binary heap.
type heap[T any] struct {
	items []T
	less  func(a, b T) bool
}

func newHeap[T any](less func(a, b T) bool) *heap[T] { return &heap[T]{less: less} }

func (h *heap[T]) len() int { return len(h.items) }
func (h *heap[T]) top() T   { return h.items[0] }

func (h *heap[T]) push(x T) {
	h.items = append(h.items, x)
	h.up(len(h.items) - 1)
}

func (h *heap[T]) pop() T {
	x := h.items[0]
	n := len(h.items) - 1
	h.items[0] = h.items[n]
	h.items = h.items[:n]
	if n > 0 {
		h.down(0)
	}
	return x
}

func (h *heap[T]) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h *heap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.items[i], h.items[p]) {
			return
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

func (h *heap[T]) down(i int) bool {
	start := i
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && h.less(h.items[r], h.items[l]) {
			c = r
		}
		if !h.less(h.items[c], h.items[i]) {
			break
		}
		h.items[i], h.items[c] = h.items[c], h.items[i]
		i = c
	}
	return i > start
}

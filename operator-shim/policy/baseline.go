package policy

import (
	"fmt"
	"sort"
	"time"
)

// Baselines: the policies a platform team would run without hyperpodrun,
// each a pure function from a State to a Decision like Schedule, so that
// the simulator (operator-shim/sim) measures them on the same trace, the
// same fleet and the same placement rules:
//
//   - Kueue: Kueue's ClusterQueues (kueue.go);
//   - BatchFairShare: AWS Batch's fair-share job queues (batchshare.go);
//   - FIFO: every team strictly first-in first-out within its own nominal
//     quota, no lending, no borrowing, no preemption (FIFO, kueue.go).
//
// All of them run every job at a static size (Job.MinNodes; no resizing,
// no moves) and place it as the engine does: a job of more than one node,
// or one that fills a node, takes whole free nodes; a smaller single-node
// job is packed best-fit. A job that can never run (larger than anything
// its team can ever get) is rejected (Reason kind Invalid, code
// QuotaExceeded, message "rejected: ...") instead of blocking its queue.

// bnode is a node in a baseline cycle.
type bnode struct {
	name  string
	accel int
	free  int
}

// bjob is a job in a baseline cycle.
type bjob struct {
	spec      *Job
	name      string
	team      string
	flavor    string
	prio      int
	submit    time.Time
	per       int
	size      int
	exclusive bool
	gpus      int
	// running: it holds nodes (carried over or admitted in this cycle).
	running bool
	// wasRunning: it held an allocation coming into the cycle.
	wasRunning bool
	nodes      []*bnode
	since      time.Time
	lastResize time.Time
	reason     Reason
}

// bcycle is one baseline cycle: the indexed input and the jobs' outcomes.
type bcycle struct {
	now      time.Time
	cfg      Config
	teams    map[string]*Team
	nodes    map[string][]*bnode // by flavor, by name
	byName   map[string]*bnode
	jobs     []*bjob // by name
	jobBy    map[string]*bjob
	usage    map[[2]string]int // team, flavor -> accelerators held
	problems []Problem
	released []string
}

// newCycle validates and indexes st and carries the allocations over.
func newCycle(st State) *bcycle {
	c := &bcycle{now: st.Now, cfg: st.Config, teams: map[string]*Team{}, nodes: map[string][]*bnode{},
		byName: map[string]*bnode{}, jobBy: map[string]*bjob{}, usage: map[[2]string]int{}}
	for i := range st.Teams {
		t := &st.Teams[i]
		if err := t.Validate(); err != nil {
			c.problems = append(c.problems, Problem{Object: "team", Name: t.Name, Error: err.Error()})
			continue
		}
		c.teams[t.Name] = t
	}
	for _, n := range st.Nodes {
		a := n.HealthyAccelerators()
		if n.Name == "" || a <= 0 || c.byName[n.Name] != nil {
			continue
		}
		bn := &bnode{name: n.Name, accel: a, free: a}
		c.byName[n.Name] = bn
		c.nodes[n.Flavor] = append(c.nodes[n.Flavor], bn)
	}
	for _, ns := range c.nodes {
		sort.Slice(ns, func(a, b int) bool { return ns[a].name < ns[b].name })
	}
	for i := range st.Jobs {
		c.addJob(&st.Jobs[i])
	}
	sort.Slice(c.jobs, func(a, b int) bool { return c.jobs[a].name < c.jobs[b].name })
	for _, a := range st.Allocations {
		c.carry(a)
	}
	return c
}

// addJob indexes one job (invalid ones get a reason and are not scheduled).
func (c *bcycle) addJob(spec *Job) {
	j := &bjob{spec: spec, name: spec.Name, team: spec.Team, submit: spec.SubmitTime}
	j.reason = Reason{Job: j.name, Team: j.team, Kind: KindPending}
	if c.jobBy[j.name] != nil {
		c.problems = append(c.problems, Problem{Object: "job", Name: j.name, Error: "duplicate job name"})
		return
	}
	c.jobBy[j.name] = j
	c.jobs = append(c.jobs, j)
	prio, err := spec.ResolvePriority(c.cfg)
	if err == nil {
		err = spec.Validate(c.cfg)
	}
	if err != nil {
		j.reject(CodeInvalidSpec, err.Error())
		return
	}
	t := c.teams[j.team]
	if t == nil {
		j.reject(CodeTeamNotFound, fmt.Sprintf("team %q does not exist", j.team))
		return
	}
	j.prio, j.flavor = prio, spec.Flavor
	if j.flavor == "" && len(t.Quotas) == 1 {
		j.flavor = t.Quotas[0].Flavor
	}
	j.per = spec.PerNode.Accelerators
	j.size, _ = spec.Bounds()
	j.size = max(1, j.size)
	j.gpus = j.per * j.size
	maxAccel := 0
	for _, n := range c.nodes[j.flavor] {
		maxAccel = max(maxAccel, n.accel)
	}
	j.exclusive = j.size > 1 || j.per >= maxAccel
	if spec.Suspended {
		j.reason.Kind, j.reason.Code, j.reason.Message = KindSuspended, CodeSuspended, "suspended by the user"
	}
}

// reject marks a job that can never run.
func (j *bjob) reject(code ReasonCode, msg string) {
	j.reason.Kind, j.reason.Code, j.reason.Message = KindInvalid, code, "rejected: "+msg
}

// schedulable reports whether the cycle may admit or keep the job.
func (j *bjob) schedulable() bool {
	return j.reason.Kind != KindInvalid && j.reason.Kind != KindSuspended
}

// carry keeps an allocation whose job still exists, on nodes that still
// have room for it; otherwise the job is requeued (or released).
func (c *bcycle) carry(a Allocation) {
	j := c.jobBy[a.Job]
	if j == nil {
		c.released = append(c.released, a.Job)
		return
	}
	if !j.schedulable() || j.running {
		return
	}
	var nodes []*bnode
	for _, name := range a.Nodes {
		n := c.byName[name]
		if n == nil || n.free < j.per {
			for _, m := range nodes {
				m.free += j.per
			}
			return // lost a node: requeued (static jobs are not repaired)
		}
		n.free -= j.per
		nodes = append(nodes, n)
	}
	j.nodes, j.running, j.wasRunning = nodes, true, true
	j.since, j.lastResize = a.Since, a.LastResize
	c.usage[[2]string{j.team, j.flavor}] += j.gpus
	j.reason.Kind, j.reason.Code, j.reason.Message = KindRunning, "", "running"
	j.reason.FromSize, j.reason.ToSize = j.size, j.size
}

// place finds nodes for j without taking them (nil: none fit).
func (c *bcycle) place(j *bjob) []*bnode {
	ns := c.nodes[j.flavor]
	if j.exclusive {
		var out []*bnode
		for _, n := range ns {
			if n.free == n.accel && n.accel >= j.per {
				out = append(out, n)
				if len(out) == j.size {
					return out
				}
			}
		}
		return nil
	}
	var best *bnode
	for _, n := range ns {
		if n.free >= j.per && (best == nil || n.free < best.free) {
			best = n
		}
	}
	if best == nil {
		return nil
	}
	return []*bnode{best}
}

// placeable reports whether j could ever be placed on the flavor's nodes
// (all of them free).
func (c *bcycle) placeable(j *bjob) bool {
	fit := 0
	for _, n := range c.nodes[j.flavor] {
		if n.accel >= j.per {
			fit++
		}
	}
	if j.exclusive {
		return fit >= j.size
	}
	return fit > 0
}

// start admits j on nodes.
func (c *bcycle) start(j *bjob, nodes []*bnode, code ReasonCode, msg string) {
	for _, n := range nodes {
		n.free -= j.per
	}
	j.nodes, j.running = nodes, true
	j.since, j.lastResize = c.now, c.now
	c.usage[[2]string{j.team, j.flavor}] += j.gpus
	j.reason.Kind, j.reason.Code, j.reason.Message = KindAdmitted, code, msg
	j.reason.FromSize, j.reason.ToSize = 0, j.size
}

// stop takes j's nodes away (a preemption, or a trial one).
func (c *bcycle) stop(j *bjob) {
	for _, n := range j.nodes {
		n.free += j.per
	}
	j.running = false
	c.usage[[2]string{j.team, j.flavor}] -= j.gpus
}

// resume gives a stopped j its nodes back (undoing a trial stop).
func (c *bcycle) resume(j *bjob) {
	for _, n := range j.nodes {
		n.free -= j.per
	}
	j.running = true
	c.usage[[2]string{j.team, j.flavor}] += j.gpus
}

// pending is the schedulable jobs without nodes, in admission order
// (priority, then submit time, then name).
func (c *bcycle) pending() []*bjob {
	var out []*bjob
	for _, j := range c.jobs {
		if !j.running && j.schedulable() {
			out = append(out, j)
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return before(out[a], out[b]) })
	return out
}

// before is the admission order: higher priority, then earlier submission.
func before(a, b *bjob) bool {
	if a.prio != b.prio {
		return a.prio > b.prio
	}
	if !a.submit.Equal(b.submit) {
		return a.submit.Before(b.submit)
	}
	return a.name < b.name
}

// decision renders the cycle's outcome.
func (c *bcycle) decision() Decision {
	d := Decision{Now: c.now, Released: c.released, Problems: c.problems}
	for _, j := range c.jobs {
		if j.running {
			a := Allocation{Job: j.name, Team: j.team, Flavor: j.flavor, Size: j.size, AcceleratorsPerNode: j.per,
				Since: j.since, LastResize: j.lastResize}
			for _, n := range j.nodes {
				a.Nodes = append(a.Nodes, n.name)
			}
			d.Allocations = append(d.Allocations, a)
		} else if j.wasRunning && j.reason.Kind == KindRunning {
			j.reason.Kind, j.reason.Code, j.reason.Message = KindPending, CodeNodeLost, "a node of the allocation was lost; requeued"
			j.reason.ToSize = 0
		}
		d.Reasons = append(d.Reasons, j.reason)
	}
	teams := make([]string, 0, len(c.teams))
	for n := range c.teams {
		teams = append(teams, n)
	}
	sort.Strings(teams)
	for _, n := range teams {
		t := c.teams[n]
		for _, q := range t.Quotas {
			u := c.usage[[2]string{n, q.Flavor}]
			tu := TeamUsage{Team: n, Cohort: t.Cohort, Flavor: q.Flavor, Nominal: q.Nominal, Used: u, Borrowed: max(0, u-q.Nominal)}
			for _, j := range c.jobs {
				if j.team == n && j.flavor == q.Flavor && j.schedulable() {
					if j.running {
						tu.Running++
					} else {
						tu.Pending++
						tu.PendingAccelerators += j.gpus
					}
				}
			}
			d.Teams = append(d.Teams, tu)
		}
	}
	return d
}

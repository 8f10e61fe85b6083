package coordinator

import (
	"context"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// plan is what one cycle writes: the etcd operations, one unit per job (a
// job's ops stay in one transaction where they fit), and the changes to
// the view they imply. Building a plan changes nothing; the view takes its
// changes (view.applyPlan) only once a committer wrote every unit, so a
// failed commit leaves the view as it was.
type plan struct {
	units [][]clientv3.Op
	// moves and takes are where the units that put a job on a node it did
	// not hold begin: first those of jobs that also leave a node (moved),
	// then the others. Each phase is committed after every unit before it,
	// so no node is assigned to a job before the job it is taken from (a
	// preempted, stopped, shrunk or moved one) has left it in etcd, even
	// when a transaction fails half way. (A move goes to a node that is
	// free or freed by a release: the engine never moves a job onto a node
	// another move clears.)
	moves, takes int
	// changed counts the desired records written by the kind of their
	// decision; again says a follow-up cycle is due (a job was
	// preempted); running are the jobs placed (JobCredentials only);
	// waited are the pending times of the jobs admitted.
	changed map[policy.ReasonKind]int
	again   bool
	running map[string]bool
	waited  []time.Duration

	// The view's changes, in the order they were planned.
	desired  []fleet.Desired
	assign   []assignEdit
	unassign []string                 // jobs all of whose assignments go
	statuses map[string]*fleet.Status // nil: deleted
	events   []evPut
	pruned   []evDel
	usage    []api.TeamUsage // when setUsage
	setUsage bool
	// The decision the next cycle diffs against, and the jobs it checks
	// in full (their write was skipped).
	allocs  []api.Allocation
	reasons []policy.Reason
	touched map[string]bool
	// deferred are the status writes of jobs that wait or run before and
	// after with another explanation, and of new waiting jobs with their
	// first events (explanationOnly): written by settle unless a follow-up
	// cycle comes (it explains them again).
	deferred []deferredStatus
	// held are the new jobs whose first status a follow-up explains
	// again (settle): the pending time when one is admitted counts from
	// the chain's first sight, and the status's Since from the held one's
	// while its kind and code stay (view.held).
	held map[string]heldFirst
}

// deferredStatus is one status write settle holds back, with the event
// of a new job's first status (ev, when evOK; first: the job is new, seen
// by the chain first at seen).
type deferredStatus struct {
	job   string
	s     *fleet.Status
	ops   []clientv3.Op
	ev    evPut
	evOK  bool
	first bool
	seen  time.Time
}

// heldFirst is a new job's first status a cycle held for its follow-up,
// and when the chain first saw the job.
type heldFirst struct {
	s    *fleet.Status
	seen time.Time
}

// settle decides the deferred status writes once the cycle knows whether
// a follow-up cycle comes at once (followed): then they wait for it (it
// compares those jobs in full and writes what it decides), else they are
// written. A cycle that changes allocations re-explains thousands of
// waiting jobs (the capacity it freed) that its follow-up explains back
// (issue 27: 2,000-3,000 status writes each way per churn round at 20,000
// nodes), the running jobs it cannot grow, and the jobs it sees for the
// first time (explanationOnly). A new job's first event is held with its
// status (the follow-up sees the job still without one and records its
// own, or none if it admits the job); the other events are not.
func (p *plan) settle(followed bool) {
	var units [][]clientv3.Op
	for _, d := range p.deferred {
		if followed {
			p.touched[d.job] = true
			if d.first {
				if p.held == nil {
					p.held = map[string]heldFirst{}
				}
				p.held[d.job] = heldFirst{d.s, d.seen}
			}
			continue
		}
		units = append(units, d.ops)
		p.statuses[d.job] = d.s
		if d.evOK {
			p.events = append(p.events, d.ev)
		}
	}
	// Before the taking phases: a status waits for no placement.
	p.units = slices.Insert(p.units, p.moves, units...)
	p.moves += len(units)
	p.takes += len(units)
	p.deferred = nil
}

// assignEdit puts (or, del, deletes) job's assignment on node.
type assignEdit struct {
	job, node string
	gen       int64
	del       bool
}

// committer writes a plan's units to etcd, as Nomad's Planner submits a
// plan: written counts the ops written. On an error some units may be
// written and others not: the caller reads the view again.
type committer interface {
	commit(ctx context.Context, p *plan) (written int, err error)
}

// etcdCommitter commits in transactions of at most maxTxnOps ops, each
// guarded by leadership, with deadlines (Coordinator.commit).
type etcdCommitter struct {
	c      *Coordinator
	leader clientv3.Cmp
}

func (e etcdCommitter) commit(ctx context.Context, p *plan) (int, error) {
	return e.c.commit(ctx, e.leader, p.units, p.moves, p.takes)
}

// commitPlan commits p and, once every unit is written, applies it to the
// view; on an error the view is as it was before p.
func (c *Coordinator) commitPlan(ctx context.Context, cm committer, p *plan) (int, error) {
	n, err := cm.commit(ctx, p)
	if err != nil {
		return n, err
	}
	// The last decision's lists are read no more once the view takes
	// this one's: the engine's fast path renders into them.
	if v := c.view; v.haveLast {
		c.engine.Recycle(policy.Decision{Reasons: v.lastReasons, Allocations: v.lastAllocs})
	}
	c.view.applyPlan(p)
	c.waited = append(c.waited[:0], p.waited...)
	return n, nil
}

// applyPlan records a committed plan in the view.
func (v *view) applyPlan(p *plan) {
	for _, nd := range p.desired {
		v.setDesired(nd)
	}
	for _, e := range p.assign {
		if e.del {
			delete(v.assigned[e.job], e.node)
		} else {
			v.assign(e.job, e.node, e.gen)
		}
	}
	for _, job := range p.unassign {
		delete(v.assigned, job)
	}
	for job, s := range p.statuses {
		if s == nil {
			delete(v.statuses, job)
		} else {
			v.statuses[job] = s
		}
	}
	for _, e := range p.events {
		v.events.put(e)
	}
	v.events.remove(p.pruned)
	if p.setUsage {
		v.usage = p.usage
	}
	v.haveLast = true
	v.lastAllocs, v.lastReasons = p.allocs, p.reasons
	v.touched = p.touched
	v.held = p.held
}

// planner builds one plan from a decision and the view, in phases: the
// placed jobs' desired records and assignments, the stopped jobs' stop
// records, the assignments of jobs placed nowhere, the released jobs'
// statuses, every job's status and event, the usage, the history's bound.
type planner struct {
	c    *Coordinator
	v    *view
	d    policy.Decision
	full bool // compare every job with the view, not only the changed
	p    *plan
	// unit holds each job's ops, order the jobs in the order planned.
	unit  map[string][]clientv3.Op
	order []string
	// retry are the jobs whose write was skipped: checked in full next
	// cycle.
	retry     map[string]bool
	placedIdx map[string]bool // full only
	// takes are the jobs whose unit assigns them a node they did not
	// hold; leaves those whose unit deletes an assignment of theirs.
	takes, leaves map[string]bool
	// desired are the desired records this plan writes, by job.
	desired map[string]fleet.Desired
}

// plan turns a decision into the etcd writes it needs, one unit of ops
// per job, and the view changes they imply: a job's desired record and
// its assignments only when its allocation changed, its status only when
// a stable field changed (not the message's usage figures), a
// deduplicated event, the usage only when it changed.
//
// Unless full, it visits only the jobs whose decision changed since the
// last cycle's (both lists are in name order: one merge, no lookup per
// job) and the jobs whose records the view changed meanwhile; the first
// cycle after a read compares every job with the view (full).
func (c *Coordinator) plan(d policy.Decision, full bool) *plan {
	pl := &planner{c: c, v: c.view, d: d, full: full, unit: map[string][]clientv3.Op{}, retry: map[string]bool{}, takes: map[string]bool{}, leaves: map[string]bool{}, desired: map[string]fleet.Desired{},
		p: &plan{changed: map[policy.ReasonKind]int{}, statuses: map[string]*fleet.Status{}}}
	if full {
		pl.placedIdx = make(map[string]bool, len(d.Allocations))
		for _, a := range d.Allocations {
			pl.placedIdx[a.Job] = true
		}
	}
	left := pl.placeAll()
	candidates := pl.candidates(left)
	pl.stopAll(candidates)
	pl.unassignAll(candidates)
	pl.releaseStatuses()
	pl.statusesAndEvents()
	pl.planUsage()
	return pl.finish()
}

// add appends op to job's unit; a record that cannot be encoded is
// skipped, and the job checked in full next cycle.
func (pl *planner) add(job string, op clientv3.Op, err error) bool {
	if err != nil {
		pl.c.log.Error("cannot encode a record; skipped", "job", job, "err", err)
		pl.retry[job] = true
		return false
	}
	if _, ok := pl.unit[job]; !ok {
		pl.order = append(pl.order, job)
	}
	pl.unit[job] = append(pl.unit[job], op)
	return true
}

// placed reports whether the decision places job.
func (pl *planner) placed(job string) bool {
	if pl.placedIdx != nil {
		return pl.placedIdx[job]
	}
	_, ok := slices.BinarySearchFunc(pl.d.Allocations, job, func(a api.Allocation, job string) int { return strings.Compare(a.Job, job) })
	return ok
}

// placeAll plans the placed jobs' writes; it returns the jobs placed by
// the last decision and not by this one (unless full). The decision's
// allocations are in job name order (policy.Decision's contract): merged
// with the last decision's.
func (pl *planner) placeAll() (left []string) {
	v, d := pl.v, pl.d
	last, li := v.lastAllocs, 0
	for i := range d.Allocations {
		a := d.Allocations[i]
		if !pl.full {
			for li < len(last) && last[li].Job != a.Job && last[li].Job < a.Job {
				left = append(left, last[li].Job)
				li++
			}
			if li < len(last) && last[li].Job == a.Job {
				same := sameAllocation(last[li], a)
				li++
				if same && !v.touched[a.Job] {
					continue // written as it is last cycle
				}
			}
		}
		pl.place(a)
	}
	if !pl.full {
		for ; li < len(last); li++ {
			left = append(left, last[li].Job)
		}
	}
	return left
}

// place plans one placed job's desired record (when its allocation or uid
// changed) and its assignments (new nodes, and all of them with a new
// uid; the nodes it left lose theirs).
func (pl *planner) place(a api.Allocation) {
	c, v, p := pl.c, pl.v, pl.p
	prev, had := v.desired[a.Job]
	uid := c.uidOf(a.Job, prev.UID)
	// A job's uid changes only when it gets its first (or the range
	// changed): its assignments are written again with it.
	newUID := prev.UID != uid
	gen := prev.Generation
	if !had || !prev.Running() || !sameAllocation(prev.Allocation, a) || newUID {
		nd := fleet.Desired{Allocation: a, Generation: prev.Generation + 1, UID: uid}
		r, _ := pl.d.Reason(a.Job)
		if !prev.Running() || prev.Size != a.Size {
			nd.TraceParent = c.decisionSpan(pl.d.Now, r, prev.Target(), a.Size)
		}
		// The admission explains the allocation (the status the record
		// implies once the job runs as placed); a resize, a move or a
		// repair has its own status record while it is news, and the
		// record then says only where the job runs (fleet.ImpliedStatus).
		// A new uid alone keeps the explanation.
		if r.Kind == policy.KindAdmitted || r.Kind == policy.KindRunning {
			nd.Message = r.Message
		}
		if had && prev.Running() && sameAllocation(prev.Allocation, a) {
			nd.Message = prev.Message
		}
		op, err := c.store.PutDesiredOp(nd)
		if pl.add(a.Job, op, err) {
			p.desired = append(p.desired, nd)
			pl.desired[a.Job] = nd
			gen = nd.Generation
			p.changed[r.Kind]++
		}
	}
	have := v.assigned[a.Job]
	for _, n := range a.Nodes {
		if g, ok := have[n]; ok && g >= 0 && !newUID {
			continue // placed earlier: its generation says when
		}
		op, err := c.store.PutAssignmentRecordOp(n, fleet.Assignment{Job: a.Job, Generation: gen, UID: uid, Creds: c.creds[a.Job]})
		if pl.add(a.Job, op, err) {
			p.assign = append(p.assign, assignEdit{job: a.Job, node: n, gen: gen})
			if _, held := have[n]; !held {
				pl.takes[a.Job] = true
			}
		}
	}
	for n := range have {
		if !slices.Contains(a.Nodes, n) {
			pl.add(a.Job, c.store.DeleteAssignmentOp(n, a.Job), nil)
			p.assign = append(p.assign, assignEdit{job: a.Job, node: n, del: true})
			pl.leaves[a.Job] = true
		}
	}
}

// candidates are the jobs that may have stopped (unless full, when every
// job in the view is one): those placed last cycle and not now, and the
// touched, in name order.
func (pl *planner) candidates(left []string) []string {
	if pl.full {
		return nil
	}
	candidates := left
	for job := range pl.v.touched {
		candidates = append(candidates, job)
	}
	slices.Sort(candidates)
	return slices.Compact(candidates)
}

// stopAll plans the stop records of the running jobs the decision no
// longer places: preempted, suspended or deleted.
func (pl *planner) stopAll(candidates []string) {
	v := pl.v
	var stopped []string
	if pl.full {
		for job, prev := range v.desired {
			if !pl.placedIdx[job] && prev.Running() {
				stopped = append(stopped, job)
			}
		}
	} else {
		for _, job := range candidates {
			if prev := v.desired[job]; !pl.placed(job) && prev.Running() {
				stopped = append(stopped, job)
			}
		}
	}
	sort.Strings(stopped)
	for _, job := range stopped {
		pl.stop(job)
	}
}

// stop plans one job's stop record. The workers are told "preemption" or
// "shutdown", with the reason, rather than "drain": the stop travels in
// the same record that takes the nodes away.
func (pl *planner) stop(job string) {
	c, p := pl.c, pl.p
	prev := pl.v.desired[job]
	stop := fleet.Stop{Kind: fleet.StopShutdown, Reason: "the job finished or was deleted"}
	r, ok := pl.d.Reason(job)
	if ok {
		stop.Reason = r.Message
		if r.Kind == policy.KindPreempted {
			stop.Kind = fleet.StopPreemption
		}
	}
	nd := fleet.Desired{
		Allocation: api.Allocation{Job: job, Team: prev.Team, Flavor: prev.Flavor},
		Generation: prev.Generation + 1, Stop: &stop,
		UID: prev.UID, // held until the job is forgotten
	}
	nd.TraceParent = c.decisionSpan(pl.d.Now, r, prev.Size, 0)
	op, err := c.store.PutDesiredOp(nd)
	if pl.add(job, op, err) {
		p.desired = append(p.desired, nd)
		pl.desired[job] = nd
		kind := r.Kind
		if !ok {
			kind = "Released"
		}
		p.changed[kind]++
	}
}

// unassignAll plans the deletion of the assignments of jobs placed
// nowhere (stopped, or left by an earlier coordinator).
func (pl *planner) unassignAll(candidates []string) {
	v := pl.v
	drop := func(job string) {
		for n := range v.assigned[job] {
			pl.add(job, pl.c.store.DeleteAssignmentOp(n, job), nil)
		}
		pl.p.unassign = append(pl.p.unassign, job)
	}
	if pl.full {
		jobs := make([]string, 0, len(v.assigned))
		for job := range v.assigned {
			if !pl.placedIdx[job] {
				jobs = append(jobs, job)
			}
		}
		sort.Strings(jobs)
		for _, job := range jobs {
			drop(job)
		}
		return
	}
	for _, job := range candidates {
		if _, has := v.assigned[job]; has && !pl.placed(job) {
			drop(job)
		}
	}
}

// releaseStatuses plans the deletion of the statuses of the jobs the
// engine released (they no longer exist).
func (pl *planner) releaseStatuses() {
	for _, job := range pl.d.Released {
		if _, had := pl.v.statuses[job]; had {
			pl.add(job, pl.c.store.DeleteStatusOp(job), nil)
			pl.p.statuses[job] = nil
		}
	}
}

// status is job's status before this plan's statuses and events (its
// status record as the plan leaves it so far, else the status its desired
// record in the view implies: fleet.StatusOf).
func (pl *planner) status(job string) (*fleet.Status, bool) {
	if s, ok := pl.record(job); ok {
		return s, true
	}
	if d, ok := pl.v.desired[job]; ok {
		if s, ok := fleet.ImpliedStatus(&d); ok {
			return &s, true
		}
	}
	return nil, false
}

// record is job's status record as the plan leaves it so far.
func (pl *planner) record(job string) (*fleet.Status, bool) {
	if s, ok := pl.p.statuses[job]; ok {
		return s, s != nil
	}
	s, ok := pl.v.statuses[job]
	return s, ok
}

// implied reports whether job's desired record, as this plan leaves it,
// implies status sr (fleet.ImpliedStatus): then the job needs no status
// record.
func (pl *planner) implied(job string, sr *policy.Reason) bool {
	d, ok := pl.desired[job]
	if !ok {
		d, ok = pl.v.desired[job]
	}
	if !ok {
		return false
	}
	s, ok := fleet.ImpliedStatus(&d)
	return ok && stable(&s.Reason, sr)
}

// statusesAndEvents plans every job's status (when a stable field
// changed) and event (deduplicated).
func (pl *planner) statusesAndEvents() {
	d, c, p := pl.d, pl.c, pl.p
	now := d.Now
	var none fleet.Status
	lastR, k := pl.v.lastReasons, 0
	for i := range d.Reasons {
		r := &d.Reasons[i]
		p.again = p.again || r.Kind == policy.KindPreempted
		if !pl.full {
			// Equality first: the lists mostly name the same jobs, and
			// an equal name (the same bytes) is cheaper than an order.
			for k < len(lastR) && lastR[k].Job != r.Job && lastR[k].Job < r.Job {
				k++
			}
			// The status written (or kept) last cycle is stable-equal to
			// the last decision: the same again needs no write and no
			// event.
			if k < len(lastR) && lastR[k].Job == r.Job && stable(&lastR[k], r) && !event(*r, lastR[k], true) && !pl.v.touched[r.Job] {
				continue
			}
		}
		prev, had := pl.status(r.Job)
		if !had {
			prev = &none
		}
		if c.followUp && had && (r.Kind == policy.KindRunning || r.Kind == policy.KindPending) &&
			(len(prev.For) > 0 || prev.ForTeam != "") && !stable(&prev.Reason, r) {
			// A follow-up cycle leaves a status that names who took the
			// job's capacity (shrunk or preempted for whom) as it is while
			// the job runs or waits unchanged, until a cycle caused by an
			// input, a wake or the resync, which compares it in full.
			pl.retry[r.Job] = true
			continue
		}
		// A new job the chain held the first status of waited since the
		// chain's first cycle.
		held, wasHeld := pl.v.held[r.Job]
		wasHeld = wasHeld && !had
		seen := now
		if wasHeld {
			seen = held.seen
		}
		if r.Kind == policy.KindAdmitted && had && prev.Kind == policy.KindPending && !prev.Since.IsZero() {
			p.waited = append(p.waited, now.Sub(prev.Since))
		} else if r.Kind == policy.KindAdmitted && wasHeld {
			p.waited = append(p.waited, now.Sub(seen))
		}
		sr := statusReason(*r)
		evented := event(*r, prev.Reason, had)
		switch changed := !had || !stable(&prev.Reason, &sr); {
		case changed && pl.implied(r.Job, &sr):
			// The desired record says it: no status record (the one the
			// job had goes).
			if _, rec := pl.record(r.Job); rec {
				pl.add(r.Job, c.store.DeleteStatusOp(r.Job), nil)
				p.statuses[r.Job] = nil
			}
		case changed:
			s := &fleet.Status{Reason: sr, Time: now, Since: now}
			if had && prev.Kind == sr.Kind && prev.Code == sr.Code && r.Kind != policy.KindAdmitted {
				s.Since = prev.Since
			} else if wasHeld && held.s.Kind == sr.Kind && held.s.Code == sr.Code {
				s.Since = held.s.Since
			}
			op, err := c.store.PutStatusOp(*s)
			if err == nil && explanationOnly(prev, r, had) && len(pl.unit[r.Job]) == 0 {
				h := deferredStatus{job: r.Job, s: s, ops: []clientv3.Op{op}, first: !had, seen: seen}
				if evented {
					// A new job's first: held with its status.
					h.ev = pl.v.events.plan(*r, now, c.cfg.EventDedupWindow)
					evOp, evErr := c.store.PutEventAtOp(h.ev.rec.key, h.ev.rec.e)
					h.ops, h.evOK = append(h.ops, evOp), evErr == nil
				}
				if !evented || h.evOK {
					p.deferred = append(p.deferred, h)
					continue
				}
			}
			if pl.add(r.Job, op, err) {
				p.statuses[r.Job] = s
			}
		}
		if evented {
			e := pl.v.events.plan(*r, now, c.cfg.EventDedupWindow)
			op, err := c.store.PutEventAtOp(e.rec.key, e.rec.e)
			if pl.add(r.Job, op, err) {
				p.events = append(p.events, e)
			}
		}
	}
}

// explanationOnly reports whether r only explains why a job waits or runs
// as it did (prev: its status, had: it has one), or why a job seen for the
// first time waits: a status settle may hold back for a follow-up cycle. A
// running job's status says why it does not grow (no capacity, its cohort
// exhausted), and a cycle that frees capacity says it one way, its
// follow-up the other, and so it may explain a new job's wait. A new job's
// first event is held with its status (statusesAndEvents). Not held: a
// status that names who took the job's capacity. A follow-up leaves such a
// status to the next caused cycle (statusesAndEvents), which may be
// followed and hold it again, each time.
func explanationOnly(prev *fleet.Status, r *policy.Reason, had bool) bool {
	if !had {
		return r.Kind == policy.KindPending
	}
	return prev.Kind == r.Kind && (r.Kind == policy.KindPending || r.Kind == policy.KindRunning) &&
		len(prev.For) == 0 && prev.ForTeam == ""
}

// planUsage plans the teams' usage record when it changed.
func (pl *planner) planUsage() {
	v, d := pl.v, pl.d
	if reflect.DeepEqual(v.usage, d.Teams) || (len(v.usage) == 0 && len(d.Teams) == 0 && v.usage != nil) {
		return
	}
	op, err := pl.c.store.PutUsageOp(d.Teams)
	if pl.add("", op, err) {
		pl.p.usage, pl.p.setUsage = slices.Clone(d.Teams), true
		if pl.p.usage == nil {
			pl.p.usage = []api.TeamUsage{}
		}
	}
}

// finish orders the units by job, adds the history's pruning and what the
// next cycle diffs against.
func (pl *planner) finish() *plan {
	p, d := pl.p, pl.d
	p.units = make([][]clientv3.Op, 0, len(pl.order)+1)
	phase := func(taking, leaving bool) {
		for _, job := range pl.order {
			if pl.takes[job] == taking && (!taking || pl.leaves[job] == leaving) {
				p.units = append(p.units, pl.unit[job])
			}
		}
	}
	phase(false, false)
	// The held events count as written: a follow-up that comes instead
	// writes those jobs' first events (unless it admits or releases one:
	// then the history is pruned an event early).
	puts := p.events
	if len(p.deferred) > 0 {
		puts = slices.Clip(puts)
		for _, h := range p.deferred {
			if h.evOK {
				puts = append(puts, h.ev)
			}
		}
	}
	p.pruned = pl.v.events.pruneKeys(pl.c.cfg.MaxEventsPerJob, pl.c.cfg.MaxEvents, puts)
	p.units = append(p.units, pl.v.events.pruneOps(p.pruned, puts)...)
	p.moves = len(p.units)
	phase(true, true)
	p.takes = len(p.units)
	phase(true, false)
	// The next cycle diffs against this decision. The lists are the
	// engine's, not copied: nothing changes them until the view lets
	// them go (commitPlan hands them back to the engine once it applies
	// the next decision, and the fast path renders into them after).
	p.allocs, p.reasons = d.Allocations, d.Reasons
	delete(pl.retry, "")
	p.touched = pl.retry
	if pl.c.cfg.JobCredentials {
		p.running = make(map[string]bool, len(d.Allocations))
		for _, a := range d.Allocations {
			p.running[a.Job] = true
		}
	}
	return p
}

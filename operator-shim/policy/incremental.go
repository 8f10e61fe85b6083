package policy

import (
	"reflect"
	"slices"
	"strings"
	"time"
)

// Engine runs Schedule and keeps the last cycle's runtime records, so that
// a submit can be decided without a full cycle (Admit): at 20,000 nodes and
// 50,000 jobs a full cycle takes 100-300 ms, most of it rebuilding and
// carrying over what did not change.
//
// The zero Engine is ready to use. It is not safe for concurrent use.
type Engine struct {
	s    *sched
	d    Decision
	cfg  Config
	jobs int // len(State.Jobs) the kept records describe
	// fix: the kept cycle changed no allocation (its result is what the
	// next full cycle on the same inputs starts from and keeps).
	fix bool
	// wake: from then on a time-based rule (the stable period) may change
	// what a full cycle decides.
	wake time.Time
	// admitted are the jobs the last Admit admitted: the next full cycle
	// carries them over (rule 1), and so does the next Admit.
	admitted []*jobRT
	// declined is why the last Admit declined ("" when it decided).
	declined string
	// unsettled: the last Admit preempted (Settled).
	unsettled bool
	// victims are the jobs the last Admit shrunk or preempted: the
	// follow-up cycle requeues the preempted ones (FollowUp).
	victims []*jobRT
	// spareReasons and spareAllocs are the lists of a decision the
	// caller handed back (Recycle): the fast path renders into them.
	spareReasons []Reason
	spareAllocs  []Allocation
}

// Declined says why the last Admit left the decision to a full cycle (""
// when it decided).
func (e *Engine) Declined() string { return e.declined }

// decline drops the kept records and records why.
func (e *Engine) decline(why string) (Decision, bool) {
	e.drop()
	e.declined = why
	return Decision{}, false
}

// Schedule runs a full engine cycle (the package's Schedule) and keeps its
// runtime records for Admit.
func (e *Engine) Schedule(st State) Decision {
	e.drop()
	e.unsettled = false
	s, d := schedule(st)
	e.s, e.d, e.cfg, e.jobs = s, d, st.Config, len(st.Jobs)
	e.fix = len(d.Released) == 0 && steady(d)
	e.wake = time.Time{}
	for i := range s.jobs {
		e.noteWake(&s.jobs[i])
	}
	return d
}

// noteWake moves the wake (when the fast path must leave the decision to
// a full cycle) to the end of j's stable period when that comes sooner
// and may change what a cycle decides (timed). Schedule notes every job;
// Admit notes the jobs it admits, grows or shrinks, whose stable periods
// start with its decision (FollowUp changes no allocation).
func (e *Engine) noteWake(j *jobRT) {
	s := e.s
	if s.stable <= 0 {
		return
	}
	if t := j.lastResize.Add(s.stable); timed(j) && t.After(s.now) && (e.wake.IsZero() || t.Before(e.wake)) {
		e.wake = t
	}
}

// steady reports whether every reason of d is one a job keeps while
// nothing changes (running, waiting, suspended, invalid): no admission,
// resize or preemption.
func steady(d Decision) bool {
	for i := range d.Reasons {
		switch d.Reasons[i].Kind {
		case KindRunning, KindPending, KindSuspended, KindInvalid:
		default:
			return false
		}
	}
	return true
}

// timed reports whether the end of j's stable period may change what a
// cycle decides: an elastic whole-node job may grow then (rule 7), a job
// moved or resized before may be moved again (movable). Any other job
// (never resized or moved since its admission) is movable already.
func timed(j *jobRT) bool {
	return j.size > 0 && ((j.spec.Elastic && j.exclusive) || !j.since.Equal(j.lastResize))
}

// drop forgets the kept records.
func (e *Engine) drop() {
	if e.s != nil {
		putJobs(e.s.jobs)
	}
	e.s, e.d, e.admitted, e.victims = nil, Decision{}, nil, nil
}

// Admit decides the jobs just submitted (st is the kept cycle's input plus
// these jobs, nothing else changed, at a later st.Now) without a full
// cycle, when it can show that the full cycle (Schedule(st)) would decide
// exactly the same: every job fits its team's nominal quota and free
// nodes as they are (rule 2 admits it where rule 2 of the full cycle would),
// or one job beyond it borrows (rule 5) or waits on its quota
// (waitsOnQuota), no job of its team of a higher priority waits in a team
// that preempts lower priorities (rule 6 could preempt it), it has one
// size or is elastic (rule 2 admits it at its minimum), the reservations
// rule 4 makes after it are no smaller than before, and after it is
// placed no elastic job could grow (rule 7; a job admitted in the cycle
// grows at once, its stable period notwithstanding);
// the later rules only take capacity or quota that the admission left
// smaller (rules 3 and 6 are run again on the changed state and must admit
// nothing). One job beyond its team's full quota that rule 6 admits by
// preempting or shrinking lower-priority jobs of its own team
// (preemptFresh) is decided too, and so is one within its team's nominal
// quota for which rule 3 reclaims what the cohort lent to teams that
// borrow (reclaimFresh): Settled is then false, as the full cycle's change
// is followed by another cycle. The kept cycle must
// have changed no allocation (a fixed point), and no stable period may have
// ended since. ok false: run Schedule; the Engine then keeps nothing until
// it does.
//
// The Decision is the full cycle's: allocations, and the reasons of the
// admitted jobs, of their teams' jobs, of the flavor's waiting jobs and
// of its elastic jobs that did not grow, rendered from the same end state.
func (e *Engine) Admit(st State, submitted []string) (Decision, bool) {
	s := e.s
	e.declined, e.unsettled, e.victims = "", false, nil
	switch {
	case s == nil:
		return e.decline("no cycle kept")
	case !e.fix:
		return e.decline("the last cycle changed allocations")
	case !reflect.DeepEqual(st.Config, e.cfg):
		return e.decline("the configuration changed")
	case len(submitted) == 0 || len(st.Jobs) != e.jobs+len(submitted):
		return e.decline("not only the submitted jobs are new")
	case st.Now.Before(s.now) || (!e.wake.IsZero() && !st.Now.Before(e.wake)):
		return e.decline("a stable period ended")
	}
	if !e.repoint(st.Jobs) {
		return e.decline("the jobs are not the kept ones and the submitted ones, in name order")
	}
	var fresh []*jobRT
	for _, name := range submitted {
		j := e.newJob(st, name)
		if j == nil {
			return e.decline("job " + name + ": suspended, invalid, of a size range without elasticity, known already or without a team quota")
		}
		fresh = append(fresh, j)
	}
	// Rule 2's order (the full cycle admits them in this order).
	slices.SortFunc(fresh, jobOrder)
	s.now = st.Now
	// The jobs the last Admit admitted run on as carried over.
	carried := e.admitted
	for _, j := range carried {
		j.prevSize, j.prevNodes = j.size, nodeNames(j)
		j.setCarried()
	}
	preempted := false
	var admitted []*jobRT // waiting jobs admitted after a reclaim
	if j := fresh[0]; len(fresh) == 1 && j.tf.used+j.per*j.sp.min > j.tf.nominal {
		if e.waitsOnQuota(j) {
			e.pendFresh(j)
		} else if why := e.borrowFresh(j); why != "" {
			if !strings.HasPrefix(why, "quota: ") && why != "no free nodes" {
				return e.decline("job " + j.name + ": " + why)
			}
			// Rule 5 passes it by: rule 6 may preempt for it.
			if pwhy := e.preemptFresh(j); pwhy != "" {
				return e.decline("job " + j.name + ": " + why + "; " + pwhy)
			}
			preempted = true
		}
	} else if why, later, reclaimed := e.admitWithin(fresh); why != "" {
		return e.decline(why)
	} else if reclaimed {
		preempted, admitted = true, later
	}
	if !e.growFresh(append(slices.Clone(fresh), carried...), fresh) {
		return e.decline("an elastic job could grow")
	}
	e.d = e.render(fresh, admitted, carried, preempted)
	e.jobs += len(fresh)
	e.admitted = slices.DeleteFunc(append(fresh, admitted...), func(j *jobRT) bool { return j.size == 0 })
	if preempted {
		// Allocations changed: the full cycle would be followed by
		// another (Settled), and the next Admit has no fixed point.
		e.fix, e.unsettled = false, true
		for _, j := range e.admitted {
			for _, name := range j.tookFrom {
				if v := s.jobByName[name]; v != nil && !slices.Contains(e.victims, v) {
					e.victims = append(e.victims, v)
				}
			}
		}
	}
	for _, j := range e.admitted {
		e.noteWake(j)
	}
	for _, v := range e.victims {
		e.noteWake(v)
	}
	return e.d, true
}

// FollowUp decides the cycle that follows an Admit that preempted
// (Settled false), when nothing but the time changed since (st is that
// Admit's input with its allocations applied), without a full cycle: as
// the full cycle would, it requeues the jobs the Admit preempted, carries
// over the jobs it admitted and shrunk, and runs rules 2 to 7 of their
// flavors again; it decides only when they admit, reclaim, preempt and
// grow nothing (the full cycle's decision is then a fixed point, and the
// Engine keeps it for the next Admit). ok false: run Schedule.
//
// At fleet scale the follow-up full cycle took 150-360 ms, and a submit
// that came meanwhile waited for it.
func (e *Engine) FollowUp(st State) (Decision, bool) {
	s := e.s
	e.declined = ""
	switch {
	case s == nil || !e.unsettled:
		return e.decline("no preempting Admit to follow up")
	case !reflect.DeepEqual(st.Config, e.cfg):
		return e.decline("the configuration changed")
	case len(st.Jobs) != e.jobs:
		return e.decline("the jobs changed")
	case s.strict:
		return e.decline("StrictFIFO")
	case st.Now.Before(s.now) || (!e.wake.IsZero() && !st.Now.Before(e.wake)):
		return e.decline("a stable period ended")
	}
	if !e.repoint(st.Jobs) {
		return e.decline("the jobs are not the kept ones, in name order")
	}
	s.now = st.Now
	carried := slices.Clone(e.admitted)
	var requeued []*jobRT
	for _, v := range e.victims {
		if v.size > 0 {
			carried = append(carried, v)
			continue
		}
		requeued = append(requeued, v)
	}
	for _, j := range carried {
		j.prevSize, j.prevNodes = j.size, nodeNames(j)
		j.setCarried()
	}
	flavors := flavorsOf(append(slices.Clone(carried), requeued...))
	for _, v := range requeued {
		// A job preempted last cycle waits in this one (buildQueues).
		v.prevSize, v.prevNodes, v.tookFrom = 0, nil, nil
		v.setPending("", "")
		enqueue(v)
	}
	for _, f := range flavors {
		if why := e.rulesAgain(f); why != "" {
			return e.decline(why)
		}
	}
	if !e.growFresh(carried, nil) {
		return e.decline("an elastic job could grow")
	}
	e.d = e.render(nil, nil, append(carried, requeued...), false)
	e.fix, e.unsettled, e.victims, e.admitted = steady(e.d), false, nil, nil
	if !e.fix {
		return e.decline("a job's reason is not a steady one")
	}
	return e.d, true
}

// rulesAgain runs rules 2 to 6 of flavor f again on the kept state, as a
// full cycle runs them after rule 1 carried every allocation over, and
// says why the fast path cannot decide when they admit any waiting job.
// The marks, reservations and victim lists the rules build are built
// again from nothing, as the full cycle's are.
func (e *Engine) rulesAgain(f *flavorRT) string {
	s := e.s
	var waiting []*jobRT
	for _, p := range f.pending {
		if p.size == 0 {
			s.unreserve(p)
			p.stuck = false
			waiting = append(waiting, p)
		}
	}
	clear(f.failMemo)
	dropOwnLists(f)
	s.admitWithinNominal(f)
	s.reclaim(f)
	s.reserve(f)
	s.admitBorrowing(f)
	s.priorityPreempt(f)
	for _, p := range waiting {
		if p.size > 0 {
			return "the follow-up admits job " + p.name
		}
	}
	if s.defragged {
		return "the follow-up moves jobs"
	}
	return ""
}

// Settled reports whether the last decision (Schedule's or Admit's) is
// one the next full cycle on the same inputs keeps as far as Admit knows:
// false after an Admit that preempted, whose full cycle changed
// allocations and is followed by another, as Schedule's would be.
func (e *Engine) Settled() bool { return !e.unsettled }

// preemptFresh admits j, beyond its team's nominal quota and passed by
// rule 5, as rule 6 of the full cycle would, or says why it cannot. Rule
// 6 meets the kept state at j's turn: the jobs it tries before j fail as
// they did, and the flavor's borrower lists, built again here, hold the
// jobs the full cycle's hold (the state is the kept cycle's; the lists'
// cursors only pass jobs that no step would take from). Rule 6 then runs
// on for the waiting jobs after j as the full cycle's does. Left to the
// full cycle: a preemption that takes from another team (its usage and
// reasons change too), and one after which a later waiting job is
// admitted as well.
func (e *Engine) preemptFresh(j *jobRT) string {
	s, tf, f := e.s, j.tf, j.fl
	switch {
	case s.strict:
		return "StrictFIFO"
	case !e.preemptsOwn(j):
		return "its team does not preempt for it"
	}
	e.indexFresh(j)
	built := false
	s.preemptFor(j, &built)
	if j.size == 0 {
		return "rule 6 does not admit it"
	}
	for _, name := range j.tookFrom {
		if v := s.jobByName[name]; v == nil || v.tf != tf {
			return "rule 6 takes from another team"
		}
	}
	for _, p := range f.pending {
		if jobOrder(p, j) < 0 || p.size > 0 {
			continue
		}
		if s.preemptFor(p, &built); p.size > 0 {
			return "rule 6 admits a waiting job after it too"
		}
	}
	return ""
}

// admitWithin admits fresh as rule 2 of the full cycle would, each within
// its team's nominal quota, and makes the reservations again as rule 4
// would after them; or says why it cannot. A single submit within its
// team's nominal quota that rule 2 cannot place (its cohort lent what it
// needs, or no free nodes fit it) is left stuck, as rule 2 leaves it, for
// rule 3 to reclaim from the teams that borrow (reclaimed: see
// reclaimFresh); later are the waiting jobs that rules 5 and 6 admit
// after it (laterRules).
func (e *Engine) admitWithin(fresh []*jobRT) (why string, later []*jobRT, reclaimed bool) {
	s := e.s
	// Rule 2 of the full cycle runs before any reservation (rule 4):
	// they are undone, and made again after the admissions as rule 4
	// makes them.
	flavors := flavorsOf(fresh)
	reserved := make([]int, len(flavors))
	for i, f := range flavors {
		reserved[i] = f.reservedPhys
		for _, j := range f.pending {
			s.unreserve(j)
		}
	}
	var stuck *jobRT
	for _, j := range fresh {
		why := e.admitFresh(j)
		if why == "" {
			continue
		}
		if len(fresh) > 1 || s.strict || !strings.HasPrefix(why, "quota: ") && why != "no free nodes" {
			return "job " + j.name + ": " + why, nil, false
		}
		// Rule 2 fails for it within its nominal quota and marks it
		// stuck; the failed try changed nothing.
		e.pendFresh(j)
		j.stuck = true
		stuck = j
	}
	// A waiting job of their teams that no longer fits the nominal quota
	// is not stuck within it: rule 3 of the full cycle clears the mark
	// (it is set in rule 2 only within the quota).
	for _, j := range fresh {
		tf := j.tf
		for _, p := range tf.jobs {
			if p.size == 0 && p.stuck && tf.used+p.per*p.sp.min > tf.nominal {
				p.stuck = false
			}
		}
	}
	// Rule 3 meets a changed state (the admissions): it runs as the full
	// cycle's (its memo of failures is the kept cycle's, on the old
	// state), and must admit no waiting job (a failed try changes
	// nothing).
	for _, f := range flavors {
		clear(f.failMemo)
		var waiting []*jobRT
		for _, p := range f.pending {
			if p.size == 0 {
				waiting = append(waiting, p)
			}
		}
		s.reclaim(f)
		for _, p := range waiting {
			if p.size > 0 && p != stuck {
				return "rule 3 admits job " + p.name, nil, false
			}
		}
	}
	if stuck != nil {
		if why := e.reclaimFresh(stuck); why != "" {
			return "job " + stuck.name + ": " + why, nil, false
		}
	}
	for i, f := range flavors {
		s.reserve(f)
		if f.reservedPhys < reserved[i] {
			// Capacity reserved before is not now: rule 5 might admit
			// a borrower into it.
			return "a reservation was given up", nil, false
		}
	}
	if stuck != nil {
		later = e.laterRules(stuck.fl)
	}
	return "", later, stuck != nil
}

// reclaimFresh checks what rule 3 did for the submitted job j, which rule
// 2 left stuck within its team's nominal quota: it admitted j by taking
// capacity back from jobs of teams that borrow (shrunk or preempted, the
// fewest it needs), as the full cycle's rule 3 does at j's turn (the jobs
// before j fail as they did in the kept cycle, on the same state, and
// reclaim checked that none after it was admitted). Left to the full
// cycle: a j that rule 3 does not admit (it waits and reserves, and rules
// 5 and 6 may meet it), and one admitted by moving other jobs (rule 3b).
func (e *Engine) reclaimFresh(j *jobRT) string {
	switch {
	case j.size == 0:
		return "rule 3 does not admit it"
	case e.s.defragged:
		return "rule 3 moves jobs to place it"
	}
	return ""
}

// laterRules runs rules 5 and 6 of the full cycle again on flavor f
// after a reclaim freed capacity there, and returns the waiting jobs they
// admit: a borrower into what the victims left free, or a priority
// preemption that now succeeds. The teams' own victim lists are built
// again: the full cycle builds them at rule 6, after the reclaim. A job
// they do not admit is left as it was.
func (e *Engine) laterRules(f *flavorRT) []*jobRT {
	s := e.s
	var waiting []*jobRT
	for _, p := range f.pending {
		if p.size == 0 {
			waiting = append(waiting, p)
		}
	}
	s.admitBorrowing(f)
	dropOwnLists(f)
	s.priorityPreempt(f)
	return slices.DeleteFunc(waiting, func(p *jobRT) bool { return p.size == 0 })
}

// dropOwnLists drops the own-team victim lists of flavor f's teams:
// rule 6 builds them again from the state it meets (buildOwnLists).
func dropOwnLists(f *flavorRT) {
	for _, tf := range f.teams {
		tf.ownBuilt, tf.ownPreempt, tf.ownShrink = false, tf.ownPreempt[:0], tf.ownShrink[:0]
	}
}

// borrowFresh admits j, beyond its team's nominal quota, as rule 5 of the
// full cycle would, or says why it cannot. Rules 2 to 4 pass j by (it is
// beyond the nominal quota, so not stuck and reserved nothing): rule 5
// meets the state the kept cycle left, reservations included, and the
// jobs it tries before j fail as they did. No job within its nominal
// quota may wait on the flavor: once j borrows, rule 3 of the next cycle
// might reclaim from it, and the decision would be no fixed point.
func (e *Engine) borrowFresh(j *jobRT) string {
	s, tf := e.s, j.tf
	if why := e.ownWaiting(j); why != "" {
		return why
	}
	for _, p := range j.fl.pending {
		if p.size == 0 && p.stuck && p.tf.used+p.per*p.sp.min <= p.tf.nominal {
			return "a job within its team's nominal quota waits (rule 3 might reclaim)"
		}
	}
	acc := j.per * j.sp.min
	if c := s.quotaCheck(tf, acc, j.vcpu*j.sp.min, j.mem*int64(j.sp.min), false); c != "" {
		return "quota: " + string(c)
	}
	nodes := s.findNodes(j, j.sp.min)
	if nodes == nil {
		return "no free nodes"
	}
	e.attachFresh(j, nodes, CodeBorrowing)
	return ""
}

// ownWaiting says why a job of j's team that waits keeps j off the fast
// path: under StrictFIFO j may not pass it, and one of a higher priority
// might preempt j (rule 6, only in a team that preempts lower
// priorities).
func (e *Engine) ownWaiting(j *jobRT) string {
	for _, o := range j.tf.jobs {
		if o.size > 0 || !o.valid || o.spec.Suspended {
			continue
		}
		if e.s.strict {
			return "its team has jobs waiting (StrictFIFO)"
		}
		if o.sp.prio > j.sp.prio && o.tf.team.policy == PreemptLowerPriority {
			return "its team has a job of higher priority waiting"
		}
	}
	return ""
}

// preemptsOwn reports whether rule 6 may preempt jobs of j's team for the
// waiting job j: its team preempts lower priorities and j's minimum fits
// the team's nominal quota.
func (e *Engine) preemptsOwn(j *jobRT) bool {
	return j.tf.team.policy == PreemptLowerPriority && j.per*j.sp.min <= j.tf.nominal
}

// waitsOnQuota reports whether the submitted job j, beyond its team's
// nominal quota, waits in the full cycle and changes nothing there: rule 2
// passes it by (beyond the nominal quota, so never stuck: rules 3 and 4
// pass it by too), rule 5 finds its quota full on the state the kept
// cycle left (a fixed point: what rule 5 met), and rule 6 cannot preempt
// a job of its team of a lower priority for it. Under StrictFIFO it would
// hold back its team's queue: no. A job that no free nodes fit goes to
// the full cycle.
func (e *Engine) waitsOnQuota(j *jobRT) bool {
	s, tf := e.s, j.tf
	if s.strict || s.quotaCheck(tf, j.per*j.sp.min, j.vcpu*j.sp.min, j.mem*int64(j.sp.min), false) == "" || !s.canPlace(j, j.sp.min) {
		return false
	}
	if e.preemptsOwn(j) {
		for _, o := range tf.jobs {
			if o.size > 0 && o.sp.prio < j.sp.prio {
				return false
			}
		}
	}
	return true
}

// pendFresh indexes the new job j as a waiting one.
func (e *Engine) pendFresh(j *jobRT) {
	e.indexFresh(j)
	enqueue(j)
}

// enqueue inserts the waiting job j in its flavor's and team's pending
// queues, in admission order (buildQueues'), unless it is there: the kept
// queues still list a job a fast path decision admitted from them (the
// rules skip a job that holds nodes), and one of those preempted since
// and requeued by FollowUp was listed twice, so that rule 5 admitted it
// twice (two allocations of one job: a transaction with a duplicate key,
// at 20,000 nodes with elastic submits).
func enqueue(j *jobRT) {
	if at, found := slices.BinarySearchFunc(j.fl.pending, j, jobOrder); !found {
		j.fl.pending = slices.Insert(j.fl.pending, at, j)
	}
	if at, found := slices.BinarySearchFunc(j.tf.queue, j, jobOrder); !found {
		j.tf.queue = slices.Insert(j.tf.queue, at, j)
	}
}

// attachFresh indexes the new job j and admits it on nodes.
func (e *Engine) attachFresh(j *jobRT, nodes []*nodeRT, code ReasonCode) {
	e.indexFresh(j)
	e.s.admit(j, nodes, code)
}

// indexFresh indexes the new job j by name, in its team's and flavor's
// jobs.
func (e *Engine) indexFresh(j *jobRT) {
	s, tf := e.s, j.tf
	s.jobByName[j.name] = j
	at, _ := slices.BinarySearchFunc(tf.jobs, j.name, byJobName)
	tf.jobs = slices.Insert(tf.jobs, at, j)
	at, _ = slices.BinarySearchFunc(j.fl.jobs, j.name, byJobName)
	j.fl.jobs = slices.Insert(j.fl.jobs, at, j)
}

// repoint points the kept job records at their specs in jobs, which the
// caller may have moved since (it inserts the submitted jobs in place):
// jobs must be in name order and hold the kept jobs and others (the
// submitted ones, and those admitted by earlier Admits, which keep their
// own copy).
func (e *Engine) repoint(jobs []Job) bool {
	s, k := e.s, 0
	for i := range jobs {
		if i > 0 && jobs[i-1].Name >= jobs[i].Name {
			return false
		}
		if k < len(s.jobs) && s.jobs[k].name == jobs[i].Name {
			s.jobs[k].spec = &jobs[i]
			k++
		}
	}
	return k == len(s.jobs)
}

// newJob builds the runtime record of submitted job name as buildJobs and
// resolve would, or nil when it is not one Admit decides.
func (e *Engine) newJob(st State, name string) *jobRT {
	s := e.s
	// The coordinator keeps its jobs in name order: a search, else a scan.
	i, found := slices.BinarySearchFunc(st.Jobs, name, func(j Job, name string) int { return strings.Compare(j.Name, name) })
	if !found {
		i = slices.IndexFunc(st.Jobs, func(j Job) bool { return j.Name == name })
	}
	if i < 0 || s.jobByName[name] != nil {
		return nil
	}
	spec := st.Jobs[i] // a copy: the caller moves its slice's entries
	if spec.Suspended {
		return nil
	}
	sp, err := normalize(spec, s.cfg)
	if err != nil || (sp.min != sp.max && !spec.Elastic) {
		return nil
	}
	j := &jobRT{spec: &spec, name: name, valid: true, sp: sp, per: spec.PerNode.Accelerators,
		vcpu: spec.PerNode.VCPUs, mem: int64(spec.PerNode.Memory), exclusive: sp.max > 1, rank: -1}
	t := s.teamByName[spec.Team]
	if t == nil || !t.valid {
		return nil
	}
	fname := spec.Flavor
	if fname == "" {
		if len(t.spec.Quotas) != 1 {
			return nil
		}
		fname = t.spec.Quotas[0].Flavor
	}
	tf := t.flavors[fname]
	if tf == nil {
		return nil
	}
	j.team, j.flavor, j.tf, j.fl = t, fname, tf, tf.fl
	j.setPending("", "")
	return j
}

// admitFresh admits j as rule 2 of the full cycle would, or says why not:
// no job of its team of a higher priority waits (none at all under
// StrictFIFO), and j fits the nominal quota and free nodes.
func (e *Engine) admitFresh(j *jobRT) (why string) {
	s, tf := e.s, j.tf
	if why := e.ownWaiting(j); why != "" {
		return why
	}
	acc := j.per * j.sp.min
	if tf.used+acc > tf.nominal {
		return "beyond its team's nominal quota"
	}
	// The kept state holds the other teams' reservations, which rule 2 of
	// the full cycle does not see yet: they only make the pool check
	// stricter.
	if c := s.quotaCheck(tf, acc, j.vcpu*j.sp.min, j.mem*int64(j.sp.min), true); c != "" {
		return "quota: " + string(c)
	}
	nodes := s.findNodes(j, j.sp.min)
	if nodes == nil {
		return "no free nodes"
	}
	e.attachFresh(j, nodes, CodeWithinQuota)
	return ""
}

// byJobName orders job records by name.
func byJobName(j *jobRT, name string) int { return strings.Compare(j.name, name) }

// growFresh runs rule 7 on the flavors of touched (Admit: the submitted
// jobs and those the last Admit admitted; FollowUp: the jobs it carries)
// as the full cycle runs it after rules 2 to 6, marking why each elastic
// job that may grow did not: a submitted (fresh) elastic job grows at
// once, as the full cycle grows a job it admits. It reports false when a
// job not in fresh grew (the full cycle decides that: the caller declines
// and its Engine records are dropped). With growth disabled nothing runs.
func (e *Engine) growFresh(touched, fresh []*jobRT) bool {
	s := e.s
	if s.cfg.DisableGrowth {
		return true // rule 7 does not run
	}
	for _, f := range flavorsOf(touched) {
		var others []*jobRT
		var sizes []int
		for _, j := range f.jobs {
			if j.spec.Elastic && j.size > 0 && !slices.Contains(fresh, j) {
				others = append(others, j)
				sizes = append(sizes, j.size)
			}
		}
		s.grow(f)
		for i, j := range others {
			if j.size != sizes[i] {
				return false
			}
		}
	}
	return true
}

// flavorsOf lists the flavors of jobs, once each.
func flavorsOf(jobs []*jobRT) []*flavorRT {
	var fs []*flavorRT
	for _, j := range jobs {
		if !slices.Contains(fs, j.fl) {
			fs = append(fs, j.fl)
		}
	}
	return fs
}

// render returns the kept decision with the admitted jobs' allocations
// and the reasons that the admission changed rendered again: the admitted
// jobs', their teams' jobs' (their usage), and the flavor's waiting and
// elastic jobs' (free capacity, holders, growth).
func (e *Engine) render(fresh, later, carried []*jobRT, preempted bool) Decision {
	s, old := e.s, e.d
	d := Decision{Now: s.now, Teams: slices.Clone(old.Teams), Released: old.Released, Problems: old.Problems}
	// The teams whose usage changed: the admitted jobs', and their
	// victims' (a reclaim takes from other teams).
	admitted := append(slices.Clone(fresh), later...)
	tfs := map[*teamFlavor]bool{}
	for _, j := range admitted {
		tfs[j.tf] = true
		for _, name := range j.tookFrom {
			if v := s.jobByName[name]; v != nil {
				tfs[v.tf] = true
			}
		}
	}
	isNew := map[*jobRT]bool{}
	for _, j := range fresh {
		isNew[j] = true
	}
	again := map[*jobRT]bool{}
	for _, j := range carried {
		again[j] = true
	}
	// The texts the kept cycle cached may name what changed.
	s.runningTexts, s.usageTexts, s.holderTexts, s.exhaustedTexts = nil, nil, nil, nil
	// The jobs to render again, in name order (a flavor's jobs are).
	flavors := flavorsOf(append(slices.Clone(fresh), carried...))
	var redo []*jobRT
	for _, f := range flavors {
		for _, j := range f.jobs {
			if tfs[j.tf] || again[j] || j.size == 0 || j.spec.Elastic {
				redo = append(redo, j)
			}
		}
	}
	if len(flavors) > 1 {
		slices.SortFunc(redo, func(a, b *jobRT) int { return strings.Compare(a.name, b.name) })
	}
	cache := map[*flavorRT]*holders{}
	d.Reasons = takeList(&e.spareReasons, len(old.Reasons)+len(fresh))
	i := 0
	for _, j := range redo {
		if isNew[j] {
			// Not listed yet: its place by name.
			k, _ := slices.BinarySearchFunc(old.Reasons[i:], j.name, func(r Reason, n string) int { return strings.Compare(r.Job, n) })
			d.Reasons = append(d.Reasons, old.Reasons[i:i+k]...)
			i += k
		} else {
			// Listed: equality only (the names share their bytes).
			k := i
			for k < len(old.Reasons) && old.Reasons[k].Job != j.name {
				k++
			}
			d.Reasons = append(d.Reasons, old.Reasons[i:k]...)
			i = k + 1
		}
		d.Reasons = append(d.Reasons, s.reason(j, cache))
	}
	if i < len(old.Reasons) {
		d.Reasons = append(d.Reasons, old.Reasons[i:]...)
	}
	d.Allocations = takeList(&e.spareAllocs, len(old.Allocations)+len(admitted))
	slices.SortFunc(admitted, func(a, b *jobRT) int { return strings.Compare(a.name, b.name) })
	i = 0
	for _, j := range admitted {
		if j.size == 0 {
			continue // waits (pendFresh)
		}
		k, _ := slices.BinarySearchFunc(old.Allocations[i:], j.name, func(a Allocation, n string) int { return strings.Compare(a.Job, n) })
		d.Allocations = append(d.Allocations, old.Allocations[i:i+k]...)
		i += k
		d.Allocations = append(d.Allocations, allocation(j))
	}
	d.Allocations = append(d.Allocations, old.Allocations[i:]...)
	if preempted {
		d.Allocations = e.victimAllocations(d.Allocations, admitted)
	}
	if len(d.Allocations) == 0 {
		d.Allocations = nil // as the full cycle's, when it places none
	}
	for k := range d.Teams {
		u := &d.Teams[k]
		if t := s.teamByName[u.Team]; t != nil {
			if tf := t.flavors[u.Flavor]; tf != nil && tfs[tf] {
				u.Used, u.Borrowed, u.Running = tf.used, max(0, tf.used-tf.nominal), tf.running
				u.Pending, u.PendingAccelerators = 0, 0
				for _, j := range tf.jobs {
					if j.size == 0 && !j.spec.Suspended {
						u.Pending++
						u.PendingAccelerators += j.per * j.sp.min
					}
				}
			}
		}
	}
	return d
}

// victimAllocations returns allocs with the allocations of the jobs that
// fresh took from (rule 6) as they are now: shrunk, or gone.
func (e *Engine) victimAllocations(allocs []Allocation, fresh []*jobRT) []Allocation {
	victims := map[string]*jobRT{}
	for _, j := range fresh {
		for _, name := range j.tookFrom {
			victims[name] = e.s.jobByName[name]
		}
	}
	out := allocs[:0]
	for _, a := range allocs {
		if v := victims[a.Job]; v != nil {
			if v.size == 0 {
				continue
			}
			a = allocation(v)
		}
		out = append(out, a)
	}
	return out
}

// nodeNames names j's nodes.
func nodeNames(j *jobRT) []string {
	names := make([]string, len(j.nodes))
	for k, n := range j.nodes {
		names[k] = n.name
	}
	return names
}

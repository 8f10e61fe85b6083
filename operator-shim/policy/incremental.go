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
}

// Schedule runs a full engine cycle (the package's Schedule) and keeps its
// runtime records for Admit.
func (e *Engine) Schedule(st State) Decision {
	e.drop()
	// The kept records point into the jobs' specs: a copy, so that the
	// caller may reuse its slice.
	st.Jobs = slices.Clone(st.Jobs)
	s, d := schedule(st)
	e.s, e.d, e.cfg, e.jobs = s, d, st.Config, len(st.Jobs)
	e.fix = len(d.Released) == 0
	for i := range d.Reasons {
		switch d.Reasons[i].Kind {
		case KindRunning, KindPending, KindSuspended, KindInvalid:
		default:
			e.fix = false
		}
	}
	e.wake = time.Time{}
	if s.stable > 0 {
		for i := range s.jobs {
			j := &s.jobs[i]
			if t := j.lastResize.Add(s.stable); j.size > 0 && t.After(s.now) && (e.wake.IsZero() || t.Before(e.wake)) {
				e.wake = t
			}
		}
	}
	return d
}

// drop forgets the kept records.
func (e *Engine) drop() {
	if e.s != nil {
		putJobs(e.s.jobs)
	}
	e.s, e.d, e.admitted = nil, Decision{}, nil
}

// Admit decides the jobs just submitted (st is the kept cycle's input plus
// these jobs, nothing else changed, at a later st.Now) without a full
// cycle, when it can show that the full cycle (Schedule(st)) would decide
// exactly the same: every job fits its team's nominal quota and free
// nodes as they are (rule 2 admits it where rule 2 of the full cycle would),
// its team has no other job waiting, it is not elastic, and after it is
// placed no elastic job could grow (rule 7); the later rules only take
// capacity or quota that the admission left smaller. The kept cycle must
// have changed no allocation (a fixed point), and no stable period may have
// ended since. ok false: run Schedule; the Engine then keeps nothing until
// it does.
//
// The Decision is the full cycle's: allocations, and the reasons of the
// admitted jobs, of their teams' jobs, of the flavor's waiting jobs and
// of its elastic jobs that did not grow, rendered from the same end state.
func (e *Engine) Admit(st State, submitted []string) (Decision, bool) {
	s := e.s
	if s == nil || !e.fix || !reflect.DeepEqual(st.Config, e.cfg) || len(st.Jobs) != e.jobs+len(submitted) || len(submitted) == 0 ||
		st.Now.Before(s.now) || (!e.wake.IsZero() && !st.Now.Before(e.wake)) {
		e.drop()
		return Decision{}, false
	}
	var fresh []*jobRT
	for _, name := range submitted {
		j := e.newJob(st, name)
		if j == nil {
			e.drop()
			return Decision{}, false
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
	for _, j := range fresh {
		if !e.admitFresh(j) {
			e.drop()
			return Decision{}, false
		}
	}
	if !e.noGrowth(fresh) {
		e.drop()
		return Decision{}, false
	}
	e.d = e.render(fresh, carried)
	e.jobs += len(fresh)
	e.admitted = fresh
	return e.d, true
}

// newJob builds the runtime record of submitted job name as buildJobs and
// resolve would, or nil when it is not one Admit decides.
func (e *Engine) newJob(st State, name string) *jobRT {
	s := e.s
	i := slices.IndexFunc(st.Jobs, func(j Job) bool { return j.Name == name })
	if i < 0 || s.jobByName[name] != nil {
		return nil
	}
	spec := st.Jobs[i] // a copy: the caller may reuse its slice
	if spec.Suspended || spec.Elastic {
		return nil
	}
	sp, err := normalize(spec, s.cfg)
	if err != nil || sp.min != sp.max {
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

// admitFresh admits j as rule 2 of the full cycle would, or reports false.
// Its team has no job waiting and no reservation (so j heads its queue and
// no pending job of its team is affected), and j fits the nominal quota.
func (e *Engine) admitFresh(j *jobRT) bool {
	s, tf := e.s, j.tf
	if tf.reserved != 0 {
		return false
	}
	for _, o := range tf.jobs {
		if o.size == 0 && o.valid && !o.spec.Suspended {
			return false
		}
	}
	acc := j.per * j.sp.min
	if tf.used+acc > tf.nominal {
		return false
	}
	// The kept state holds the other teams' reservations, which rule 2 of
	// the full cycle does not see yet: they only make the pool check
	// stricter.
	if s.quotaCheck(tf, acc, j.vcpu*j.sp.min, j.mem*int64(j.sp.min), true) != "" {
		return false
	}
	nodes := s.findNodes(j, j.sp.min)
	if nodes == nil {
		return false
	}
	s.jobByName[j.name] = j
	at, _ := slices.BinarySearchFunc(tf.jobs, j.name, byJobName)
	tf.jobs = slices.Insert(tf.jobs, at, j)
	at, _ = slices.BinarySearchFunc(j.fl.jobs, j.name, byJobName)
	j.fl.jobs = slices.Insert(j.fl.jobs, at, j)
	s.admit(j, nodes, CodeWithinQuota)
	return true
}

// byJobName orders job records by name.
func byJobName(j *jobRT, name string) int { return strings.Compare(j.name, name) }

// noGrowth reports whether rule 7 of the full cycle would grow no job of
// the admitted jobs' flavors, and records, as rule 7 would, why each
// elastic job that may grow did not: each is tried once, on the end state.
func (e *Engine) noGrowth(fresh []*jobRT) bool {
	s := e.s
	if s.cfg.DisableGrowth {
		return true // rule 7 does not run
	}
	for _, f := range flavorsOf(fresh) {
		for _, j := range f.jobs {
			if !j.spec.Elastic || j.size == 0 || j.yielded() || !j.exclusive {
				continue
			}
			if j.nextSize(j.size) == 0 || (!j.admitted() && s.stable > 0 && s.now.Sub(j.lastResize) < s.stable) {
				continue // unchanged: at its maximum, or in its stable period
			}
			code, ok := s.growCheck(j)
			if ok {
				return false
			}
			j.blockGrowth(code)
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
func (e *Engine) render(fresh, carried []*jobRT) Decision {
	s, old := e.s, e.d
	d := Decision{Now: s.now, Teams: slices.Clone(old.Teams), Released: old.Released, Problems: old.Problems}
	redo := map[string]*jobRT{}
	tfs := map[*teamFlavor]bool{}
	for _, j := range fresh {
		tfs[j.tf] = true
	}
	for tf := range tfs {
		for k := range s.runningTexts {
			if k.tf == tf {
				delete(s.runningTexts, k)
			}
		}
		delete(s.usageTexts, tf)
		for _, j := range tf.jobs {
			redo[j.name] = j
		}
	}
	for _, j := range carried {
		redo[j.name] = j
	}
	for _, f := range flavorsOf(fresh) {
		for _, j := range f.jobs {
			if j.size == 0 || j.spec.Elastic {
				redo[j.name] = j
			}
		}
	}
	// Both lists stay in name order: one merge each.
	names := make([]string, 0, len(redo))
	for n := range redo {
		names = append(names, n)
	}
	slices.Sort(names)
	cache := map[*flavorRT]*holders{}
	d.Reasons = make([]Reason, 0, len(old.Reasons)+len(fresh))
	i := 0
	for _, n := range names {
		for i < len(old.Reasons) && old.Reasons[i].Job < n {
			d.Reasons = append(d.Reasons, old.Reasons[i])
			i++
		}
		if i < len(old.Reasons) && old.Reasons[i].Job == n {
			i++
		}
		d.Reasons = append(d.Reasons, s.reason(redo[n], cache))
	}
	d.Reasons = append(d.Reasons, old.Reasons[i:]...)
	d.Allocations = make([]Allocation, 0, len(old.Allocations)+len(fresh))
	slices.SortFunc(fresh, func(a, b *jobRT) int { return strings.Compare(a.name, b.name) })
	i = 0
	for _, j := range fresh {
		for i < len(old.Allocations) && old.Allocations[i].Job < j.name {
			d.Allocations = append(d.Allocations, old.Allocations[i])
			i++
		}
		a := Allocation{Job: j.name, Team: j.team.name, Flavor: j.flavor, Size: j.size,
			AcceleratorsPerNode: j.per, Since: j.since, LastResize: j.lastResize, Nodes: nodeNames(j)}
		d.Allocations = append(d.Allocations, a)
	}
	d.Allocations = append(d.Allocations, old.Allocations[i:]...)
	for k := range d.Teams {
		u := &d.Teams[k]
		if t := s.teamByName[u.Team]; t != nil {
			if tf := t.flavors[u.Flavor]; tf != nil && tfs[tf] {
				u.Used, u.Borrowed, u.Running = tf.used, max(0, tf.used-tf.nominal), tf.running
			}
		}
	}
	return d
}

// nodeNames names j's nodes.
func nodeNames(j *jobRT) []string {
	names := make([]string, len(j.nodes))
	for k, n := range j.nodes {
		names[k] = n.name
	}
	return names
}

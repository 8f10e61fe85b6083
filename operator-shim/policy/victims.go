package policy

import (
	"slices"
	"time"
)

// action is one victim step (a shrink or a preemption), undoable.
type action struct {
	v        *jobRT
	oldSize  int
	oldNodes []*nodeRT
	released []*nodeRT
	undone   bool
}

// undo gives a's victim its released nodes back.
func (s *sched) undo(a *action) {
	for _, n := range a.released {
		s.attach(a.v, n)
	}
	a.v.nodes = append(a.v.nodes[:0], a.oldNodes...)
	a.undone = true
}

// redo takes a's released nodes from its victim again.
func (s *sched) redo(a *action) {
	a.released = s.removeNodesExact(a.v, a.released)
	a.undone = false
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
	// A reclaim brings the team's nominal quota back, so the job must fit
	// within it. A priority preemption swaps the team's own capacity from
	// lower-priority jobs to this one: the team's use does not grow, so a
	// team that borrows may go on borrowing what its victims held. Its goal
	// is only that the job fits, which takes as few victims as the job
	// needs (requiring the nominal quota took every borrowed GPU back from
	// the team's own jobs, and they were re-admitted by borrowing next cycle).
	fits := func() bool {
		return s.quotaCheck(tf, acc, j.vcpu*j.sp.min, j.mem*int64(j.sp.min), !own) == "" && s.canPlace(j, j.sp.min)
	}
	if fits() {
		code := CodeWithinQuota
		if tf.used+tf.reserved+acc > tf.nominal {
			code = CodeBorrowing
		}
		s.admit(j, s.findNodes(j, j.sp.min), code)
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
			if i == *pos && (v.size <= v.sp.min || v.preempted()) {
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

// undoAll undoes every step of acts not undone yet, newest first.
func (s *sched) undoAll(acts []action) {
	for i := len(acts) - 1; i >= 0; i-- {
		if !acts[i].undone {
			s.undo(&acts[i])
		}
	}
}

// commitVictims records the outcome of the victim steps that were kept:
// victims of j's own team lost to priority, others to reclaim (code).
func (s *sched) commitVictims(j *jobRT, acts []action, code ReasonCode) {
	for i := range acts {
		a := &acts[i]
		if a.undone {
			continue
		}
		v := a.v
		if v.tf == j.tf {
			v.setTakenBy(j, code)
		} else {
			v.setTakenBy(j, CodeReclaim)
		}
		if !slices.Contains(j.tookFrom, v.name) {
			j.tookFrom = append(j.tookFrom, v.name)
		}
		if v.size == 0 {
			v.since, v.lastResize = time.Time{}, time.Time{}
			v.tookFrom = nil
		} else {
			v.lastResize = s.now
		}
	}
}

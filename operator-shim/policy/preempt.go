package policy

// priorityPreempt is rule 6.
func (s *sched) priorityPreempt(f *flavorRT) {
	built := false
	for _, j := range f.pending {
		s.preemptFor(j, &built)
	}
}

// preemptFor is rule 6 for the waiting job j: built says whether the
// flavor's borrower lists were built in this pass (at its first job that
// may preempt).
func (s *sched) preemptFor(j *jobRT, built *bool) {
	tf, f := j.tf, j.fl
	if tf.team.policy != PreemptLowerPriority || !s.eligible(j) {
		return
	}
	acc := j.per * j.sp.min
	if acc > tf.nominal {
		return
	}
	s.buildOwnLists(tf)
	if len(tf.ownPreempt) == 0 || tf.ownPreempt[0].sp.prio >= j.sp.prio {
		return
	}
	if !*built {
		s.buildBorrowerLists(f)
		*built = true
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

// buildOwnLists builds tf's own victim lists (LowerPriority), once per cycle.
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
	s.victimKeys = sortVictims(tf.ownShrink, true, s.victimKeys)
	s.victimKeys = sortVictims(tf.ownPreempt, false, s.victimKeys)
}

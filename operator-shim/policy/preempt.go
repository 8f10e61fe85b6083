package policy

import "slices"

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
	slices.SortFunc(tf.ownShrink, shrinkOrder)
	slices.SortFunc(tf.ownPreempt, preemptOrder)
}

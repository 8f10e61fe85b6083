package policy

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

// buildBorrowerLists builds flavor f's victim lists: running jobs of teams
// above their nominal quota.
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
	s.victimKeys = sortVictims(f.bShrink, true, s.victimKeys)
	s.victimKeys = sortVictims(f.bPreempt, false, s.victimKeys)
}

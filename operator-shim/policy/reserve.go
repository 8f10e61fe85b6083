package policy

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

// unreserve gives back j's reservation.
func (s *sched) unreserve(j *jobRT) {
	if j.reservedAcc == 0 {
		return
	}
	s.setEff(j.tf, j.tf.used, j.tf.reserved-j.reservedAcc)
	j.fl.reservedPhys -= j.reservedAcc
	j.reservedAcc = 0
}

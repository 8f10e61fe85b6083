package policy

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

// quotaOK reports whether j fits its team's nominal quota at its minimum size.
func (s *sched) quotaOK(j *jobRT) bool {
	return s.quotaCheck(j.tf, j.per*j.sp.min, j.vcpu*j.sp.min, j.mem*int64(j.sp.min), true) == ""
}

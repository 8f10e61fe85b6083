package policy

import (
	"slices"
	"time"
)

// buildQueues builds the pending queues of flavor f: the flavor's in
// admission order, and each team's.
func (s *sched) buildQueues(f *flavorRT) {
	for _, j := range f.jobs {
		if j.size == 0 {
			j.since, j.lastResize = time.Time{}, time.Time{}
		}
		if j.size > 0 || j.spec.Suspended || j.prevSize > 0 && j.size == 0 {
			// Requeued jobs (lost nodes, spec change) wait one cycle.
			continue
		}
		f.pending = append(f.pending, j)
	}
	slices.SortFunc(f.pending, jobOrder)
	for _, j := range f.pending {
		j.tf.queue = append(j.tf.queue, j)
	}
}

// eligible reports whether j may be admitted now under the queueing strategy.
func (s *sched) eligible(j *jobRT) bool {
	if j.size > 0 || j.preempted() {
		return false
	}
	if !s.strict {
		return true
	}
	tf := j.tf
	for tf.head < len(tf.queue) && tf.queue[tf.head].size > 0 {
		tf.head++
	}
	return tf.head < len(tf.queue) && tf.queue[tf.head] == j
}

// admit places j on nodes and records it admitted (code: how).
func (s *sched) admit(j *jobRT, nodes []*nodeRT, code ReasonCode) {
	for _, n := range nodes {
		s.attach(j, n)
	}
	j.setAdmitted(code)
	j.since, j.lastResize = s.now, s.now
}

// tryAdmit admits j at its minimum size if quota and nodes allow.
func (s *sched) tryAdmit(j *jobRT, within bool) bool {
	acc := j.per * j.sp.min
	tf := j.tf
	if c := s.quotaCheck(tf, acc, j.vcpu*j.sp.min, j.mem*int64(j.sp.min), within); c != "" {
		return false
	}
	nodes := s.findNodes(j, j.sp.min)
	if nodes == nil {
		return false
	}
	code := CodeWithinQuota
	if tf.used+acc > tf.nominal {
		code = CodeBorrowing
	}
	s.admit(j, nodes, code)
	return true
}

// admitWithinNominal is rule 2.
func (s *sched) admitWithinNominal(f *flavorRT) {
	for _, j := range f.pending {
		if !s.eligible(j) {
			continue
		}
		tf := j.tf
		if tf.used+j.per*j.sp.min > tf.nominal {
			continue
		}
		if !s.tryAdmit(j, true) {
			j.stuck = true
		}
	}
}

// admitBorrowing is rule 5.
func (s *sched) admitBorrowing(f *flavorRT) {
	h := newHeap(func(a, b *teamFlavor) bool { return teamKey(a, b) < 0 })
	cursor := map[*teamFlavor]int{}
	for _, tf := range f.teams {
		if len(tf.queue) > 0 {
			h.push(tf)
		}
	}
	for h.len() > 0 {
		tf := h.top()
		admitted := false
		i := cursor[tf]
		for ; i < len(tf.queue); i++ {
			j := tf.queue[i]
			if j.stuck || !s.eligible(j) {
				if s.strict && j.size == 0 && !j.preempted() {
					i = len(tf.queue)
					break
				}
				continue
			}
			if s.tryAdmit(j, false) {
				admitted = true
				i++
				break
			}
			if s.strict {
				i = len(tf.queue)
				break
			}
		}
		cursor[tf] = i
		if admitted && i < len(tf.queue) {
			h.fix(0)
		} else {
			h.pop()
		}
	}
}

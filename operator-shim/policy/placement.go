package policy

import "slices"

// attach places one more node of j on n and charges its team.
func (s *sched) attach(j *jobRT, n *nodeRT) {
	n.used += j.per
	n.vcpuUsed += j.vcpu
	n.memUsed += j.mem
	if j.exclusive {
		n.exclusive = true
	}
	n.jobs = append(n.jobs, j)
	n.reindex()
	j.nodes = append(j.nodes, n)
	j.size++
	tf := j.tf
	s.setEff(tf, tf.used+j.per, tf.reserved)
	tf.vcpuUsed += j.vcpu
	tf.memUsed += j.mem
	if j.size == 1 {
		tf.running++
	}
}

// detachNode releases j's node n (the caller updates j.nodes).
func (s *sched) detachNode(j *jobRT, n *nodeRT) {
	n.used -= j.per
	n.vcpuUsed -= j.vcpu
	n.memUsed -= j.mem
	if j.exclusive {
		n.exclusive = false
	}
	if i := slices.Index(n.jobs, j); i >= 0 {
		n.jobs = slices.Delete(n.jobs, i, i+1)
	}
	n.reindex()
	j.size--
	tf := j.tf
	s.setEff(tf, tf.used-j.per, tf.reserved)
	tf.vcpuUsed -= j.vcpu
	tf.memUsed -= j.mem
	if j.size == 0 {
		tf.running--
	}
}

// removeNodes releases k of j's nodes (nodes that take no new work first,
// then the most recently added) and returns them.
func (s *sched) removeNodes(j *jobRT, k int) []*nodeRT {
	if k <= 0 {
		return nil
	}
	drop := make([]bool, len(j.nodes))
	var rel []*nodeRT
	for pass := 0; pass < 2 && len(rel) < k; pass++ {
		for i := len(j.nodes) - 1; i >= 0 && len(rel) < k; i-- {
			n := j.nodes[i]
			if drop[i] || (pass == 0 && n.usable) {
				continue
			}
			drop[i] = true
			rel = append(rel, n)
		}
	}
	keep := j.nodes[:0:0]
	for i, n := range j.nodes {
		if !drop[i] {
			keep = append(keep, n)
		}
	}
	for _, n := range rel {
		s.detachNode(j, n)
	}
	j.nodes = keep
	return rel
}

// findNodes returns count more nodes for j (scratch slice), or nil.
func (s *sched) findNodes(j *jobRT, count int) []*nodeRT {
	f := j.fl
	if j.exclusive {
		if f.wholeFree < count {
			return nil
		}
		s.scratch = f.pickWhole(j.per, j.vcpu, j.mem, count, s.scratch[:0])
		if len(s.scratch) < count {
			return nil
		}
		return s.scratch
	}
	if count != 1 || j.size != 0 {
		return nil
	}
	n := f.pickFrac(j.per, j.vcpu, j.mem)
	if n == nil {
		return nil
	}
	s.scratch = append(s.scratch[:0], n)
	return s.scratch
}

// canPlace reports whether count more nodes for j are free.
func (s *sched) canPlace(j *jobRT, count int) bool { return s.findNodes(j, count) != nil }

// removeNodesExact releases exactly the given nodes of j.
func (s *sched) removeNodesExact(j *jobRT, rel []*nodeRT) []*nodeRT {
	drop := make(map[*nodeRT]bool, len(rel))
	for _, n := range rel {
		drop[n] = true
	}
	keep := j.nodes[:0:0]
	for _, n := range j.nodes {
		if !drop[n] {
			keep = append(keep, n)
		}
	}
	for _, n := range rel {
		s.detachNode(j, n)
	}
	j.nodes = keep
	return rel
}

// moveJob moves single-node job v from node from to node to.
func (s *sched) moveJob(v *jobRT, from, to *nodeRT) {
	s.detachNode(v, from)
	v.nodes = v.nodes[:0]
	s.attach(v, to)
}

package policy

import (
	"fmt"
	"slices"
	"time"
)

// carryOver places the current allocations (rule 1) and records what
// became of each: kept, shrunk to the spec, requeued, or released.
func (s *sched) carryOver(allocs []Allocation) {
	// The sort keys sit in the list itself: the comparisons then read no
	// job record (a steady cycle sorts every running job).
	type carried struct {
		prio  int
		since time.Time
		rank  int // the job's place in name order (s.jobs)
		a     *Allocation
		j     *jobRT
	}
	list := make([]carried, 0, len(allocs))
	var unknown map[string]bool // allocations of jobs not in the input
	for i := range allocs {
		a := &allocs[i]
		j := s.jobByName[a.Job]
		if (j != nil && j.allocSeen) || (j == nil && unknown[a.Job]) {
			s.problem("allocation", a.Job, fmt.Errorf("allocation %q: listed twice; the first entry is used", a.Job))
			continue
		}
		if j == nil {
			if unknown == nil {
				unknown = map[string]bool{}
			}
			unknown[a.Job] = true
			s.released = append(s.released, a.Job)
			continue
		}
		j.allocSeen = true
		j.prevSize = len(a.Nodes)
		j.prevNodes = a.Nodes
		if a.Size != len(a.Nodes) {
			s.problem("allocation", a.Job, fmt.Errorf("allocation %q: size %d but %d nodes; the node list is used", a.Job, a.Size, len(a.Nodes)))
		}
		if j.prevSize == 0 {
			continue
		}
		j.since, j.lastResize = a.Since, a.LastResize
		j.tookFrom = a.TookFrom
		switch {
		case !j.valid, j.tf == nil, j.spec.Suspended:
			j.release()
			continue
		case (a.Flavor != "" && a.Flavor != j.flavor) || (a.AcceleratorsPerNode != 0 && a.AcceleratorsPerNode != j.per):
			j.setRequeued(CodeSpecChanged, specChanged(j.spec.RequestedBy)+" (flavor or perNode.accelerators changed)")
			continue
		}
		list = append(list, carried{prio: j.sp.prio, since: a.Since, rank: j.rank, a: a, j: j})
	}
	slices.SortFunc(list, func(x, y carried) int {
		if x.prio != y.prio {
			return y.prio - x.prio
		}
		if c := x.since.Compare(y.since); c != 0 {
			return c
		}
		return x.rank - y.rank
	})
	for _, c := range list {
		s.carry(c.j, c.a)
	}
}

// carry places j again on the nodes its allocation a names that still fit
// it (names listed twice count once), clamps it to its spec, and records
// what it lost: nodes to repair, or a shrink.
func (s *sched) carry(j *jobRT, a *Allocation) {
	j.setCarried()
	want := len(a.Nodes)
	if !j.exclusive {
		want = 1
	}
	lost := 0
	// Names listed twice count once: a map only for long lists.
	var dup map[string]bool
	if len(a.Nodes) > 32 {
		dup = make(map[string]bool, len(a.Nodes))
	}
	distinct := 0
	for k, name := range a.Nodes {
		if dup != nil {
			if dup[name] {
				continue
			}
			dup[name] = true
		} else if slices.Contains(a.Nodes[:k], name) {
			continue
		}
		distinct++
		if j.size >= want {
			break
		}
		n := s.nodeByName[name]
		ok := n != nil && n.fl == j.fl && n.fitsExtra(j.vcpu, j.mem)
		if ok && j.exclusive {
			ok = len(n.jobs) == 0 && n.cap >= j.per
		} else if ok {
			ok = !n.exclusive && n.free() >= j.per
		}
		if !ok {
			lost++
			continue
		}
		s.attach(j, n)
	}
	if distinct < want {
		want = distinct
	}
	// Clamp to the spec (maxNodes lowered, sizes changed).
	target := j.floorSize(min(want, j.sp.max))
	if target == 0 {
		j.setRequeued(CodeSpecChanged, fmt.Sprintf("%s (minNodes %d is above the allocated %d nodes)", specChanged(j.spec.RequestedBy), j.sp.min, want))
		s.removeNodes(j, j.size)
		return
	}
	if target < want {
		// The spec (the user's resize) cuts the job, whether or not nodes
		// were lost too: the shrink is the user's, not the nodes'.
		j.setShrunk(CodeSpecChanged, specShrinkDetail(want, j.sp.min, j.sp.max, lost))
	} else if !j.exclusive && severalNodes(a.Nodes) {
		// A multi-node job whose spec now allows one node (maxNodes 1: a
		// single-node job takes one node, so want is 1): the user's
		// resize, not lost nodes.
		j.setShrunk(CodeSpecChanged, specShrinkDetail(j.prevSize, j.sp.min, j.sp.max, lost))
	}
	if j.size > target {
		s.removeNodes(j, j.size-target)
	}
	switch {
	case j.size < target:
		// repair replaces the missing nodes and records the outcome.
		j.repairNeed = target - j.size
	case j.size < j.prevSize && j.out.kind == KindRunning:
		// The allocation named nodes the job no longer holds (lost,
		// listed twice, or more than a single-node job takes) and none
		// need replacing.
		j.setShrunk(CodeNodeLost, "")
	}
}

// severalNodes reports whether nodes names at least two distinct nodes.
func severalNodes(nodes []string) bool {
	return len(nodes) > 1 && slices.ContainsFunc(nodes[1:], func(n string) bool { return n != nodes[0] })
}

// specChanged words a change of the spec, naming who made it when the
// spec says (its RequestedBy): "spec changed by etcd user research".
func specChanged(by string) string {
	if by == "" {
		return "spec changed"
	}
	return "spec changed by " + by
}

// specShrinkDetail says why a job's spec shrank it from held nodes to
// within min..max, naming the nodes lost at the same time.
func specShrinkDetail(held, min, max, lost int) string {
	d := fmt.Sprintf("size %d is not allowed by the spec (min %d, max %d)", held, min, max)
	if lost > 0 {
		d += fmt.Sprintf("; %s of the allocation lost meanwhile", plural(lost, "node"))
	}
	return d
}

// repair replaces lost nodes (highest priority first), or shrinks or
// requeues jobs that cannot be repaired.
func (s *sched) repair(f *flavorRT) {
	var need []*jobRT
	for _, j := range f.jobs {
		if j.repairNeed > 0 {
			need = append(need, j)
		}
	}
	slices.SortFunc(need, jobOrder)
	for _, j := range need {
		var nodes []*nodeRT
		if j.exclusive {
			s.scratch = j.fl.pickWhole(j.per, j.vcpu, j.mem, j.repairNeed, s.scratch[:0])
			nodes = s.scratch
		} else {
			nodes = s.findNodes(j, 1)
		}
		for _, n := range nodes {
			s.attach(j, n)
		}
		if len(nodes) == j.repairNeed {
			j.setRepaired()
			j.lastResize = s.now
			continue
		}
		target := j.floorSize(j.size)
		if target == 0 {
			s.removeNodes(j, j.size)
			j.setRequeued(CodeNodeLost, "node(s) of the allocation lost and no replacement free")
			continue
		}
		s.removeNodes(j, j.size-target)
		j.setShrunk(CodeNodeLost, "")
		j.lastResize = s.now
	}
}

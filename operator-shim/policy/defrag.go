package policy

import (
	"slices"
	"strings"
)

// move is one job moved by defragmentation.
type move struct {
	v        *jobRT
	from, to *nodeRT
}

// tryDefrag is rule 3b: free capacity within the quota exists but is
// fragmented. Borrowers are shrunk or preempted only as far as the quota
// needs, then single-node jobs are moved off the nodes that need the fewest
// moves (each moved job keeps its size; jobs resized or moved within the
// stable period are never moved). All or nothing.
func (s *sched) tryDefrag(j *jobRT) bool {
	// Victims only until the quota allows j and enough accelerators are
	// free in total, with one node's worth of slack to move jobs into;
	// moves consolidate them.
	acc := j.per*j.sp.min + j.fl.maxCap
	acts, ok := s.takeVictims(j, false, func() bool { return s.quotaOK(j) && j.fl.freeAccel >= acc })
	if !ok && s.quotaOK(j) {
		ok = true // no borrower left: try with the slack there is
	}
	if !ok {
		s.undoAll(acts)
		return false
	}
	moves, ok := s.defrag(j)
	if !ok {
		s.undoAll(acts)
		return false
	}
	s.commitVictims(j, acts, CodeReclaim)
	s.defragged = true
	for _, m := range moves {
		v := m.v
		v.setMoved(j)
		v.lastResize = s.now
	}
	s.admit(j, s.findNodes(j, j.sp.min), CodeReclaim)
	return true
}

// defrag clears nodes for j by moving single-node jobs elsewhere. On
// success j fits (findNodes finds its nodes); on failure nothing changed.
func (s *sched) defrag(j *jobRT) ([]move, bool) {
	f := j.fl
	need := 1
	var targets []*nodeRT
	if j.exclusive {
		// Whole nodes already free count, and are kept out of the moves.
		targets = slices.Clone(f.pickWhole(j.per, j.vcpu, j.mem, j.sp.min, s.scratch[:0]))
		need = j.sp.min
		for _, n := range targets {
			n.usable = false
			n.reindex()
		}
	}
	restore := func() {
		for _, n := range targets {
			n.usable = true
			n.reindex()
		}
	}
	if len(targets) >= need {
		restore()
		return nil, true
	}
	var cands []defragCand
	for _, sh := range f.shapes {
		if sh.cap < j.per {
			continue
		}
		for _, n := range sh.nodes {
			if !n.usable || n.exclusive || len(n.jobs) == 0 {
				continue
			}
			if c, ok := s.clearFor(j, n); ok {
				cands = append(cands, c)
			}
		}
	}
	if len(targets)+len(cands) < need {
		restore()
		return nil, false
	}
	slices.SortStableFunc(cands, func(a, b defragCand) int { return a.cost - b.cost })
	moves, targets := s.moveOff(f, cands, targets, need)
	restore()
	if len(targets) < need || !s.canPlace(j, j.sp.min) {
		s.undoMoves(moves)
		return nil, false
	}
	return moves, true
}

// defragCand is a node defragmentation may clear for a job: the tenants
// to move off it (take) and their accelerators (cost).
type defragCand struct {
	n    *nodeRT
	cost int
	take []*jobRT
}

// movable reports whether defragmentation may move v. A job moves at most
// once per stable period: one never resized or moved since admission may
// move; one resized or moved before only after the stable period.
func (s *sched) movable(v *jobRT) bool {
	return !v.exclusive && !v.yielded() && v.size == 1 &&
		(v.admitted() || v.since.Equal(v.lastResize) || s.stable <= 0 || s.now.Sub(v.lastResize) >= s.stable)
}

// clearFor picks the tenants of n to move for j to fit there: every one,
// largest first, for an exclusive j, else the fewest accelerators that
// close the gap (the smallest single tenant that does, else smallest
// first). ok is false when moving them would not make room.
func (s *sched) clearFor(j *jobRT, n *nodeRT) (c defragCand, ok bool) {
	var take []*jobRT
	free := n.free()
	fitsNow := func(free, vfree int, mfree int64) bool {
		return free >= j.per && (j.vcpu == 0 || n.vcpuCap == 0 || vfree >= j.vcpu) && (j.mem == 0 || n.memCap == 0 || mfree >= j.mem)
	}
	okNode := true
	if j.exclusive {
		take = slices.Clone(n.jobs)
		slices.SortFunc(take, func(a, b *jobRT) int {
			if a.per != b.per {
				return b.per - a.per
			}
			return strings.Compare(a.name, b.name)
		})
		for _, v := range take {
			okNode = okNode && s.movable(v)
		}
		free = n.cap
	} else {
		ts := slices.Clone(n.jobs)
		slices.SortFunc(ts, func(a, b *jobRT) int {
			if a.per != b.per {
				return a.per - b.per
			}
			return strings.Compare(a.name, b.name)
		})
		vfree, mfree := n.vcpuCap-n.vcpuUsed, n.memCap-n.memUsed
		for _, v := range ts {
			if s.movable(v) && fitsNow(free+v.per, vfree+v.vcpu, mfree+v.mem) {
				take = []*jobRT{v}
				free += v.per
				break
			}
		}
		if take == nil {
			for _, v := range ts {
				if fitsNow(free, vfree, mfree) {
					break
				}
				if s.movable(v) {
					take = append(take, v)
					free += v.per
					vfree += v.vcpu
					mfree += v.mem
				}
			}
			okNode = fitsNow(free, vfree, mfree)
		}
	}
	cost := 0
	for _, v := range take {
		cost += v.per
	}
	return defragCand{n, cost, take}, okNode && free >= j.per
}

// moveOff clears candidates, cheapest first, until need nodes are
// targets (or enough tries failed): each cleared node is kept out of the
// moves' destinations; a node whose tenants do not all find a place is
// left as it was.
func (s *sched) moveOff(f *flavorRT, cands []defragCand, targets []*nodeRT, need int) ([]move, []*nodeRT) {
	var moves []move
	tries := 0
	for _, c := range cands {
		if len(targets) == need || tries > 4*need+8 {
			break
		}
		tries++
		c.n.usable = false
		c.n.reindex()
		var mine []move
		ok := true
		for _, v := range c.take {
			to := f.pickFrac(v.per, v.vcpu, v.mem)
			if to == nil {
				ok = false
				break
			}
			s.moveJob(v, c.n, to)
			mine = append(mine, move{v, c.n, to})
		}
		if !ok {
			s.undoMoves(mine)
			c.n.usable = true
			c.n.reindex()
			continue
		}
		moves = append(moves, mine...)
		targets = append(targets, c.n)
	}
	return moves, targets
}

// undoMoves moves jobs back, the latest first.
func (s *sched) undoMoves(ms []move) {
	for i := len(ms) - 1; i >= 0; i-- {
		s.moveJob(ms[i].v, ms[i].to, ms[i].from)
	}
}

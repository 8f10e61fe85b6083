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
	// A job moves at most once per stable period: one never resized or
	// moved since admission may move; one resized or moved before only
	// after the stable period.
	movable := func(v *jobRT) bool {
		return !v.exclusive && !v.yielded() && v.size == 1 &&
			(v.admitted() || v.since.Equal(v.lastResize) || s.stable <= 0 || s.now.Sub(v.lastResize) >= s.stable)
	}
	type cand struct {
		n    *nodeRT
		cost int
		take []*jobRT
	}
	var cands []cand
	for _, sh := range f.shapes {
		if sh.cap < j.per {
			continue
		}
		for _, n := range sh.nodes {
			if !n.usable || n.exclusive || len(n.jobs) == 0 {
				continue
			}
			var take []*jobRT
			free := n.free()
			fitsNow := func(free, vfree int, mfree int64) bool {
				return free >= j.per && (j.vcpu == 0 || n.vcpuCap == 0 || vfree >= j.vcpu) && (j.mem == 0 || n.memCap == 0 || mfree >= j.mem)
			}
			okNode := true
			if j.exclusive {
				// Every tenant must go, largest first.
				take = slices.Clone(n.jobs)
				slices.SortFunc(take, func(a, b *jobRT) int {
					if a.per != b.per {
						return b.per - a.per
					}
					return strings.Compare(a.name, b.name)
				})
				for _, v := range take {
					okNode = okNode && movable(v)
				}
				free = n.cap
			} else {
				// The fewest accelerators that close the gap: the smallest
				// single tenant that does, else smallest first.
				ts := slices.Clone(n.jobs)
				slices.SortFunc(ts, func(a, b *jobRT) int {
					if a.per != b.per {
						return a.per - b.per
					}
					return strings.Compare(a.name, b.name)
				})
				vfree, mfree := n.vcpuCap-n.vcpuUsed, n.memCap-n.memUsed
				for _, v := range ts {
					if movable(v) && fitsNow(free+v.per, vfree+v.vcpu, mfree+v.mem) {
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
						if movable(v) {
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
			if okNode && free >= j.per {
				cands = append(cands, cand{n, cost, take})
			}
		}
	}
	if len(targets)+len(cands) < need {
		restore()
		return nil, false
	}
	slices.SortStableFunc(cands, func(a, b cand) int { return a.cost - b.cost })
	var moves []move
	undo := func(ms []move) {
		for i := len(ms) - 1; i >= 0; i-- {
			s.moveJob(ms[i].v, ms[i].to, ms[i].from)
		}
	}
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
			undo(mine)
			c.n.usable = true
			c.n.reindex()
			continue
		}
		moves = append(moves, mine...)
		targets = append(targets, c.n)
	}
	restore()
	if len(targets) < need || !s.canPlace(j, j.sp.min) {
		undo(moves)
		return nil, false
	}
	return moves, true
}

package policy

import (
	"cmp"
	"slices"
	"strings"
)

// jobOrder is the admission order: priority desc, submit time asc, name asc.
func jobOrder(a, b *jobRT) int {
	if a.sp.prio != b.sp.prio {
		return b.sp.prio - a.sp.prio
	}
	if c := a.spec.SubmitTime.Compare(b.spec.SubmitTime); c != 0 {
		return c
	}
	return strings.Compare(a.name, b.name)
}

// teamKey orders teams for weighted fair share: the lowest (used - nominal)
// / weight first, so teams below their nominal quota come before borrowers
// and borrowers share idle capacity in proportion to their weights.
func teamKey(a, b *teamFlavor) int {
	ka := float64(a.used-a.nominal) / a.team.weight
	kb := float64(b.used-b.nominal) / b.team.weight
	if ka != kb {
		return cmp.Compare(ka, kb)
	}
	return strings.Compare(a.team.name, b.team.name)
}

// shrinkOrder: lowest priority first, then the most recently resized, then name.
func shrinkOrder(a, b *jobRT) int {
	if a.sp.prio != b.sp.prio {
		return a.sp.prio - b.sp.prio
	}
	if c := b.lastResize.Compare(a.lastResize); c != 0 {
		return c
	}
	return strings.Compare(a.name, b.name)
}

// preemptOrder: lowest priority first, then the newest, then name.
func preemptOrder(a, b *jobRT) int {
	if a.sp.prio != b.sp.prio {
		return a.sp.prio - b.sp.prio
	}
	if c := b.since.Compare(a.since); c != 0 {
		return c
	}
	return strings.Compare(a.name, b.name)
}

// victimKey is a victim's place in shrinkOrder or preemptOrder, held in
// the list being sorted: a fleet's borrower list is tens of thousands of
// jobs, and comparisons that read no job record sort it several times
// faster.
type victimKey struct {
	prio int
	sec  int64 // the time's seconds and nanoseconds: a zero time has no UnixNano
	nsec int
	name string
	j    *jobRT
}

// sortVictims sorts list as shrinkOrder (by lastResize) or preemptOrder
// (by since) would: lowest priority first, then the newest time, then
// name. keys is scratch space, returned for reuse.
func sortVictims(list []*jobRT, byResize bool, keys []victimKey) []victimKey {
	keys = keys[:0]
	for _, v := range list {
		t := v.since
		if byResize {
			t = v.lastResize
		}
		keys = append(keys, victimKey{prio: v.sp.prio, sec: t.Unix(), nsec: t.Nanosecond(), name: v.name, j: v})
	}
	slices.SortFunc(keys, func(a, b victimKey) int {
		if a.prio != b.prio {
			return a.prio - b.prio
		}
		if a.sec != b.sec {
			return cmp.Compare(b.sec, a.sec)
		}
		if a.nsec != b.nsec {
			return b.nsec - a.nsec
		}
		return strings.Compare(a.name, b.name)
	})
	for i := range keys {
		list[i] = keys[i].j
	}
	return keys
}

package policy

import (
	"cmp"
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

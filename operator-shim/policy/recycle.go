package policy

// Recycle hands back the lists of a Decision this Engine returned that the
// caller no longer reads, nor anything it gave them to (the elements are
// overwritten; what they point to is not). The fast path (Admit, FollowUp)
// then renders a later decision into them instead of allocating a reason
// and an allocation list of every job: at 50,000 jobs 15 MB a submit,
// and on a heap whose free pages went back to the operating system every
// page of them is a page fault (bench/coordinator_daemon). The lists of the
// decision the Engine keeps (the one it returned last) are never taken,
// whatever the caller hands back.
func (e *Engine) Recycle(d Decision) {
	if !sameArray(d.Reasons, e.d.Reasons) {
		e.spareReasons = d.Reasons
	}
	if !sameArray(d.Allocations, e.d.Allocations) {
		e.spareAllocs = d.Allocations
	}
}

// sameArray reports whether a and b start at the same element of one
// array.
func sameArray[T any](a, b []T) bool {
	return cap(a) > 0 && cap(b) > 0 && &a[:1][0] == &b[:1][0]
}

// takeList lends out *spare, emptied, when it has room for n elements,
// else a new list with room to grow (each submit adds a job: later
// renders fit); either way *spare is cleared (a list is lent once).
func takeList[T any](spare *[]T, n int) []T {
	l := *spare
	*spare = nil
	if cap(l) >= n {
		return l[:0]
	}
	return make([]T, 0, withRoom(n))
}

// withRoom is the capacity of a new decision list of n elements: room for
// the fast path's later decisions, each a submit longer, once the list is
// handed back (Recycle).
func withRoom(n int) int { return n + n/32 + 8 }

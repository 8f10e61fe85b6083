package policy

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// recycleFleet is a fleet at its fixed point with n one-accelerator jobs
// of one team, and room for more.
func recycleFleet(t *testing.T, n int) (*Engine, State, Decision) {
	t.Helper()
	st := State{Now: t0, Nodes: mkNodes("n", n/4+8, 8), Teams: []Team{mkTeam("a", 2*n+64)}}
	for i := 0; i < n; i++ {
		st.Jobs = append(st.Jobs, frac(fmt.Sprintf("job-%05d", i), "a", 0, 1))
	}
	e := &Engine{}
	d, fixed := toFixedPoint(e, &st, 8)
	if !fixed {
		t.Fatal("the fleet reached no fixed point")
	}
	return e, st, d
}

// submit adds a one-accelerator job named name to st, in name order.
func submit(st *State, name string) {
	j := frac(name, "a", 0, 1)
	j.SubmitTime = st.Now
	st.Jobs = append(st.Jobs, j)
	slices.SortFunc(st.Jobs, func(a, b Job) int { return strings.Compare(a.Name, b.Name) })
	st.Now = st.Now.Add(100 * time.Millisecond)
}

// admitFirst submits new-1 on the fast path and applies its decision; held
// is a copy of it, to check it later against.
func admitFirst(t *testing.T, e *Engine, st *State) (d1, held Decision) {
	t.Helper()
	submit(st, "new-1")
	d1, ok := e.Admit(*st, []string{"new-1"})
	if !ok {
		t.Fatalf("declined: %s", e.Declined())
	}
	st.Allocations = d1.Allocations
	return d1, Decision{Reasons: slices.Clone(d1.Reasons), Allocations: slices.Clone(d1.Allocations)}
}

// admitSecond submits new-2 and returns the fast path's decision and the
// full cycle's on the same state.
func admitSecond(t *testing.T, e *Engine, st *State) (d2, full Decision) {
	t.Helper()
	submit(st, "new-2")
	full = Schedule(*st)
	d2, ok := e.Admit(*st, []string{"new-2"})
	if !ok {
		t.Fatalf("declined: %s", e.Declined())
	}
	return d2, full
}

// The lists of a decision handed back (Recycle) take the fast path's next
// decision, which is the full cycle's all the same; the decision the
// caller still holds (the last) is left as it was.
func TestRecycledListsTakeTheNextFastPathDecision(t *testing.T) {
	e, st, d0 := recycleFleet(t, 40)
	d1, held := admitFirst(t, e, &st)
	e.Recycle(d0) // d1 is applied: d0 is read no more
	d2, full := admitSecond(t, e, &st)
	if !sameArray(d2.Reasons, d0.Reasons) || !sameArray(d2.Allocations, d0.Allocations) {
		t.Errorf("the fast path allocated new lists for its decision; want the recycled ones")
	}
	if !sameLists(d2, full) {
		t.Errorf("the decision rendered into recycled lists is not the full cycle's")
	}
	if !sameLists(d1, held) {
		t.Errorf("rendering the next decision changed the one the caller holds")
	}
}

// The Engine never takes back the lists of the decision it keeps (the
// last it returned, which its next fast path decision is rendered from),
// whatever the caller hands back.
func TestTheKeptDecisionsListsAreNeverRecycled(t *testing.T) {
	e, st, _ := recycleFleet(t, 40)
	d1, held := admitFirst(t, e, &st)
	e.Recycle(d1) // a caller's mistake: d1 is the kept decision
	d2, full := admitSecond(t, e, &st)
	if sameArray(d2.Reasons, d1.Reasons) || sameArray(d2.Allocations, d1.Allocations) {
		t.Errorf("the kept decision's lists were rendered into")
	}
	if !sameLists(d1, held) {
		t.Errorf("the kept decision changed")
	}
	if !sameLists(d2, full) {
		t.Errorf("the fast path's decision is not the full cycle's")
	}
}

// With its lists recycled, a submit on the fast path allocates less than
// one list of every job's reason (before: both lists, 15 MB a submit at
// 50,000 jobs).
func TestAFastPathSubmitWithRecycledListsAllocatesNoJobList(t *testing.T) {
	const n = 4000
	e, st, prev := recycleFleet(t, n)
	last := prev
	var allocated uint64
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("new-%d", i)
		submit(&st, name)
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		d, ok := e.Admit(st, []string{name})
		runtime.ReadMemStats(&m1)
		if !ok {
			t.Fatalf("declined: %s", e.Declined())
		}
		if i >= 2 { // the first two fill the spares (the full cycle's lists)
			allocated = max(allocated, m1.TotalAlloc-m0.TotalAlloc)
		}
		st.Allocations = d.Allocations
		e.Recycle(last)
		last = d
	}
	list := uint64(n) * uint64(unsafe.Sizeof(Reason{}))
	if allocated >= list {
		t.Errorf("a fast path submit allocated %d bytes at %d jobs; want less than one list of their reasons (%d bytes)", allocated, n, list)
	}
}

package idlegc

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

func TestDue(t *testing.T) {
	const mb = 1 << 20
	for _, tc := range []struct {
		name              string
		heap, goal, burst uint64
		want              bool
	}{
		{"two more bursts fit under the goal: none", 400 * mb, 720 * mb, 30 * mb, false},
		{"the next two bursts could reach the goal: collect", 670 * mb, 720 * mb, 30 * mb, true},
		{"exactly two bursts from the goal: collect", 660 * mb, 720 * mb, 30 * mb, true},
		{"past the goal (a collection is due anyway): collect", 800 * mb, 720 * mb, 1, true},
		{"no burst seen yet: none", 700 * mb, 720 * mb, 0, false},
		{"goal unknown: none", 700 * mb, 0, 30 * mb, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Due(tc.heap, tc.goal, tc.burst); got != tc.want {
				t.Errorf("Due(%d, %d, %d) = %v, want %v", tc.heap, tc.goal, tc.burst, got, tc.want)
			}
		})
	}
}

// fake is a process whose allocation count, heap and goal the test sets.
type fake struct {
	mu                         sync.Mutex
	allocs, heap, goal, cycles uint64
	free, live                 uint64
	collections                int
	release, collecting        chan struct{}
	// armed are the returns' timers the Collector armed, in order.
	armed []*fakeTimer
	// returned counts the returns of memory to the OS, each of which
	// costs 150 ms of the process's CPU (cpu).
	returned int
	cpu      time.Duration
}

// fakeTimer is an armed return's timer: the test fires it.
type fakeTimer struct {
	d       time.Duration
	f       func()
	stopped bool
}

func (t *fakeTimer) Stop() bool { t.stopped = true; return true }

func newFake(goal uint64) (*Collector, *fake) {
	f := &fake{goal: goal, release: make(chan struct{}), collecting: make(chan struct{}, 10)}
	c := &Collector{
		read: func() sample {
			f.mu.Lock()
			defer f.mu.Unlock()
			return sample{allocs: f.allocs, heap: f.heap, goal: f.goal, cycles: f.cycles, free: f.free, live: f.live}
		},
		afterFunc: func(d time.Duration, fn func()) stopper {
			f.mu.Lock()
			defer f.mu.Unlock()
			t := &fakeTimer{d: d, f: fn}
			f.armed = append(f.armed, t)
			return t
		},
		returnMemory: func() {
			f.mu.Lock()
			f.returned++
			f.cpu += 150 * time.Millisecond
			f.mu.Unlock()
		},
		processCPU: func() time.Duration {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.cpu
		},
		collect: func() {
			f.mu.Lock()
			f.collections++
			f.mu.Unlock()
			f.collecting <- struct{}{}
			<-f.release
		},
	}
	return c, f
}

// burst runs one burst of work that allocates n bytes, all kept on the
// heap.
func (f *fake) burst(c *Collector, n uint64, idle bool) bool {
	c.Begin()
	f.mu.Lock()
	f.allocs += n
	f.heap += n
	f.mu.Unlock()
	return c.End(idle)
}

func TestCollectorStartsACollectionBeforeTheBurstThatWouldReachTheGoal(t *testing.T) {
	c, f := newFake(100)
	f.heap = 40
	for i, want := range []bool{false, false, false, true} {
		// Heap after each burst: 50, 60, 70, 80; the next two bursts
		// (20) reach the goal (100) only from 80.
		if got := f.burst(c, 10, true); got != want {
			t.Fatalf("burst %d: started a collection = %v, want %v (heap %d, goal %d)", i+1, got, want, f.heap, f.goal)
		}
	}
	select {
	case <-f.collecting:
	case <-time.After(10 * time.Second):
		t.Fatal("End reported a collection but none ran")
	}
	// While it runs, no second one starts.
	if f.burst(c, 10, true) {
		t.Fatal("a second collection started while the first ran")
	}
	close(f.release)
}

// A collection of Go's own that completed during the burst leaves the
// heap counting its garbage until the sweep ends: End must not take that
// for a heap near the goal and mark it all again.
func TestCollectorStartsNoneAfterGosOwnCollection(t *testing.T) {
	c, f := newFake(100)
	f.heap = 40
	for range 2 {
		f.burst(c, 10, true) // heap 60; bursts of 10
	}
	c.Begin()
	f.mu.Lock()
	f.allocs += 10
	f.heap += 25 // 85: the burst, and garbage not yet swept
	f.cycles++
	f.mu.Unlock()
	if c.End(true) {
		t.Fatal("started a collection right after one of Go's own completed during the burst")
	}
	// The next burst's end, with the heap as high, collects again.
	if !f.burst(c, 0, true) {
		t.Fatal("no collection at the next idle end, the heap within two bursts of the goal")
	}
	<-f.collecting
	close(f.release)
}

func TestCollectorWaitsWhileMoreWorkFollows(t *testing.T) {
	c, f := newFake(100)
	f.heap = 90
	if f.burst(c, 5, false) {
		t.Fatal("started a collection although more work follows at once")
	}
	// The burst was counted: the next idle end collects.
	if !f.burst(c, 0, true) {
		t.Fatal("no collection at the next idle end, with the heap at the goal")
	}
	<-f.collecting
	close(f.release)
}

// One exceptional burst (a cold start's full cycle) does not make every
// later end collect: once two ordinary bursts followed it, the margin is
// theirs again, and the collections are only the ones Go would make.
func TestCollectorForgetsAnExceptionalBurst(t *testing.T) {
	c, f := newFake(1000)
	close(f.release) // collections end at once
	f.heap = 300
	collected := func() {
		<-f.collecting
		f.mu.Lock()
		f.heap = 300 // what the collection left
		f.mu.Unlock()
		testutil.Eventually(t, 10*time.Second, "the collection to end", testutil.True(func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return !c.running
		}))
	}
	if !f.burst(c, 600, true) {
		t.Fatal("no collection after a burst that brought the heap near the goal")
	}
	collected()
	// The exceptional burst is still among the last two.
	if !f.burst(c, 10, true) {
		t.Fatal("no collection while the last two bursts include one that could reach the goal")
	}
	collected()
	for i := range 5 {
		if f.burst(c, 10, true) {
			t.Fatalf("ordinary burst %d after the exceptional one started a collection (heap %d of goal %d)", i+2, f.heap, f.goal)
		}
	}
}

func TestWorthReturning(t *testing.T) {
	const mb = 1 << 20
	for _, tc := range []struct {
		name             string
		free, heap, live uint64
		want             bool
	}{
		{"a cold start's pages kept free: return", 500 * mb, 250 * mb, 240 * mb, true},
		{"garbage the collection would free counts: return", 10 * mb, 400 * mb, 240 * mb, true},
		{"under 64 MiB to hand back: keep", 30 * mb, 40 * mb, 20 * mb, false},
		{"under a quarter of the live heap: keep", 100 * mb, 1000 * mb, 1000 * mb, false},
		{"a quarter of the live heap, and 64 MiB: return", 64 * mb, 256 * mb, 256 * mb, true},
		{"live above the objects (read apart): only the free pages count", 70 * mb, 100 * mb, 120 * mb, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := WorthReturning(tc.free, tc.heap, tc.live); got != tc.want {
				t.Errorf("WorthReturning(%d, %d, %d) = %v, want %v", tc.free, tc.heap, tc.live, got, tc.want)
			}
		})
	}
}

// returning is a fake Collector that returns memory after a wait of a
// minute, with 500 MiB free to hand back.
func returning() (*Collector, *fake) {
	c, f := newFake(1 << 40)
	c.returnAfter = time.Minute
	f.free, f.live, f.heap = 500<<20, 200<<20, 200<<20
	return c, f
}

// fire fires the i-th timer the Collector armed.
func (f *fake) fire(t *testing.T, i int) {
	t.Helper()
	f.mu.Lock()
	if len(f.armed) <= i {
		f.mu.Unlock()
		t.Fatalf("the collector armed %d timers, want at least %d", len(f.armed), i+1)
	}
	tm := f.armed[i]
	f.mu.Unlock()
	tm.f()
}

func TestCollectorReturnsMemoryOnceAWaitLasts(t *testing.T) {
	c, f := returning()
	f.burst(c, 10, true)
	if len(f.armed) != 1 || f.armed[0].d != time.Minute {
		t.Fatalf("after a burst a wait follows: armed %d timers, want one of 1m", len(f.armed))
	}
	f.fire(t, 0)
	if r := c.Returned(); f.returned != 1 || r != (Returned{Count: 1, CPU: 150 * time.Millisecond}) {
		t.Fatalf("the wait lasted: returned memory %d times (Returned %+v), want once, costing 150ms", f.returned, r)
	}
}

func TestABurstDisarmsTheReturn(t *testing.T) {
	c, f := returning()
	f.burst(c, 10, true)
	c.Begin()
	if !f.armed[0].stopped {
		t.Fatal("a burst began during the wait: the return's timer still runs")
	}
	f.fire(t, 0) // a timer that fired as the burst began
	if f.returned != 0 {
		t.Fatalf("a burst began during the wait: returned memory %d times, want none", f.returned)
	}
	c.End(true)
	f.fire(t, 1)
	if f.returned != 1 {
		t.Fatalf("the next wait lasted: returned memory %d times, want once", f.returned)
	}
}

func TestStopDisarmsTheReturn(t *testing.T) {
	c, f := returning()
	f.burst(c, 10, true)
	c.Stop()
	f.fire(t, 0)
	if !f.armed[0].stopped || f.returned != 0 {
		t.Fatalf("stopped: timer stopped %v, returned memory %d times, want stopped and none", f.armed[0].stopped, f.returned)
	}
}

func TestNoReturnWhileMoreWorkFollows(t *testing.T) {
	c, f := returning()
	f.burst(c, 10, false)
	if len(f.armed) != 0 {
		t.Fatalf("more work follows at once: armed %d timers, want none", len(f.armed))
	}
}

func TestNoReturnWithoutAReturnAfter(t *testing.T) {
	c, f := returning()
	c.returnAfter = 0
	f.burst(c, 10, true)
	if len(f.armed) != 0 {
		t.Fatalf("Config.ReturnAfter 0: armed %d timers, want none", len(f.armed))
	}
}

func TestNoReturnWhenLittleWouldComeBack(t *testing.T) {
	c, f := returning()
	f.free = 1 << 20
	f.burst(c, 10, true)
	f.fire(t, 0)
	if f.returned != 0 {
		t.Fatalf("1 MiB free: returned memory %d times, want none (its collection costs more)", f.returned)
	}
}

func TestTheReturnWaitsForTheIdleCollection(t *testing.T) {
	c, f := returning()
	f.goal = 100 // the burst's end starts a collection
	f.heap = 80
	c.bursts[0] = 10
	if !f.burst(c, 10, true) {
		t.Fatal("the burst's end started no collection")
	}
	<-f.collecting
	f.fire(t, 0)
	if f.returned != 0 || len(f.armed) != 2 {
		t.Fatalf("fired while the idle collection runs: returned %d times, armed %d timers; want none and a second timer", f.returned, len(f.armed))
	}
	close(f.release)
	testutil.Eventually(t, 5*time.Second, "the idle collection ends", func() (bool, string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return !c.running, "still running"
	})
	f.fire(t, 1)
	if f.returned != 1 {
		t.Fatalf("the collection ended and the wait lasted: returned %d times, want once", f.returned)
	}
}

func TestAReturnUnderWayHoldsStopAndIdleCollections(t *testing.T) {
	c, f := returning()
	started, finish := make(chan struct{}), make(chan struct{})
	c.returnMemory = func() { close(started); <-finish }
	f.burst(c, 10, true)
	if len(f.armed) != 1 {
		t.Fatalf("armed %d timers after an idle end, want one", len(f.armed))
	}
	go f.armed[0].f()
	<-started
	f.goal, f.heap = 100, 95 // the next burst's end would start a collection
	c.bursts[0] = 10
	if f.burst(c, 1, true) {
		t.Fatal("a burst's end started a collection while a return (itself a collection) runs")
	}
	stopped := make(chan struct{})
	go func() { c.Stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while a return still ran")
	case <-time.After(50 * time.Millisecond):
	}
	close(finish)
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not return once the return finished")
	}
	if r := c.Returned(); r.Count != 1 {
		t.Fatalf("Returned %+v, want one return", r)
	}
}

func TestNewReturnsMemoryToTheOS(t *testing.T) {
	c := New(Config{ReturnAfter: 10 * time.Millisecond})
	defer c.Stop()
	released := func() uint64 {
		s := []metrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	// No collection before the return's own: the burst's garbage is
	// still on the heap when it ends, as after a coordinator's cycle.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	c.Begin()
	garbage := make([][]byte, 0, 256)
	for range 256 {
		garbage = append(garbage, make([]byte, 1<<20))
	}
	sinks = garbage
	sinks = nil
	before := released()
	c.End(true)
	testutil.Eventually(t, 10*time.Second, "the collector returns memory after its 10 ms wait", func() (bool, string) {
		return c.Returned().Count == 1, fmt.Sprintf("%+v", c.Returned())
	})
	if c.Returned().CPU <= 0 {
		t.Errorf("a return's collection of 256 MiB took %s of CPU, want some", c.Returned().CPU)
	}
	if got := released(); got < before+64<<20 {
		t.Fatalf("heap memory returned to the OS: %d MiB -> %d MiB, want 64 MiB more at least (256 MiB of garbage)", before>>20, got>>20)
	}
}

var sinks [][]byte

func TestReadMetricsReadsThisProcess(t *testing.T) {
	for _, n := range names {
		var s [1]metrics.Sample
		s[0].Name = n
		metrics.Read(s[:])
		if s[0].Value.Kind() != metrics.KindUint64 {
			t.Fatalf("runtime/metrics has no uint64 %s: the collector would never start a collection", n)
		}
	}
	s0 := readMetrics()
	sink = make([]byte, 1<<20)
	runtime.GC()
	s1 := readMetrics()
	if s0.heap == 0 || s0.goal == 0 || s1.allocs-s0.allocs < 1<<20 || s1.cycles <= s0.cycles {
		t.Fatalf("readMetrics: allocs %d -> %d after 1 MiB, heap %d, goal %d, collections %d -> %d after one", s0.allocs, s1.allocs, s0.heap, s0.goal, s0.cycles, s1.cycles)
	}
}

var sink []byte

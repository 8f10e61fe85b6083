package idlegc

import (
	"runtime"
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
	collections                int
	release, collecting        chan struct{}
}

func newFake(goal uint64) (*Collector, *fake) {
	f := &fake{goal: goal, release: make(chan struct{}), collecting: make(chan struct{}, 10)}
	c := &Collector{
		read: func() sample {
			f.mu.Lock()
			defer f.mu.Unlock()
			return sample{allocs: f.allocs, heap: f.heap, goal: f.goal, cycles: f.cycles}
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

// Package idlegc starts the garbage collector while a process waits
// between bursts of work, when the next burst would otherwise start one.
//
// Go starts a collection when the heap reaches its goal, that is, while
// something allocates. In a process that allocates only while it works (a
// coordinator deciding, between watch events), every collection therefore
// starts inside a piece of work, and its concurrent mark slows that work
// down. A Collector watches how much each burst allocates and, at the end
// of one, starts a collection at once when the next burst could reach the
// goal: the mark then overlaps the wait instead.
package idlegc

import (
	"runtime"
	"runtime/metrics"
	"sync"
)

// Due reports whether a collection should start now: the heap (heap
// bytes, live or not yet collected) is within twice the largest recent
// burst of the goal, so the next burst could start one. Go would start
// that collection a burst or two later anyway: collecting at the end of a
// burst moves it, it does not add one. A burst of 0 (no
// history) or a goal of 0 (unknown) starts none.
func Due(heap, goal, burst uint64) bool {
	if burst == 0 || goal == 0 {
		return false
	}
	return heap+2*burst >= goal
}

// history is how many bursts the largest is taken over: the last two, so
// that a burst alternating with a larger one (a submit and its follow-up)
// is covered, while one exceptional burst (a cold start's full cycle) is
// forgotten after two more, rather than making every end for long after
// start a collection it does not need.
const history = 2

// Collector tracks the bursts of one process's work. Begin and End bracket
// each burst; they are meant for one goroutine (a loop), and the
// collection End starts runs on its own.
type Collector struct {
	mu      sync.Mutex
	begin   sample          // what Begin read
	bursts  [history]uint64 // the latest bursts' allocations
	next    int
	running bool
	// collect starts a collection (runtime.GC; tests replace it).
	collect func()
	// read reads the process's counts (tests replace it).
	read func() sample
}

// sample is what a Collector reads of its process.
type sample struct {
	allocs uint64 // bytes allocated so far
	heap   uint64 // the heap's objects, live or not yet swept
	goal   uint64 // the heap goal
	cycles uint64 // collections completed so far
}

// New returns a Collector for this process.
func New() *Collector {
	return &Collector{collect: runtime.GC, read: readMetrics}
}

// Begin marks the start of a burst of work.
func (c *Collector) Begin() {
	b := c.read()
	c.mu.Lock()
	c.begin = b
	c.mu.Unlock()
}

// End marks the end of the burst Begin started. idle says whether a wait
// follows (else more work comes at once, and no collection starts: the
// burst is only counted). It reports whether it started a collection; it
// starts none while its last one runs, nor when a collection completed
// during the burst: until the sweep after it ends, the heap still counts
// the garbage it found, and one more would mark the whole heap again for
// nothing.
func (c *Collector) End(idle bool) bool {
	e := c.read()
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.allocs > c.begin.allocs {
		c.bursts[c.next] = e.allocs - c.begin.allocs
		c.next = (c.next + 1) % history
	}
	var burst uint64
	for _, b := range c.bursts {
		burst = max(burst, b)
	}
	if !idle || c.running || e.cycles != c.begin.cycles || !Due(e.heap, e.goal, burst) {
		return false
	}
	c.running = true
	go func() {
		c.collect()
		c.mu.Lock()
		c.running = false
		c.mu.Unlock()
	}()
	return true
}

var names = []string{"/gc/heap/allocs:bytes", "/memory/classes/heap/objects:bytes", "/gc/heap/goal:bytes", "/gc/cycles/total:gc-cycles"}

// readMetrics reads this process's sample.
func readMetrics() sample {
	s := make([]metrics.Sample, len(names))
	for i, n := range names {
		s[i].Name = n
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return sample{allocs: v(0), heap: v(1), goal: v(2), cycles: v(3)}
}

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
//
// A Collector can also return the heap's free memory to the operating
// system once a wait has lasted long enough (Config.ReturnAfter). Go keeps
// the pages a burst grew the heap by for the next burst; a process that
// then waits for minutes holds them resident all that time, and on some
// virtual machines every wake-up of the process (a lease renewal, a
// timer) costs CPU in proportion to its resident memory.
package idlegc

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"syscall"
	"time"
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

// minReturn is the least memory a return must be able to hand back to
// be worth its collection.
const minReturn = 64 << 20

// WorthReturning reports whether returning memory to the operating system
// is worth the full collection it takes: what it could hand back (the
// heap's free pages not yet returned, and its objects that were not live
// at the last collection) is at least 64 MiB and at least a quarter of the
// live heap (which the collection marks once more).
func WorthReturning(free, objects, live uint64) bool {
	var dead uint64
	if objects > live {
		dead = objects - live
	}
	back := free + dead
	return back >= minReturn && back >= live/4
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
	running bool // a collection End started, or a return, runs
	// collect starts a collection (runtime.GC; tests replace it).
	collect func()
	// read reads the process's counts (tests replace it).
	read func() sample

	// returnAfter is Config.ReturnAfter.
	returnAfter time.Duration
	// begun counts Begin's calls: a return armed at the end of burst n
	// runs only while begun is still n.
	begun uint64
	// pending is the armed return's timer; nil: none.
	pending stopper
	// afterFunc arms a timer (time.AfterFunc; tests replace it).
	afterFunc func(time.Duration, func()) stopper
	// returnMemory returns memory to the OS (debug.FreeOSMemory; tests
	// replace it).
	returnMemory func()
	// processCPU reads the process's CPU time so far (getrusage; tests
	// replace it).
	processCPU func() time.Duration
	// returned is what the returns cost.
	returned Returned
	// inflight is the return under way (Stop waits for it).
	inflight sync.WaitGroup
}

// Returned counts a Collector's returns of memory to the operating system
// and what they cost.
type Returned struct {
	// Count is how many returns the Collector made.
	Count uint64
	// CPU is the process's CPU time during them: their collections and
	// the release of the pages.
	CPU time.Duration
}

// stopper is an armed timer.
type stopper interface{ Stop() bool }

// Config is a Collector's configuration.
type Config struct {
	// ReturnAfter, when above 0, is how long a wait must last before the
	// Collector returns the heap's free memory to the operating system
	// (debug.FreeOSMemory: one full collection, then every free page
	// handed back), where WorthReturning says it pays. Once per wait: the
	// next burst grows the heap again as it needs.
	ReturnAfter time.Duration
}

// sample is what a Collector reads of its process.
type sample struct {
	allocs uint64 // bytes allocated so far
	heap   uint64 // the heap's objects, live or not yet swept
	goal   uint64 // the heap goal
	cycles uint64 // collections completed so far
	free   uint64 // the heap's free pages not yet returned to the OS
	live   uint64 // the heap's live bytes at the last collection
}

// New returns a Collector for this process.
func New(cfg Config) *Collector {
	return &Collector{collect: runtime.GC, read: readMetrics, returnAfter: cfg.ReturnAfter,
		afterFunc: func(d time.Duration, f func()) stopper { return time.AfterFunc(d, f) }, returnMemory: debug.FreeOSMemory,
		processCPU: processCPU}
}

// Begin marks the start of a burst of work. It disarms the return the
// last burst's end armed.
func (c *Collector) Begin() {
	b := c.read()
	c.mu.Lock()
	c.begin = b
	c.begun++
	c.disarm()
	c.mu.Unlock()
}

// Stop disarms a pending return and waits for one under way to finish
// (a return cannot be interrupted); the next burst's end that a wait
// follows arms one again. Call it before work that does not go between
// Begin and End, and when the process stops working.
func (c *Collector) Stop() {
	c.mu.Lock()
	c.begun++
	c.disarm()
	c.mu.Unlock()
	c.inflight.Wait()
}

// Returned reports the Collector's returns of memory to the operating
// system so far.
func (c *Collector) Returned() Returned {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.returned
}

// disarm stops the pending return's timer; c.mu is held.
func (c *Collector) disarm() {
	if c.pending != nil {
		c.pending.Stop()
		c.pending = nil
	}
}

// arm arms the return of the wait after burst n; c.mu is held.
func (c *Collector) arm(n uint64) {
	c.disarm()
	c.pending = c.afterFunc(c.returnAfter, func() { c.returnIfWaiting(n) })
}

// returnIfWaiting returns memory to the OS if no burst began since burst
// n ended and WorthReturning says it pays. While the end's collection
// still runs, it waits another ReturnAfter. A return under way is not
// interrupted: a burst that begins meanwhile runs beside it (Stop waits
// for it), and no idle collection starts until it is done.
func (c *Collector) returnIfWaiting(n uint64) {
	c.mu.Lock()
	if c.begun != n {
		c.mu.Unlock()
		return
	}
	if c.running {
		c.arm(n)
		c.mu.Unlock()
		return
	}
	c.pending = nil
	if s := c.read(); !WorthReturning(s.free, s.heap, s.live) {
		c.mu.Unlock()
		return
	}
	c.running = true
	c.inflight.Add(1)
	c.mu.Unlock()
	defer c.inflight.Done()
	cpu0 := c.processCPU()
	c.returnMemory()
	cpu := c.processCPU() - cpu0
	c.mu.Lock()
	c.running = false
	c.returned.Count++
	c.returned.CPU += cpu
	c.mu.Unlock()
}

// processCPU is the process's user and system CPU time so far; 0 where
// getrusage fails.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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
	if idle && c.returnAfter > 0 {
		c.arm(c.begun)
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

var names = []string{"/gc/heap/allocs:bytes", "/memory/classes/heap/objects:bytes", "/gc/heap/goal:bytes", "/gc/cycles/total:gc-cycles",
	"/memory/classes/heap/free:bytes", "/gc/heap/live:bytes"}

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
	return sample{allocs: v(0), heap: v(1), goal: v(2), cycles: v(3), free: v(4), live: v(5)}
}

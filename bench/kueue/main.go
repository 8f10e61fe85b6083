// Command kueue runs Kueue's scheduler-performance baseline scenario
// (kubernetes-sigs/kueue test/performance/scheduler/configs/baseline/
// generator.yaml) through our policy engine in real time with simulated
// execution:
//
//   - 5 cohorts x 6 cluster queues = 30 teams, nominal quota 20, borrowing
//     limit 100, reclaimWithinCohort Any (our reclaim), withinClusterQueue
//     LowerPriority (our preemption policy);
//   - per queue: 350 small (1 unit, 200 ms, priority 50, one every 100 ms),
//     100 medium (5 units, 500 ms, priority 100, every 500 ms), 50 large
//     (20 units, 1 s, priority 200, every 1.2 s): 15,000 workloads.
//
// Workloads are created at their real times, the engine runs in a loop
// (whenever something changed), admitted workloads "run" for their runtime
// and then finish. A preempted or moved workload loses its progress and
// runs again from the start when readmitted (Kueue workloads have no
// checkpoint).
//
// Units are accelerators of one flavor on a fractional pool: -nodes nodes
// of -node-size units each (default 5 x 120 = 600, the sum of the nominal
// quotas); every workload is a single-node job asking for its size in units
// (bin-packed). Kueue priorities 50/100/200 map to 20/50/80.
//
// With -daemon the scenario runs through the coordinator daemon and etcd
// instead (see runDaemon).
//
//	go run ./bench/kueue [-scale 1.0] [-daemon]
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

const flavor = "kueue-units"

type class struct {
	name     string
	count    int
	interval time.Duration
	runtime  time.Duration
	priority int
	size     int
}

var classes = []class{
	{"small", 350, 100 * time.Millisecond, 200 * time.Millisecond, 20, 1},
	{"medium", 100, 500 * time.Millisecond, 500 * time.Millisecond, 50, 5},
	{"large", 50, 1200 * time.Millisecond, time.Second, 80, 20},
}

type workload struct {
	spec     policy.Job
	create   time.Duration
	runtime  time.Duration
	started  time.Duration
	end      time.Duration
	running  bool
	done     bool
	admitted bool
	units    int
	evicted  int
}

func main() {
	nodes := flag.Int("nodes", 5, "nodes in the pool")
	nodeSize := flag.Int("node-size", 120, "units per node")
	scale := flag.Float64("scale", 1.0, "fraction of each class's workload count (for quick runs)")
	moves := flag.Bool("moves", true, "let the engine move workloads to defragment")
	daemon := flag.Bool("daemon", false, "run the scenario through the coordinator daemon and etcd (real time), not the engine alone")
	flag.Parse()

	st, wls, totalNominal := scenario(*nodes, *nodeSize, *scale, *moves)
	if *daemon {
		if err := runDaemon(st, wls, totalNominal, *moves); err != nil {
			fail(err)
		}
		return
	}
	runtime.GC()
	e := newEngineSim(st, wls)
	for e.finished < len(wls) {
		e.step()
	}
	wall := time.Since(e.start)
	e.usedInt += float64(e.used) * (wall - e.lastChange).Seconds()
	usage := 100 * e.usedInt / wall.Seconds() / float64(totalNominal)
	fmt.Printf("# Kueue baseline (generator.yaml): %d workloads, 30 queues in 5 cohorts, nominal 20, borrowing limit 100; pool %d x %d units; moves %v\n",
		len(wls), *nodes, *nodeSize, *moves)
	fmt.Printf("# wall = first creation to last completion, real time; %d engine cycles, %.1f ms mean, %.1f ms max; %d evictions (preempted or moved, rerun from scratch)\n",
		e.cycles, float64(e.engineTime.Microseconds())/1000/float64(max(e.cycles, 1)), float64(e.maxCycle.Microseconds())/1000, e.evictions)
	fmt.Printf("# usage = Kueue's recorder definition: sum over queues of used quota x time / monitoring time (wall), over total nominal quota (600)\n")
	fmt.Printf("BENCH kueue_baseline_wall %.1f s anchor=351 target=90\n", wall.Seconds())
	fmt.Printf("BENCH kueue_baseline_usage %.1f %% anchor=58.7 target=85\n", usage)
}

// scenario is the baseline's pool, its 30 teams and their workloads in
// creation order.
func scenario(nodes, nodeSize int, scale float64, moves bool) (policy.State, []*workload, int) {
	st := policy.State{Config: policy.Config{DisableMoves: !moves}}
	for i := 0; i < nodes; i++ {
		st.Nodes = append(st.Nodes, policy.Node{Name: fmt.Sprintf("pool-%d", i), Flavor: flavor, Accelerators: nodeSize})
	}
	bl := 100
	totalNominal := 0
	var wls []*workload
	for c := 0; c < 5; c++ {
		for q := 0; q < 6; q++ {
			team := fmt.Sprintf("cohort%d-cq%d", c, q)
			st.Teams = append(st.Teams, policy.Team{Name: team, Cohort: fmt.Sprintf("cohort%d", c), Preemption: policy.PreemptLowerPriority,
				Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 20, BorrowingLimit: &bl}}})
			totalNominal += 20
			for _, cl := range classes {
				n := int(float64(cl.count) * scale)
				for k := 0; k < n; k++ {
					p := cl.priority
					create := time.Duration(k) * cl.interval
					wls = append(wls, &workload{
						spec: policy.Job{Name: fmt.Sprintf("%s-%s-%03d", team, cl.name, k), Team: team, Priority: &p,
							PerNode: policy.Resources{Accelerators: cl.size}},
						create: create, runtime: cl.runtime, units: cl.size,
					})
				}
			}
		}
	}
	slices.SortStableFunc(wls, func(a, b *workload) int { return int(a.create - b.create) })
	return st, wls, totalNominal
}

// engineSim runs the scenario against the engine alone in real time: the
// engine runs whenever something changed, admitted workloads run for
// their runtime.
type engineSim struct {
	st     policy.State
	wls    []*workload
	byName map[string]*workload
	// start is when the run began; epoch the submit times' origin.
	start, epoch time.Time
	next         int
	active       []*workload
	allocs       []policy.Allocation
	used         int
	usedInt      float64 // unit-seconds
	lastChange   time.Duration
	finished     int
	cycles       int
	engineTime   time.Duration
	maxCycle     time.Duration
	evictions    int
	dirty        bool
}

func newEngineSim(st policy.State, wls []*workload) *engineSim {
	e := &engineSim{st: st, wls: wls, byName: make(map[string]*workload, len(wls))}
	for _, w := range wls {
		e.byName[w.spec.Name] = w
	}
	e.start = time.Now()
	e.epoch = e.start
	return e
}

// step creates and finishes the workloads due, runs the engine when
// something changed, and sleeps until the next creation or completion.
func (e *engineSim) step() {
	now := time.Since(e.start)
	// Usage integral up to now.
	e.usedInt += float64(e.used) * (now - e.lastChange).Seconds()
	e.lastChange = now
	for e.next < len(e.wls) && e.wls[e.next].create <= now {
		w := e.wls[e.next]
		w.spec.SubmitTime = e.epoch.Add(w.create)
		e.active = append(e.active, w)
		e.next++
		e.dirty = true
	}
	for _, w := range e.active {
		if w.running && w.end <= now {
			w.running, w.done = false, true
			e.used -= w.units
			e.finished++
			e.dirty = true
		}
	}
	if e.dirty {
		e.cycle(now)
	}
	// Sleep until the next creation or completion.
	wake := time.Duration(1<<62 - 1)
	if e.next < len(e.wls) {
		wake = e.wls[e.next].create
	}
	for _, w := range e.active {
		if w.running && w.end < wake {
			wake = w.end
		}
	}
	if d := wake - time.Since(e.start); d > 0 && !e.dirty {
		time.Sleep(min(d, 50*time.Millisecond))
	}
}

// cycle drops the finished workloads and runs the engine, applying its
// admissions, preemptions and moves.
func (e *engineSim) cycle(now time.Duration) {
	keep := e.active[:0]
	for _, w := range e.active {
		if !w.done {
			keep = append(keep, w)
		}
	}
	e.active = keep
	k := e.allocs[:0:0]
	for _, a := range e.allocs {
		if !e.byName[a.Job].done {
			k = append(k, a)
		}
	}
	e.allocs = k
	e.st.Jobs = e.st.Jobs[:0]
	for _, w := range e.active {
		e.st.Jobs = append(e.st.Jobs, w.spec)
	}
	e.st.Allocations = e.allocs
	e.st.Now = e.epoch.Add(now)
	t0 := time.Now()
	d := policy.Schedule(e.st)
	el := time.Since(t0)
	e.engineTime += el
	e.maxCycle = max(e.maxCycle, el)
	e.cycles++
	e.allocs = d.Allocations
	e.dirty = false
	now = time.Since(e.start)
	for _, r := range d.Reasons {
		w := e.byName[r.Job]
		switch r.Kind {
		case policy.KindAdmitted:
			w.running, w.admitted = true, true
			w.started, w.end = now, now+w.runtime
			e.used += w.units
		case policy.KindPreempted:
			w.running = false
			e.used -= w.units
			w.evicted++
			e.evictions++
			e.dirty = true // readmission is decided on the next cycle
		case policy.KindMoved:
			w.started, w.end = now, now+w.runtime // restarts from scratch
			e.evictions++
		}
	}
	if len(d.Problems) > 0 {
		fmt.Fprintf(os.Stderr, "problems: %+v\n", d.Problems[0])
		os.Exit(1)
	}
}

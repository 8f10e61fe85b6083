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

	st := policy.State{Config: policy.Config{DisableMoves: !*moves}}
	for i := 0; i < *nodes; i++ {
		st.Nodes = append(st.Nodes, policy.Node{Name: fmt.Sprintf("pool-%d", i), Flavor: flavor, Accelerators: *nodeSize})
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
				n := int(float64(cl.count) * *scale)
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
	byName := make(map[string]*workload, len(wls))
	for _, w := range wls {
		byName[w.spec.Name] = w
	}

	if *daemon {
		if err := runDaemon(st, wls, totalNominal, *moves); err != nil {
			fail(err)
		}
		return
	}
	runtime.GC()
	start := time.Now()
	epoch := start
	next := 0
	var active []*workload
	var allocs []policy.Allocation
	used := 0
	var usedInt float64 // unit-seconds
	lastChange := time.Duration(0)
	finished := 0
	cycles := 0
	var engineTime, maxCycle time.Duration
	evictions := 0
	dirty := false
	for finished < len(wls) {
		now := time.Since(start)
		// Usage integral up to now.
		usedInt += float64(used) * (now - lastChange).Seconds()
		lastChange = now
		for next < len(wls) && wls[next].create <= now {
			w := wls[next]
			w.spec.SubmitTime = epoch.Add(w.create)
			active = append(active, w)
			next++
			dirty = true
		}
		for _, w := range active {
			if w.running && w.end <= now {
				w.running, w.done = false, true
				used -= w.units
				finished++
				dirty = true
			}
		}
		if dirty {
			keep := active[:0]
			for _, w := range active {
				if !w.done {
					keep = append(keep, w)
				}
			}
			active = keep
			k := allocs[:0:0]
			for _, a := range allocs {
				if !byName[a.Job].done {
					k = append(k, a)
				}
			}
			allocs = k
			st.Jobs = st.Jobs[:0]
			for _, w := range active {
				st.Jobs = append(st.Jobs, w.spec)
			}
			st.Allocations = allocs
			st.Now = epoch.Add(now)
			t0 := time.Now()
			d := policy.Schedule(st)
			el := time.Since(t0)
			engineTime += el
			maxCycle = max(maxCycle, el)
			cycles++
			allocs = d.Allocations
			dirty = false
			now = time.Since(start)
			for _, r := range d.Reasons {
				w := byName[r.Job]
				switch r.Kind {
				case policy.KindAdmitted:
					w.running, w.admitted = true, true
					w.started, w.end = now, now+w.runtime
					used += w.units
				case policy.KindPreempted:
					w.running = false
					used -= w.units
					w.evicted++
					evictions++
					dirty = true // readmission is decided on the next cycle
				case policy.KindMoved:
					w.started, w.end = now, now+w.runtime // restarts from scratch
					evictions++
				}
			}
			if len(d.Problems) > 0 {
				fmt.Fprintf(os.Stderr, "problems: %+v\n", d.Problems[0])
				os.Exit(1)
			}
		}
		// Sleep until the next creation or completion.
		wake := time.Duration(1<<62 - 1)
		if next < len(wls) {
			wake = wls[next].create
		}
		for _, w := range active {
			if w.running && w.end < wake {
				wake = w.end
			}
		}
		if d := wake - time.Since(start); d > 0 && !dirty {
			time.Sleep(min(d, 50*time.Millisecond))
		}
	}
	wall := time.Since(start)
	usedInt += float64(used) * (wall - lastChange).Seconds()
	usage := 100 * usedInt / wall.Seconds() / float64(totalNominal)
	fmt.Printf("# Kueue baseline (generator.yaml): %d workloads, 30 queues in 5 cohorts, nominal 20, borrowing limit 100; pool %d x %d units; moves %v\n",
		len(wls), *nodes, *nodeSize, *moves)
	fmt.Printf("# wall = first creation to last completion, real time; %d engine cycles, %.1f ms mean, %.1f ms max; %d evictions (preempted or moved, rerun from scratch)\n",
		cycles, float64(engineTime.Microseconds())/1000/float64(max(cycles, 1)), float64(maxCycle.Microseconds())/1000, evictions)
	fmt.Printf("# usage = Kueue's recorder definition: sum over queues of used quota x time / monitoring time (wall), over total nominal quota (600)\n")
	fmt.Printf("BENCH kueue_baseline_wall %.1f s anchor=351 target=90\n", wall.Seconds())
	fmt.Printf("BENCH kueue_baseline_usage %.1f %% anchor=58.7 target=85\n", usage)
}

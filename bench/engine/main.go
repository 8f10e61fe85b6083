// Command engine measures one policy-engine cycle (policy.Schedule) on a
// fleet of 5,000 nodes (8 GPUs each), 10,000 jobs and 100 teams: the cold
// first cycle (every job new) and the median of steady-state cycles, where
// each cycle feeds the previous allocations back, advances 10 s, finishes
// 1% of the jobs and submits as many new ones.
//
//	go run ./bench/engine [-nodes 5000 -jobs 10000 -teams 100 -cycles 15]
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

const flavor = "nvidia-h100-80gb"

func main() {
	nodes := flag.Int("nodes", 5000, "nodes (8 GPUs each)")
	jobs := flag.Int("jobs", 10000, "jobs")
	teams := flag.Int("teams", 100, "teams")
	cycles := flag.Int("cycles", 15, "steady-state cycles (median reported)")
	seed := flag.Uint64("seed", 1, "random seed")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the steady-state cycles")
	admitprofile := flag.String("admitprofile", "", "write a CPU profile of the fast path's submits (after the steady state)")
	name := flag.String("name", "", "the steady-state BENCH line's name (default engine_cycle_NODESn_JOBSj_TEAMSt)")
	target := flag.Float64("target", 100, "the steady-state cycle's target, ms")
	submits := flag.Int("submits", 15, "single submits decided on the engine's fast path after the steady state (0: none)")
	flag.Parse()

	rng := rand.New(rand.NewPCG(*seed, 7))
	st := fleet(*nodes, *teams)
	id := 0
	newJob := func(now time.Time) policy.Job {
		id++
		// Skewed team popularity: busy teams borrow, quiet ones lend and
		// reclaim when their jobs arrive.
		u := rng.Float64()
		return randomJob(rng, fmt.Sprintf("job-%06d", id), fmt.Sprintf("team-%03d", int(u*u*float64(*teams))), now)
	}
	for i := 0; i < *jobs; i++ {
		st.Jobs = append(st.Jobs, newJob(st.Now.Add(-time.Duration(*jobs-i)*time.Second)))
	}

	runtime.GC()
	start := time.Now()
	d := policy.Schedule(st)
	cold := time.Since(start)
	report("cold", d, cold)

	stopProfile := profileCPU(*cpuprofile)
	var times []time.Duration
	total := map[policy.ReasonKind]int{}
	for c := 0; c < *cycles; c++ {
		st.Allocations = d.Allocations
		st.Now = st.Now.Add(10 * time.Second)
		// 1% of the jobs finish, as many arrive.
		churn := len(st.Jobs) / 100
		for k := 0; k < churn; k++ {
			i := rng.IntN(len(st.Jobs))
			st.Jobs[i] = newJob(st.Now)
		}
		runtime.GC()
		start = time.Now()
		d = policy.Schedule(st)
		el := time.Since(start)
		times = append(times, el)
		for _, r := range d.Reasons {
			if r.Kind != policy.KindRunning && r.Kind != policy.KindPending {
				total[r.Kind]++
			}
		}
		if c == *cycles-1 {
			report("steady", d, el)
		}
	}
	stopProfile()
	slices.Sort(times)
	med := times[len(times)/2]
	fmt.Printf("# %d nodes x 8 GPUs, %d jobs, %d teams (10 cohorts), GOMAXPROCS=%d; steady state: median of %d cycles with 1%% job churn each\n",
		*nodes, *jobs, *teams, runtime.GOMAXPROCS(0), *cycles)
	fmt.Printf("# changes over the steady-state cycles: %v\n", total)
	fmt.Printf("# steady-state cycles: min %.1f ms, median %.1f ms, max %.1f ms\n", ms(times[0]), ms(med), ms(times[len(times)-1]))
	// The cold cycle's target (100 ms) is the one for the default fleet
	// (5,000 nodes, 10,000 jobs, 100 teams); no target is set at other
	// sizes, and none is printed there.
	coldTarget := ""
	if *nodes == 5000 && *jobs == 10000 && *teams == 100 {
		coldTarget = " target=100"
	}
	fmt.Printf("BENCH engine_cycle_cold_%dn_%dj_%dt %.1f ms%s\n", *nodes, *jobs, *teams, ms(cold), coldTarget)
	if *name == "" {
		*name = fmt.Sprintf("engine_cycle_%dn_%dj_%dt", *nodes, *jobs, *teams)
	}
	fmt.Printf("BENCH %s %.1f ms target=%g\n", *name, ms(med), *target)
	admits(st, *submits, newJob, *admitprofile, false)
	admits(st, *submits, newJob, "", true)
}

// admits measures the engine's fast path (policy.Engine.Admit): single
// 1-accelerator submits into the steady state, each after a full cycle
// that changed nothing, as the coordinator runs them; the submits Admit
// declines (a full cycle decides them) are counted, not timed.
//
// With elastic, the submits are elastic whole-node jobs (8 accelerators a
// node, 1 to 4 nodes), which rule 7 grows at once where nodes are free.
func admits(st policy.State, n int, newJob func(time.Time) policy.Job, profile string, elastic bool) {
	if n <= 0 {
		return
	}
	slices.SortFunc(st.Jobs, func(a, b policy.Job) int { return strings.Compare(a.Name, b.Name) })
	var e policy.Engine
	// As the coordinator does: once a decision is applied, the one
	// before it is handed back and the fast path renders into its lists.
	var last policy.Decision
	apply := func(d policy.Decision) {
		e.Recycle(last)
		last = d
		st.Allocations = d.Allocations
	}
	settle := func() {
		for i := 0; i < 8; i++ {
			d := e.Schedule(st)
			same := len(d.Allocations) == len(st.Allocations)
			apply(d)
			st.Now = st.Now.Add(time.Second)
			if same && i > 0 {
				return
			}
		}
	}
	settle()
	defer profileCPU(profile)()
	var times, follows []time.Duration
	var allocated uint64 // bytes Admit allocated, over the fast path's submits
	declined := map[string]int{}
	preempting := 0 // of the fast path's
	var ms0, ms1 runtime.MemStats
	for i := 0; i < n; i++ {
		j := newJob(st.Now)
		j.Name = fmt.Sprintf("zz-submit-%04d", i) // after every other name
		j.PerNode.Accelerators, j.MinNodes, j.MaxNodes, j.Elastic = 1, 0, 0, false
		if elastic {
			j.PerNode.Accelerators, j.MinNodes, j.MaxNodes, j.Elastic = 8, 1, 4, true
		}
		st.Jobs = append(st.Jobs, j)
		st.Now = st.Now.Add(100 * time.Millisecond)
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		start := time.Now()
		d, ok := e.Admit(st, []string{j.Name})
		el := time.Since(start)
		runtime.ReadMemStats(&ms1)
		if ok {
			times = append(times, el)
			allocated += ms1.TotalAlloc - ms0.TotalAlloc
			apply(d)
			if !e.Settled() {
				// It preempted: the coordinator follows with another
				// cycle, as after the full cycle's preemption, which
				// the engine's FollowUp decides when it can.
				preempting++
				st.Now = st.Now.Add(10 * time.Millisecond)
				runtime.GC()
				start := time.Now()
				d, ok := e.FollowUp(st)
				if el := time.Since(start); ok {
					follows = append(follows, el)
					apply(d)
				} else {
					settle()
				}
			}
			continue
		}
		why := e.Declined()
		if k := strings.Index(why, ": "); strings.HasPrefix(why, "job ") && k > 0 {
			why = why[k+2:]
		}
		declined[why]++
		settle()
	}
	what, name := "single submits", "engine_admit"
	if elastic {
		what, name = "elastic submits (1-4 nodes)", "engine_admit_elastic"
	}
	if len(times) == 0 {
		fmt.Printf("# fast path: all %d %s declined: %v\n", n, what, declined)
		return
	}
	slices.Sort(times)
	fmt.Printf("# fast path (policy.Engine.Admit): %d of %d %s (%d of them preempting), min %.1f ms, median %.1f ms, max %.1f ms, %.1f MB allocated per submit; declined (a full cycle decides): %v\n",
		len(times), n, what, preempting, ms(times[0]), ms(times[len(times)/2]), ms(times[len(times)-1]), float64(allocated)/float64(len(times))/1e6, declined)
	if len(follows) > 0 {
		slices.Sort(follows)
		fmt.Printf("# follow-ups on the fast path (policy.Engine.FollowUp): %d of %d, median %.1f ms, max %.1f ms\n",
			len(follows), preempting, ms(follows[len(follows)/2]), ms(follows[len(follows)-1]))
	}
	fmt.Printf("BENCH %s_%dn_%dj %.2f ms\n", name, len(st.Nodes), len(st.Jobs)-n, ms(times[len(times)/2]))
	fmt.Printf("BENCH %s_%dn_%dj_allocated %.1f MB\n", name, len(st.Nodes), len(st.Jobs)-n, float64(allocated)/float64(len(times))/1e6)
}

// profileCPU starts a CPU profile written to path ("": none) and returns
// what stops it.
func profileCPU(path string) (stop func()) {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func report(what string, d policy.Decision, el time.Duration) {
	kinds := map[policy.ReasonKind]int{}
	for _, r := range d.Reasons {
		kinds[r.Kind]++
	}
	used := 0
	for _, a := range d.Allocations {
		used += a.Size * a.AcceleratorsPerNode
	}
	fmt.Fprintf(os.Stdout, "# %s cycle %.1f ms: %d running, %d GPUs allocated, reasons %v, problems %d\n",
		what, ms(el), len(d.Allocations), used, kinds, len(d.Problems))
}

// fleet builds the nodes and teams: nominal quotas cover the fleet, 10
// cohorts, weights 1-3, half the teams preempt lower priorities.
func fleet(nodes, teams int) policy.State {
	st := policy.State{Now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	for i := 0; i < nodes; i++ {
		st.Nodes = append(st.Nodes, policy.Node{Name: fmt.Sprintf("node-%05d", i), Flavor: flavor, Accelerators: 8, VCPUs: 192, Memory: 2 << 40})
	}
	nominal := nodes * 8 / teams
	for i := 0; i < teams; i++ {
		t := policy.Team{Name: fmt.Sprintf("team-%03d", i), Cohort: fmt.Sprintf("cohort-%d", i%10), Weight: float64(1 + i%3),
			Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: nominal}}}
		if i%2 == 0 {
			t.Preemption = policy.PreemptLowerPriority
		}
		st.Teams = append(st.Teams, t)
	}
	return st
}

// randomJob draws a Helios-shaped job: GPUs 1/2/4/8/16/32/64 (median 1,
// mean ~3.7); jobs above 8 GPUs take whole nodes and a third of them are
// elastic between half and twice their size.
func randomJob(rng *rand.Rand, name, team string, now time.Time) policy.Job {
	p := rng.IntN(100)
	j := policy.Job{Name: name, Team: team, Priority: &p, SubmitTime: now}
	gpus := helios(rng)
	if gpus <= 8 {
		j.PerNode.Accelerators = gpus
		return j
	}
	n := gpus / 8
	j.PerNode.Accelerators = 8
	j.MinNodes, j.MaxNodes = n, n
	if rng.IntN(3) == 0 {
		j.Elastic = true
		j.MinNodes, j.MaxNodes = max(1, n/2), n*2
	}
	return j
}

func helios(rng *rand.Rand) int {
	x := rng.Float64()
	for _, c := range []struct {
		p float64
		g int
	}{{0.60, 1}, {0.70, 2}, {0.82, 4}, {0.94, 8}, {0.98, 16}, {0.995, 32}} {
		if x < c.p {
			return c.g
		}
	}
	return 64
}

// Command fairshare runs a synthetic Helios-shaped trace on a 256-GPU fleet
// (32 nodes x 8 GPUs) shared by three teams, in virtual time, twice: FIFO
// with static sizes (each team strictly first-in first-out within its own
// quota, no lending: teams guard their reserved capacity) and our engine
// (lending, borrowing, elastic growth, reclaim, defragmentation). It prints
// the GPU utilisation of both (mean over seeds) and the engine's worst
// reclaim latency (each team's guaranteed quota back after its demand).
//
//	go run ./bench/fairshare [-load 1.2 -seeds 3 -jobs 6000 -v]
package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/sim"
)

const flavor = "nvidia-h100-80gb"

func main() {
	jobs := flag.Int("jobs", 6000, "jobs in the trace")
	seed := flag.Uint64("seed", 1, "first trace seed")
	seeds := flag.Int("seeds", 3, "number of seeds (seed, seed+1, ...); utilisation is their mean")
	load := flag.Float64("load", 1.2, "offered load (GPU demand / capacity)")
	elastic := flag.Float64("elastic", 0.5, "fraction of whole-node jobs that are elastic")
	factor := flag.Int("max-factor", 2, "elastic jobs may grow to this many times their static size")
	restart := flag.Float64("restart", 15, "checkpoint/restart delay of a resize or preemption (s)")
	verbose := flag.Bool("v", false, "print both reports")
	warmup := flag.Float64("warmup", 1.0/3, "fraction of the submission span excluded from the utilisation window as warm-up")
	doSweep := flag.Bool("sweep", false, "instead: engine vs kueue mean JCT over offered load x elastic fraction, and on -trace")
	sweepJobs := flag.Int("sweep-jobs", 6000, "jobs per sweep point")
	traceFile := flag.String("trace", "examples/traces/philly-4vc.csv", "public trace for the sweep's headline (\"\" to skip)")
	teamsFile := flag.String("teams", "examples/traces/philly-4vc-teams.yaml", "teams of -trace")
	svg := flag.String("svg", "", "write the sweep's chart (SVG) to this file")
	resize := flag.Float64("resize", 0.14, "sweep: resize delay (s), bench/elastic's in-process resize")
	ckpt := flag.Float64("checkpoint", 600, "sweep: checkpoint interval (s); a preempted job loses half of it")
	flag.Parse()

	if *doSweep {
		err := sweep(sweepOptions{jobs: *sweepJobs, seed: *seed, loads: []float64{0.6, 0.8, 1.0, 1.2, 1.4}, elastic: []float64{0, 0.25, 0.5, 0.75, 1},
			trace: *traceFile, teams: *teamsFile, svg: *svg, restart: 1.74, resize: *resize, ckpt: *ckpt})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	teams, fleet := benchTeams()
	type result struct{ fifo, eng *sim.Report }
	var results []result
	var trace []sim.TraceJob
	var ws, last float64
	for k := 0; k < *seeds; k++ {
		trace = sim.Generate(sim.GenOptions{
			Seed: *seed + uint64(k), Jobs: *jobs, Capacity: 256, Load: *load, ElasticFraction: *elastic, ElasticMaxFactor: *factor, Burst: 0.9,
			Teams: benchLoads(),
		})
		// Measure in steady state: the fleet starts empty and most GPU-time
		// is in long jobs, so the first part of the submission span is
		// warm-up.
		last = trace[len(trace)-1].Submit
		ws = last * *warmup
		run := func(mode sim.Mode) *sim.Report {
			start := time.Now()
			r, err := sim.Run(trace, sim.Options{Mode: mode, Teams: teams, Fleet: fleet, RestartDelay: *restart, WindowStart: ws, WindowEnd: last})
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			if *verbose {
				fmt.Printf("# seed %d, %s (%.1f s wall)\n%s\n", *seed+uint64(k), mode, time.Since(start).Seconds(), r.Table())
			}
			return r
		}
		results = append(results, result{run(sim.ModeFIFO), run(sim.ModeEngine)})
	}
	var fifoU, engU, reclaimMax float64
	for k, r := range results {
		fifoU += r.fifo.Utilization / float64(len(results))
		engU += r.eng.Utilization / float64(len(results))
		reclaimMax = math.Max(reclaimMax, r.eng.ReclaimMax)
		fmt.Printf("# seed %d: fifo util %.1f%% (wait p50 %.0f s, p95 %.0f s); engine util %.1f%% (allocated %.1f%%), wait p50 %.0f s p95 %.0f s, reclaim p95 %.0f s max %.0f s over %d samples; %d preemptions, %d shrinks, %d grows, %d moves\n",
			*seed+uint64(k), r.fifo.Utilization, r.fifo.WaitP50, r.fifo.WaitP95, r.eng.Utilization, r.eng.Allocated, r.eng.WaitP50, r.eng.WaitP95,
			r.eng.ReclaimP95, r.eng.ReclaimMax, r.eng.ReclaimSamples, r.eng.Preemptions, r.eng.Shrinks, r.eng.Grows, r.eng.Moves)
	}
	fmt.Printf("# trace: %d Helios-shaped jobs per seed (median 1 GPU, mean ~3.7; lognormal run time, median 200 s, sigma 2, capped at 3 days),\n", *jobs)
	fmt.Printf("#   offered load %.2f of 256 GPUs (32 nodes x 8); per-team demand cycles (4 h period, phase-shifted) so teams are busy at different times;\n", *load)
	fmt.Printf("#   %.0f%% of whole-node jobs elastic (half to %dx their size). Teams: research 128 (weight 2), product 64, infra 64, one cohort.\n", *elastic*100, *factor)
	fmt.Printf("# fifo = each team strictly first-in first-out at static sizes within its own quota (no lending, borrowing, resizing, preemption or moves).\n")
	fmt.Printf("# utilisation = productive GPU-seconds / (256 x window); window = from %.0f%% of the submission span (warm-up: the fleet starts empty) to the last submission;\n", *warmup*100)
	fmt.Printf("#   productive excludes the %.0f s checkpoint/restart delay charged to every resize, move, preemption and reclaim-start.\n", *restart)
	fmt.Printf("# reclaim latency = from a team's pending demand fitting its nominal quota to that job running (restart delay included); max over all seeds.\n")
	fmt.Printf("# figures: mean over %d seed(s) for utilisation.\n", len(results))
	fifo := &sim.Report{Utilization: fifoU}
	eng := &sim.Report{Utilization: engU, ReclaimMax: reclaimMax}
	fmt.Printf("BENCH fairshare_util_fifo %.1f %%\n", fifo.Utilization)
	fmt.Printf("BENCH fairshare_util_engine %.1f %% anchor=%.1f target=90\n", eng.Utilization, fifo.Utilization)
	fmt.Printf("BENCH fairshare_reclaim_max %.1f s target=60\n", eng.ReclaimMax)
}

// benchTeams is the bench's teams (one cohort) and fleet: 32 nodes x 8 GPUs.
func benchTeams() ([]policy.Team, []policy.Node) {
	teams := []policy.Team{
		{Name: "research", Weight: 2, Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 128}}},
		{Name: "product", Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 64}}},
		{Name: "infra", Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 64}}},
	}
	return teams, sim.BuildFleet([]sim.FleetSpec{{Flavor: flavor, Nodes: 32, AcceleratorsPerNode: 8}})
}

// benchLoads is the teams' demand: research half, phase-shifted cycles.
func benchLoads() []sim.TeamLoad {
	return []sim.TeamLoad{
		{Name: "research", Share: 0.5, Phase: 0},
		{Name: "product", Share: 0.25, Phase: 2 * math.Pi / 3},
		{Name: "infra", Share: 0.25, Phase: 4 * math.Pi / 3},
	}
}

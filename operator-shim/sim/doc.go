// Package sim runs the policy engine (operator-shim/policy) in virtual time
// over a job trace and reports what a fleet would have seen: per-team GPU
// utilisation, queue waits, reclaim latency, preemptions and resizes. It is
// what `elasticctl simulate --trace T --teams Y` runs, and it generates
// synthetic traces shaped like public GPU cluster traces.
//
//	trace, _ := sim.LoadTrace("trace.csv")
//	teams, _ := sim.LoadTeams("teams.yaml")
//	rep, _ := sim.Run(trace, sim.Options{Teams: teams.Teams, Fleet: sim.BuildFleet(teams.Fleet)})
//	fmt.Print(rep.Table())            // or json.Marshal(rep)
//
// # Trace files
//
// JSON lines (one TraceJob per line; blank lines and lines starting with #
// are skipped; unknown fields are errors):
//
//	{"name":"job-000001","team":"research","submit":12.5,"gpusPerNode":8,"nodes":2,"minNodes":1,"maxNodes":4,"elastic":true,"priority":50,"work":28800}
//
// CSV with a header naming the columns (any order; # starts a comment):
//
//	name,team,submit,flavor,gpus_per_node,nodes,min_nodes,max_nodes,step,elastic,priority,work
//	job-000001,research,12.5,,8,2,1,4,,true,50,28800
//
// Required: name, team, submit (seconds from the trace start), gpus_per_node
// and work (GPU-seconds). nodes is the static size (default min_nodes, else
// 1); elastic jobs run between min_nodes and max_nodes. A job holding g
// accelerators makes g GPU-seconds of progress per second (linear scaling),
// so an elastic job finishes sooner when it is bigger. Jobs with
// gpus_per_node below a node's accelerators and one node share nodes;
// larger jobs take whole nodes. Errors name the file, the line and the
// column.
//
// # Teams file
//
// YAML, the team specs `elasticctl apply` takes plus an optional fleet and
// engine config (see TeamsFile); errors name the file, the line and the
// field. Without a fleet, the fleet is 8-accelerator nodes covering the sum
// of the nominal quotas per flavor (DefaultFleet).
//
// # The simulation
//
// Events are arrivals and completions; the engine runs at each, and every
// Options.Tick (10 s) while jobs were just requeued or an elastic job could
// grow into idle capacity once its stable period ends (the engine is a pure
// function, so nothing else can change a decision). Every planned change
// costs Options.RestartDelay (15 s) of no progress: a resized, repaired or
// moved job, a preempted job when it resumes (it checkpointed, so no work is
// lost), and a job admitted on capacity taken from others (the victims
// checkpoint first).
//
// # Metrics
//
//   - Utilization: productive accelerator-seconds / (capacity x window);
//     Allocated counts restart delays too. The window is Options.WindowStart
//     to WindowEnd (default: first to last submission).
//   - Queue wait: submission to first admission (p50, p95).
//   - Reclaim latency: for a pending job whose demand fits its team's nominal
//     quota (counting the team's running jobs and its pending jobs ahead of
//     it in admission order), the time from that moment to the job running
//     productively (restart delay included). ReclaimMax is the worst case:
//     "each team's guaranteed quota back within N seconds of its demand".
//   - Preemptions, shrinks, grows and moves: engine decisions.
//   - JCT (mean, p50, p95, p99): submission to completion; mean queueing
//     delay: submission to first admission.
//   - BusyUtilization/BusyAllocated: over capacity x makespan.
//   - Fairness: Jain's index over the teams of the part of its nominal
//     quota each team held while it had jobs waiting (QuotaWhileWaiting).
//   - GPUHoursLost: accelerators held while restarting (RestartDelay,
//     ResizeDelay for a resize) plus progress lost by preempted jobs (half
//     of CheckpointInterval on average).
//   - Rejected: jobs a policy can never run (larger than the fleet in every
//     mode; for fifo, larger than the team's quota), not left in the queue.
//
// # Policies
//
// Options.Mode picks the policy: engine (hyperpodrun), fifo, kueue or
// batch-fairshare (policy.FIFO, policy.Kueue, policy.BatchFairShare: the
// baselines, static sizes, same placement). Compare runs several, and
// "oracle" is Bound: per figure, what no schedule can beat (a fluid
// relaxation ignoring placement, quotas and restart costs).
//
// # Synthetic traces
//
// Generate draws Helios-shaped traces (Hu et al., "Characterization and
// prediction of deep learning workloads in large-scale GPU datacenters",
// SC'21): GPUs per job from a power-of-two mix with median 1 and mean ~3.7,
// lognormal run times with median 200 s and sigma 2 (a heavy tail, capped
// at 3 days), Poisson arrivals at a chosen offered load, optionally with
// phase-shifted per-team demand cycles, and a chosen fraction of whole-node
// jobs elastic. The same options and seed always give the same trace.
package sim

// Package policy is the coordinator's policy engine: a pure function from the
// fleet (nodes), the teams and their quotas, the jobs, the current
// allocations and the time to new allocations plus a reason for every job.
//
//	d := policy.Schedule(policy.State{Now: now, Nodes: nodes, Teams: teams, Jobs: jobs, Allocations: allocs})
//
// Schedule does no I/O and never reads the clock; the same State always gives
// the same Decision (every map is iterated in sorted order). Bad input never
// panics: invalid nodes, teams and jobs are reported in Decision.Problems (and
// invalid jobs get a Reason of kind Invalid) and the rest is scheduled.
//
// # Model
//
// Capacity is counted in accelerators (GPUs or Neuron devices) per flavor
// (e.g. "nvidia-h100-80gb"). Every flavor is scheduled independently.
//
// A team has, per flavor, a nominal quota (guaranteed), a lending limit (how
// much of the nominal quota other teams may borrow while it is idle; default
// all of it), a borrowing limit (how far above nominal the team may go by
// borrowing; default unlimited), a fair-share weight and a preemption policy.
// Teams with the same cohort lend to each other; teams without a cohort form
// the default cohort. Capacity of a flavor that no team's nominal quota covers
// is a fleet-wide pool any cohort may borrow.
//
// A job asks for nodes of one flavor with perNode resources, between minNodes
// and maxNodes in steps (or a list of discrete sizes). A job with maxNodes > 1
// takes whole nodes (exclusively); a single-node job may ask for a fraction of
// a node's accelerators and is bin-packed (best fit) with others.
//
// # Rules, in the order one cycle applies them (per flavor)
//
//  1. Carry over: current allocations are kept. Allocations on nodes that are
//     gone, unhealthy or no longer fit are repaired with free nodes where
//     possible, else shrunk (elastic, still at least minNodes) or requeued.
//     Spec changes (maxNodes lowered) shrink; a raised minNodes requeues.
//  2. Admit within nominal quota: pending jobs in priority order (then submit
//     time) are admitted at minNodes when the team's usage stays within its
//     nominal quota, the cohort's lendable pool allows it and nodes are free.
//  3. Reclaim: a pending job that fits within its team's nominal quota but finds
//     the capacity lent out takes it back from teams above their nominal
//     quota: first by shrinking their elastic jobs toward minNodes (lowest
//     priority first), then by preempting whole jobs (lowest priority, newest
//     first; for a whole-node job, first only victims whose preemption frees
//     a whole node). A team stops being a victim once it is back at its
//     nominal quota. Only the victims needed are kept (a
//     minimisation pass).
//     3b. Defragment: when the quota allows the job but the free accelerators
//     are scattered over nodes, borrowers give back only what the quota and
//     the total needs, and single-node jobs are moved to other nodes
//     (keeping their size) to clear the nodes that need the fewest moves. A
//     job is moved at most once per MinStablePeriod. All or nothing.
//  4. Reserve: within-nominal demand that still cannot be placed reserves its
//     capacity so that no other team borrows it in this cycle.
//  5. Admit by borrowing: remaining pending jobs, teams in weighted fair-share
//     order (lowest (used - nominal) / weight first), within the team's
//     borrowing limit, the lenders' lending limits and free nodes.
//  6. Priority preemption within a team: a team whose preemption policy is
//     LowerPriority and whose nominal quota is full admits a higher-priority
//     job by shrinking, then preempting, its own lower-priority jobs.
//  7. Grow: elastic jobs not resized within MinStablePeriod grow one step at a
//     time toward maxNodes into idle capacity, always giving the next step to
//     the team with the lowest weighted share.
//
// # No thrash
//
// A job is never grown within MinStablePeriod of its last resize, and growth
// is the only voluntary resize; a job is moved (rule 3b) at most once per
// MinStablePeriod. Reclaiming guaranteed (nominal) quota and priority
// preemption deliberately override the stable period: a team's guarantee
// must come back within seconds, not after the borrower's stable period.
// No pair of jobs preempts each other back and forth: every allocation
// carries TookFrom, the jobs it took capacity from, and those jobs are never
// its victims while it holds the allocation. Beyond that, a reclaim only
// takes from teams above their nominal quota and leaves the reclaiming team
// at or below its own; within-nominal demand that is still waiting reserves
// its capacity so it is not lent out again; and priority preemption only
// takes from strictly lower priorities.
package policy

import (
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
)

// The engine decides on the types of package api; these aliases let the
// engine and its tests name them briefly (policy.Job is api.Job).
type (
	PreemptionPolicy = api.PreemptionPolicy
	QueueingStrategy = api.QueueingStrategy
	Node             = api.Node
	Team             = api.Team
	FlavorQuota      = api.FlavorQuota
	Resources        = api.Resources
	Job              = api.Job
	Allocation       = api.Allocation
	Config           = api.Config
	ReasonKind       = api.ReasonKind
	ReasonCode       = api.ReasonCode
	Holder           = api.Holder
	Reason           = api.Reason
	TeamUsage        = api.TeamUsage
	ByteSize         = api.ByteSize
)

// State is everything one engine cycle decides on.
type State struct {
	// Now is the decision time (the engine never reads the clock).
	Now time.Time `json:"now"`
	// Config tunes the engine.
	Config Config `json:"config"`
	// Nodes is the fleet.
	Nodes []Node `json:"nodes"`
	// Teams are the tenants and their quotas.
	Teams []Team `json:"teams"`
	// Jobs are all jobs that exist (running, pending or suspended).
	Jobs []Job `json:"jobs"`
	// Allocations are the current allocations (the previous Decision's).
	Allocations []Allocation `json:"allocations"`
}

// Problem is an input that was ignored because it is invalid.
type Problem struct {
	// Object is "node", "team", "job" or "allocation".
	Object string `json:"object" yaml:"object"`
	Name   string `json:"name" yaml:"name"`
	Error  string `json:"error" yaml:"error"`
}

// Decision is the engine's output.
type Decision struct {
	Now time.Time `json:"now"`
	// Allocations holds one entry per running job, sorted by job name.
	Allocations []Allocation `json:"allocations"`
	// Reasons holds one entry per job of State.Jobs, sorted by job name.
	Reasons []Reason `json:"reasons"`
	// Teams is every team's usage per flavor, sorted by team then flavor.
	Teams []TeamUsage `json:"teams"`
	// Released names jobs that had an allocation but no longer exist.
	Released []string `json:"released,omitempty"`
	// Problems lists ignored invalid inputs.
	Problems []Problem `json:"problems,omitempty"`
}

// Allocation returns the job's new allocation, if it runs.
func (d Decision) Allocation(job string) (Allocation, bool) {
	i, ok := searchSorted(len(d.Allocations), func(i int) string { return d.Allocations[i].Job }, job)
	if !ok {
		return Allocation{}, false
	}
	return d.Allocations[i], true
}

// Reason returns the reason for the job.
func (d Decision) Reason(job string) (Reason, bool) {
	i, ok := searchSorted(len(d.Reasons), func(i int) string { return d.Reasons[i].Job }, job)
	if !ok {
		return Reason{}, false
	}
	return d.Reasons[i], true
}

func searchSorted(n int, key func(int) string, want string) (int, bool) {
	lo, hi := 0, n
	for lo < hi {
		m := (lo + hi) / 2
		if key(m) < want {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < n && key(lo) == want
}

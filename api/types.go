// Package api holds the types the coordinator, the node agents, elasticctl
// and the policy engine exchange: node inventories (the record a node agent
// writes, and the flavor names of its accelerators), nodes as the engine
// sees them, teams and their quotas, job specs, allocations, the reasons for
// decisions and team usage, with their validation. It has no dependencies of ours, so every
// part can import it without pulling in the engine (operator-shim/policy)
// or the etcd layout (internal/fleet).
package api

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// PreemptionPolicy says whether a team's pending jobs may preempt the team's
// own lower-priority jobs once its nominal quota is full. Reclaiming lent
// quota from borrowers does not depend on it: a nominal quota is a guarantee.
type PreemptionPolicy string

const (
	// PreemptNever never preempts the team's own jobs for priority (default).
	PreemptNever PreemptionPolicy = "Never"
	// PreemptLowerPriority lets a job shrink, then preempt, the team's own jobs
	// of strictly lower priority.
	PreemptLowerPriority PreemptionPolicy = "LowerPriority"
)

// QueueingStrategy orders admission within a team.
type QueueingStrategy string

const (
	// BestEffortFIFO admits later jobs when an earlier one does not fit (default).
	BestEffortFIFO QueueingStrategy = "BestEffortFIFO"
	// StrictFIFO admits a team's jobs strictly in order: a job that does not
	// fit blocks the team's later jobs.
	StrictFIFO QueueingStrategy = "StrictFIFO"
)

// DefaultMinStablePeriod is the default minimum time between two resizes of a job.
const DefaultMinStablePeriod = 60 * time.Second

// DefaultPriority is the priority of a job that names neither a priority nor a class.
const DefaultPriority = 50

// DefaultPriorityClasses maps the named priority classes to numbers (0-99).
var DefaultPriorityClasses = map[string]int{
	"lowest":   0,
	"low":      20,
	"normal":   50,
	"high":     80,
	"critical": 99,
}

// Node is one machine of the fleet as the engine sees it (built from the
// agent's inventory).
type Node struct {
	// Name is the node's unique name.
	Name string `json:"name" yaml:"name"`
	// Flavor is the node's accelerator flavor, e.g. "nvidia-h100-80gb", "trainium2".
	Flavor string `json:"flavor" yaml:"flavor"`
	// Accelerators is the number of accelerators on the node.
	Accelerators int `json:"accelerators" yaml:"accelerators"`
	// UnhealthyAccelerators is how many of them are unhealthy; only healthy
	// ones are allocated.
	UnhealthyAccelerators int `json:"unhealthyAccelerators,omitempty" yaml:"unhealthyAccelerators,omitempty"`
	// VCPUs is the node's vCPU count (0: not tracked).
	VCPUs int `json:"vcpus,omitempty" yaml:"vcpus,omitempty"`
	// Memory is the node's memory (0: not tracked).
	Memory ByteSize `json:"memory,omitempty" yaml:"memory,omitempty"`
	// Unschedulable (cordoned): no new work; existing work stays.
	Unschedulable bool `json:"unschedulable,omitempty" yaml:"unschedulable,omitempty"`
	// Draining: no new work; existing work stays until it ends or shrinks
	// (shrinks release draining nodes first).
	Draining bool `json:"draining,omitempty" yaml:"draining,omitempty"`
	// Unhealthy: the node cannot run work; allocations on it are lost and
	// repaired elsewhere.
	Unhealthy bool `json:"unhealthy,omitempty" yaml:"unhealthy,omitempty"`
}

// HealthyAccelerators is the number of accelerators the engine may allocate.
func (n Node) HealthyAccelerators() int {
	if n.Unhealthy {
		return 0
	}
	return max(0, n.Accelerators-n.UnhealthyAccelerators)
}

// Team is a tenant with quotas. It is what `elasticctl apply -f teams.yaml`
// stores under /hyperpodrun/teams/<team>.
type Team struct {
	// Name is the team's unique name.
	Name string `json:"name" yaml:"name"`
	// Cohort groups teams that lend to each other; "" is the default cohort.
	Cohort string `json:"cohort,omitempty" yaml:"cohort,omitempty"`
	// Weight is the fair-share weight (> 0; default 1).
	Weight float64 `json:"weight,omitempty" yaml:"weight,omitempty"`
	// Preemption is Never (default) or LowerPriority.
	Preemption PreemptionPolicy `json:"preemption,omitempty" yaml:"preemption,omitempty"`
	// Quotas lists the flavors the team may use. A flavor not listed cannot be used.
	Quotas []FlavorQuota `json:"quotas" yaml:"quotas"`
}

// FlavorQuota is a team's quota on one flavor.
type FlavorQuota struct {
	// Flavor names the accelerator flavor.
	Flavor string `json:"flavor" yaml:"flavor"`
	// Nominal is the guaranteed number of accelerators.
	Nominal int `json:"nominal" yaml:"nominal"`
	// BorrowingLimit caps how many accelerators above Nominal the team may
	// borrow (nil: unlimited; 0: never borrows).
	BorrowingLimit *int `json:"borrowingLimit,omitempty" yaml:"borrowingLimit,omitempty"`
	// LendingLimit caps how many of the Nominal accelerators other teams may
	// borrow while idle (nil: all of them; 0: never lends).
	LendingLimit *int `json:"lendingLimit,omitempty" yaml:"lendingLimit,omitempty"`
	// VCPUs, if set, is a hard cap on the vCPUs the team's jobs of this flavor request.
	VCPUs int `json:"vcpus,omitempty" yaml:"vcpus,omitempty"`
	// Memory, if set, is a hard cap on the memory the team's jobs of this flavor request.
	Memory ByteSize `json:"memory,omitempty" yaml:"memory,omitempty"`
}

// Resources are what a job needs on each of its nodes.
type Resources struct {
	// Accelerators per node (>= 1).
	Accelerators int `json:"accelerators" yaml:"accelerators"`
	// VCPUs per node (0: none requested).
	VCPUs int `json:"vcpus,omitempty" yaml:"vcpus,omitempty"`
	// Memory per node (0: none requested).
	Memory ByteSize `json:"memory,omitempty" yaml:"memory,omitempty"`
}

// Job is a job spec as submitted (`elasticctl submit`), stored under
// /hyperpodrun/specs/<job>.
type Job struct {
	// Name is the job id (the rendezvous id).
	Name string `json:"name" yaml:"name"`
	// Team owns the job and is charged for it.
	Team string `json:"team" yaml:"team"`
	// Priority is 0 (lowest) to 99 (highest). Nil: PriorityClass, else DefaultPriority.
	Priority *int `json:"priority,omitempty" yaml:"priority,omitempty"`
	// PriorityClass names a class of Config.PriorityClasses (low, normal, high, ...).
	PriorityClass string `json:"priorityClass,omitempty" yaml:"priorityClass,omitempty"`
	// Flavor is the accelerator flavor; "" means the team's only flavor.
	Flavor string `json:"flavor,omitempty" yaml:"flavor,omitempty"`
	// PerNode is what the job needs on each node.
	PerNode Resources `json:"perNode" yaml:"perNode"`
	// MinNodes is the smallest size (default 1, or Sizes[0]).
	MinNodes int `json:"minNodes,omitempty" yaml:"minNodes,omitempty"`
	// MaxNodes is the largest size (default MinNodes, or the last of Sizes).
	MaxNodes int `json:"maxNodes,omitempty" yaml:"maxNodes,omitempty"`
	// Step: allowed sizes are MinNodes, MinNodes+Step, ... <= MaxNodes (default 1).
	Step int `json:"step,omitempty" yaml:"step,omitempty"`
	// Sizes, if set, lists the allowed sizes (ascending) instead of Step.
	Sizes []int `json:"sizes,omitempty" yaml:"sizes,omitempty"`
	// Elastic jobs are resized between MinNodes and MaxNodes; other jobs run
	// at exactly MinNodes (MaxNodes must equal it).
	Elastic bool `json:"elastic,omitempty" yaml:"elastic,omitempty"`
	// Suspended jobs hold no allocation.
	Suspended bool `json:"suspended,omitempty" yaml:"suspended,omitempty"`
	// SubmitTime orders jobs of equal priority (FIFO).
	SubmitTime time.Time `json:"submitTime" yaml:"submitTime"`
	// RequestedBy says who wrote this version of the spec, as the writer
	// reports it: "etcd user NAME" or "user NAME" from elasticctl,
	// "ElasticJob NS/NAME (generation N)" from the Kubernetes controller.
	// Decisions the spec's change caused (a user's resize) name it.
	RequestedBy string `json:"requestedBy,omitempty" yaml:"requestedBy,omitempty"`
}

// Allocation is a job's current size and placement, held in the job's
// desired record (internal/fleet Desired, desired/<job>).
type Allocation struct {
	// Job names the job.
	Job string `json:"job" yaml:"job"`
	// Team is the job's team (informational).
	Team string `json:"team,omitempty" yaml:"team,omitempty"`
	// Flavor is the flavor of the nodes.
	Flavor string `json:"flavor,omitempty" yaml:"flavor,omitempty"`
	// Size is the number of nodes; len(Nodes) == Size.
	Size int `json:"size" yaml:"size"`
	// Nodes are the node names; nodes kept across resizes keep their order
	// (so ranks stay stable), new nodes are appended.
	Nodes []string `json:"nodes" yaml:"nodes"`
	// AcceleratorsPerNode is what the job holds on each node.
	AcceleratorsPerNode int `json:"acceleratorsPerNode,omitempty" yaml:"acceleratorsPerNode,omitempty"`
	// Since is when the job was admitted.
	Since time.Time `json:"since" yaml:"since"`
	// LastResize is when the size or placement last changed (Since at admission).
	LastResize time.Time `json:"lastResize" yaml:"lastResize"`
	// TookFrom names the jobs this job took capacity from (reclaim or
	// priority preemption) while holding this allocation. They never take
	// capacity back from it: no pair of jobs preempts each other back and
	// forth. Feed it back unchanged with the allocation.
	TookFrom []string `json:"tookFrom,omitempty" yaml:"tookFrom,omitempty"`
}

// Config tunes the engine. The zero value means the defaults.
type Config struct {
	// MinStablePeriod is the minimum time between two resizes of a job by
	// growth (0: DefaultMinStablePeriod; negative: none). Reclaim and priority
	// preemption override it (see the package documentation).
	MinStablePeriod time.Duration `json:"minStablePeriod,omitempty" yaml:"minStablePeriod,omitempty"`
	// Queueing is BestEffortFIFO (default) or StrictFIFO.
	Queueing QueueingStrategy `json:"queueing,omitempty" yaml:"queueing,omitempty"`
	// PriorityClasses maps class names to priorities (nil: DefaultPriorityClasses).
	PriorityClasses map[string]int `json:"priorityClasses,omitempty" yaml:"priorityClasses,omitempty"`
	// MaxHolders bounds the holders listed in a reason (0: 5).
	MaxHolders int `json:"maxHolders,omitempty" yaml:"maxHolders,omitempty"`
	// DisableGrowth turns off elastic growth (jobs stay at their admitted
	// size): used for static-size baselines.
	DisableGrowth bool `json:"disableGrowth,omitempty" yaml:"disableGrowth,omitempty"`
	// DisableMoves turns off defragmentation (moving single-node jobs to
	// another node to make room for guaranteed demand).
	DisableMoves bool `json:"disableMoves,omitempty" yaml:"disableMoves,omitempty"`
}

// StablePeriod is the effective MinStablePeriod (defaults applied; 0 means none).
func (c Config) StablePeriod() time.Duration {
	switch {
	case c.MinStablePeriod == 0:
		return DefaultMinStablePeriod
	case c.MinStablePeriod < 0:
		return 0
	}
	return c.MinStablePeriod
}

// Classes is the effective priority classes (DefaultPriorityClasses when unset).
func (c Config) Classes() map[string]int {
	if c.PriorityClasses == nil {
		return DefaultPriorityClasses
	}
	return c.PriorityClasses
}

// HolderLimit is the effective MaxHolders (5 when unset).
func (c Config) HolderLimit() int {
	if c.MaxHolders <= 0 {
		return 5
	}
	return c.MaxHolders
}

// ReasonKind is what happened to a job in this cycle.
type ReasonKind string

// Reason kinds.
const (
	KindAdmitted  ReasonKind = "Admitted"  // started in this cycle
	KindRunning   ReasonKind = "Running"   // unchanged
	KindGrown     ReasonKind = "Grown"     // got more nodes
	KindShrunk    ReasonKind = "Shrunk"    // gave nodes back
	KindRepaired  ReasonKind = "Repaired"  // same size, a lost node replaced
	KindMoved     ReasonKind = "Moved"     // same size, moved to another node (defragmentation)
	KindPreempted ReasonKind = "Preempted" // lost its whole allocation, requeued
	KindPending   ReasonKind = "Pending"   // waiting
	KindSuspended ReasonKind = "Suspended" // suspended by the user
	KindInvalid   ReasonKind = "Invalid"   // the spec is invalid (see Message)
)

// ReasonCode is the machine-readable cause behind a ReasonKind.
type ReasonCode string

// Reason codes.
const (
	CodeWithinQuota        ReasonCode = "WithinQuota"        // admitted/grown within the team's nominal quota
	CodeBorrowing          ReasonCode = "Borrowing"          // admitted/grown on borrowed capacity
	CodeReclaim            ReasonCode = "Reclaim"            // capacity taken back for a team's nominal quota
	CodePriorityPreemption ReasonCode = "PriorityPreemption" // taken by a higher-priority job of the same team
	CodeFairShare          ReasonCode = "FairShare"          // grown into idle capacity by fair share
	CodeStablePeriod       ReasonCode = "StablePeriod"       // not resized: resized too recently
	CodeAtMax              ReasonCode = "AtMax"              // at maxNodes
	CodeNoFlavor           ReasonCode = "NoFlavor"           // the team has no quota for the flavor
	CodeQuotaExceeded      ReasonCode = "QuotaExceeded"      // can never fit the team's quota (or over a vCPU/memory cap)
	CodeBorrowingLimit     ReasonCode = "BorrowingLimit"     // the team is at nominal + borrowing limit
	CodeCohortExhausted    ReasonCode = "CohortExhausted"    // nothing left to borrow in the cohort
	CodeNoCapacity         ReasonCode = "NoCapacity"         // quota allows it but no nodes are free
	CodeReserved           ReasonCode = "Reserved"           // idle capacity is reserved for another team's guaranteed demand
	CodeStrictFIFO         ReasonCode = "StrictFIFO"         // waiting behind an earlier job of the team
	CodeNodeLost           ReasonCode = "NodeLost"           // a node of the allocation is gone or unhealthy
	CodeDefragment         ReasonCode = "Defragment"         // moved to make room for a team's guaranteed quota
	CodeSpecChanged        ReasonCode = "SpecChanged"        // the user changed the spec (a resize): the allocation no longer matches it
	CodeTeamNotFound       ReasonCode = "TeamNotFound"       // the job's team does not exist
	CodeInvalidSpec        ReasonCode = "InvalidSpec"        // the job spec is invalid
	CodeSuspended          ReasonCode = "Suspended"          // suspended by the user
)

// Holder is a job holding capacity that another job is waiting for.
type Holder struct {
	Job          string `json:"job" yaml:"job"`
	Team         string `json:"team" yaml:"team"`
	Accelerators int    `json:"accelerators" yaml:"accelerators"`
	// Borrowing is true when the holder's team is above its nominal quota.
	Borrowing bool `json:"borrowing,omitempty" yaml:"borrowing,omitempty"`
}

// Reason explains the decision for one job.
type Reason struct {
	Job  string     `json:"job" yaml:"job"`
	Team string     `json:"team,omitempty" yaml:"team,omitempty"`
	Kind ReasonKind `json:"kind" yaml:"kind"`
	Code ReasonCode `json:"code,omitempty" yaml:"code,omitempty"`
	// Message is a one-line human explanation.
	Message string `json:"message" yaml:"message"`
	// FromSize and ToSize are the node counts before and after this cycle.
	FromSize int `json:"fromSize" yaml:"fromSize"`
	ToSize   int `json:"toSize" yaml:"toSize"`
	// For lists the jobs that got this job's capacity (Shrunk/Preempted).
	For []string `json:"for,omitempty" yaml:"for,omitempty"`
	// ForTeam is the team of For.
	ForTeam string `json:"forTeam,omitempty" yaml:"forTeam,omitempty"`
	// RequestedBy is who asked for the change when a user did (a spec
	// change: code SpecChanged), from the spec's RequestedBy.
	RequestedBy string `json:"requestedBy,omitempty" yaml:"requestedBy,omitempty"`
	// Holders lists who holds the capacity a Pending job waits for (largest first).
	Holders []Holder `json:"holders,omitempty" yaml:"holders,omitempty"`
}

// TeamUsage is a team's standing on one flavor after the decision.
type TeamUsage struct {
	Team    string `json:"team" yaml:"team"`
	Cohort  string `json:"cohort,omitempty" yaml:"cohort,omitempty"`
	Flavor  string `json:"flavor" yaml:"flavor"`
	Nominal int    `json:"nominal" yaml:"nominal"`
	// Used is the accelerators held by the team's jobs.
	Used int `json:"used" yaml:"used"`
	// Borrowed is Used above Nominal.
	Borrowed int `json:"borrowed" yaml:"borrowed"`
	// Running and Pending count the team's jobs.
	Running int `json:"running" yaml:"running"`
	Pending int `json:"pending" yaml:"pending"`
	// PendingAccelerators is the pending jobs' demand at their minimum size.
	PendingAccelerators int `json:"pendingAccelerators" yaml:"pendingAccelerators"`
}

// ByteSize is an amount of memory in bytes. In JSON and YAML it is a number
// of bytes or a string with a binary or decimal suffix: "64Gi", "512Mi",
// "1.5Ti", "80G", "1024".
type ByteSize int64

var byteSuffixes = []struct {
	s string
	m float64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15},
}

// ParseByteSize parses "64Gi", "80G", "1024" and the like.
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	t = strings.TrimSuffix(t, "B")
	mult := 1.0
	for _, suf := range byteSuffixes {
		if strings.HasSuffix(t, suf.s) {
			mult = suf.m
			t = strings.TrimSuffix(t, suf.s)
			break
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || v < 0 || v*mult > 9e18 {
		return 0, fmt.Errorf("invalid memory size %q: want bytes or a number with a suffix such as 512Mi, 64Gi, 80G", s)
	}
	return ByteSize(v * mult), nil
}

// String renders the size with the largest exact binary suffix.
func (b ByteSize) String() string {
	for _, suf := range []struct {
		s string
		m int64
	}{{"Pi", 1 << 50}, {"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if b != 0 && int64(b)%suf.m == 0 {
			return strconv.FormatInt(int64(b)/suf.m, 10) + suf.s
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

// MarshalText renders the size as String does.
func (b ByteSize) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText parses a size as ParseByteSize does.
func (b *ByteSize) UnmarshalText(p []byte) error {
	v, err := ParseByteSize(string(p))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// UnmarshalJSON accepts a number of bytes or a string with a suffix.
func (b *ByteSize) UnmarshalJSON(p []byte) error {
	s := strings.TrimSpace(string(p))
	if s == "null" {
		return nil
	}
	if strings.HasPrefix(s, `"`) {
		var str string
		if err := json.Unmarshal(p, &str); err != nil {
			return err
		}
		return b.UnmarshalText([]byte(str))
	}
	return b.UnmarshalText([]byte(s))
}

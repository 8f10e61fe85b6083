package policy

import (
	"math"
	"time"
)

// unlimited stands for a missing borrowing limit.
const unlimited = math.MaxInt32

// flavorRT is one accelerator flavor: its nodes (by shape), capacity and
// the cohorts, teams and jobs that use it. Flavors are scheduled
// independently.
type flavorRT struct {
	name      string
	shapes    []*shape // ascending cap
	maxCap    int
	freeAccel int // free accelerators on nodes that take new work
	wholeFree int // fully free nodes that take new work
	capacity  int // accelerators on nodes that take new work
	nominal   int // sum of nominal quotas
	slack     int // capacity no nominal quota covers
	overUsed  int // sum over cohorts of pool use beyond the cohort's pool
	// reservedPhys is unplaceable within-nominal demand others may not borrow.
	reservedPhys int
	cohorts      map[string]*cohortRT
	teams        []*teamFlavor // by team name
	jobs         []*jobRT      // by job name
	pending      []*jobRT      // admission order
	// reclaim fail-fast memo: (team, exclusive, per) -> smallest failed minNodes.
	failMemo map[memoKey]int
	// borrower victim lists for the current phase: elastic jobs to shrink,
	// jobs to preempt.
	bShrink, bPreempt []*jobRT
	bsPos, bpPos      int
}

// memoKey keys the reclaim fail-fast memo.
type memoKey struct {
	tf        *teamFlavor
	exclusive bool
	per       int
}

// cohortRT is a cohort's lendable pool on one flavor.
type cohortRT struct {
	name     string
	pool     int // sum of lendable quota
	poolUsed int // sum of teams' use beyond their guaranteed part
}

// over is how far pool use pu exceeds the pool.
func (c *cohortRT) over(pu int) int { return max(0, pu-c.pool) }

// teamRT is a validated team.
type teamRT struct {
	spec    *Team
	name    string
	weight  float64
	policy  PreemptionPolicy
	cohort  string
	valid   bool
	flavors map[string]*teamFlavor
}

// teamFlavor is a team's quota on one flavor and its use in this cycle.
type teamFlavor struct {
	team        *teamRT
	fl          *flavorRT
	co          *cohortRT
	nominal     int
	borrowLimit int
	guaranteed  int
	used        int
	reserved    int
	vcpuCap     int
	vcpuUsed    int
	memCap      int64
	memUsed     int64
	jobs        []*jobRT // the team's jobs of this flavor, by name
	queue       []*jobRT // pending, admission order
	head        int      // StrictFIFO: first queue entry not admitted
	running     int
	// own victim lists (LowerPriority), built on first use in a phase.
	ownShrink, ownPreempt []*jobRT
	ownBuilt              bool
}

// pu is the part of use u that draws on the cohort's pool (beyond the
// guaranteed, unlendable part of the nominal quota).
func (tf *teamFlavor) pu(u int) int { return max(0, u-tf.guaranteed) }

// jobRT is a job's spec, its allocation as the cycle changes it, and what
// the cycle decided for it (out).
type jobRT struct {
	spec      *Job
	name      string
	sp        spec
	team      *teamRT
	tf        *teamFlavor
	fl        *flavorRT
	flavor    string
	per       int
	vcpu      int
	mem       int64
	exclusive bool
	valid     bool

	prevSize  int
	prevNodes []string
	// tookFrom: jobs this job took capacity from during its allocation.
	tookFrom   []string
	size       int
	nodes      []*nodeRT
	since      time.Time
	lastResize time.Time
	repairNeed int
	// rank is the job's index in sched.jobs (name order).
	rank int
	// allocSeen: an allocation of this job was carried over (a second
	// one is a problem).
	allocSeen bool

	// out is what this cycle decided for the job (outcome.go).
	out outcome

	// engine state of this cycle
	stuck       bool // fits within nominal quota but could not be placed
	reservedAcc int  // accelerators reserved for it (rule 4)
}

// sched is one engine cycle: the indexed input, the runtime records, and
// the problems and released jobs to report.
type sched struct {
	now          time.Time
	cfg          Config
	stable       time.Duration
	strict       bool
	nodes        []nodeRT
	nodeByName   map[string]*nodeRT
	teams        []teamRT
	teamByName   map[string]*teamRT
	jobs         []jobRT
	jobByName    map[string]*jobRT
	flavors      []*flavorRT
	flavorByNm   map[string]*flavorRT
	problems     []Problem
	released     []string
	scratch      []*nodeRT
	usageTexts   map[*teamFlavor]usageText // pending reasons' usage phrase
	holderTexts  map[holderList]string     // pending reasons' holder lists
	runningTexts map[runningKey]string     // running reasons' messages
	// CohortExhausted messages by team, flavor, need and usage phrase.
	exhaustedTexts map[exhaustedKey]string
	// defragged: rule 3b moved jobs in this cycle (Engine.Admit leaves
	// that to the full cycle).
	defragged bool
	// victimKeys is sortVictims' scratch space.
	victimKeys []victimKey
}

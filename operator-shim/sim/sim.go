package sim

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// Mode picks the scheduler a simulation runs.
type Mode string

const (
	// ModeEngine runs the policy engine as configured (default).
	ModeEngine Mode = "engine"
	// ModeFIFO is the static baseline: every job at its static size
	// (TraceJob.Nodes), strictly first-in first-out per team, only within the
	// team's own nominal quota (no lending, no borrowing, no resizing, no
	// preemption, no moves); a job larger than its team's quota is rejected
	// instead of blocking the queue (policy.FIFO). Placement is the engine's.
	ModeFIFO Mode = "fifo"
	// ModeKueue is Kueue's ClusterQueues (policy.Kueue): one per team, one
	// cohort per Team.Cohort, the teams' borrowing and lending limits, the
	// config's queueing strategy, reclaimWithinCohort Any and
	// withinClusterQueue LowerPriority for teams whose preemption is
	// LowerPriority; static sizes.
	ModeKueue Mode = "kueue"
	// ModeBatch is AWS Batch fair-share scheduling (policy.BatchFairShare):
	// a share identifier per team with weightFactor 1/weight,
	// Options.ShareDecay, no preemption; static sizes.
	ModeBatch Mode = "batch-fairshare"
	// ModeOracle is not a schedule but its bound (Bound): what no policy can
	// beat on the trace and fleet, ignoring placement and restart costs.
	ModeOracle Mode = "oracle"
)

// Modes are the policies Run knows, in the order a comparison shows them.
var Modes = []Mode{ModeFIFO, ModeKueue, ModeBatch, ModeEngine, ModeOracle}

// Describe says in one line which policy a mode is.
func Describe(m Mode) string {
	switch m {
	case ModeFIFO:
		return "FIFO per team within its own quota, static sizes, no borrowing or preemption; jobs over the team's quota rejected"
	case ModeKueue:
		return "Kueue ClusterQueues: cohort borrowing within borrowing/lending limits, reclaimWithinCohort Any, static sizes"
	case ModeBatch:
		return "AWS Batch fair share: share per team (weightFactor 1/weight), share decay, no preemption, static sizes"
	case ModeEngine:
		return "hyperpodrun engine: lending, reclaim, elastic growth and shrink, defragmentation"
	case ModeOracle:
		return "upper bound: fluid schedule ignoring placement and restart costs (not achievable)"
	}
	return ""
}

// Options configure a simulation.
type Options struct {
	// Mode is the policy: engine (default), fifo, kueue or batch-fairshare
	// (oracle is Bound, not Run).
	Mode Mode `json:"mode"`
	// Teams are the team specs (quotas).
	Teams []policy.Team `json:"teams"`
	// Fleet is the nodes (nil: DefaultFleet(Teams)).
	Fleet []policy.Node `json:"-"`
	// Config tunes the engine.
	Config policy.Config `json:"config"`
	// RestartDelay (s) is the checkpoint + restart cost of a planned change:
	// a resized or repaired job, a preempted job resuming, and a job
	// admitted on capacity just taken from others (the victims checkpoint
	// first) make no progress for this long (default 15 s).
	RestartDelay float64 `json:"restartDelay"`
	// ResizeDelay (s) replaces RestartDelay for a resize (grow or shrink),
	// e.g. 0.14 s for an in-process resize (0: RestartDelay).
	ResizeDelay float64 `json:"resizeDelay,omitempty"`
	// CheckpointInterval (s): a preempted job loses the progress since
	// its last checkpoint, on average half this interval (0: none lost).
	CheckpointInterval float64 `json:"checkpointInterval,omitempty"`
	// ShareDecay is batch-fairshare's shareDecaySeconds (default 3600 s).
	ShareDecay time.Duration `json:"shareDecay,omitempty"`
	// Tick (s) is the engine period while work is pending or could grow
	// (default 10 s); the engine also runs at every arrival and completion.
	Tick float64 `json:"tick"`
	// WindowStart and WindowEnd (s) bound the utilisation measurement
	// (default: first to last submission, the period under sustained load).
	WindowStart float64 `json:"windowStart"`
	WindowEnd   float64 `json:"windowEnd"`
	// MaxTime (s) stops the simulation (default: last submission + 30 days).
	MaxTime float64 `json:"maxTime"`
	// OnCycle, if set, sees every decision (t in seconds): for timelines
	// and debugging.
	OnCycle func(t float64, d *policy.Decision) `json:"-"`
}

// epoch is virtual time zero.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

type sjob struct {
	tj        *TraceJob
	spec      policy.Job
	state     int // 0 future, 1 pending, 2 running, 3 done
	remaining float64
	size      int
	gpus      int
	prodFrom  float64 // productive from this time (restart delays)
	started   bool
	owedSince float64
	finish    float64
	flavor    string
	tr        *TeamReport
}

const (
	stFuture = iota
	stPending
	stRunning
	stDone
)

// Run simulates trace in virtual time with the engine (or the FIFO
// baseline) and reports utilisation, queue waits, reclaim latency,
// preemptions and resizes.
func Run(trace []TraceJob, o Options) (*Report, error) {
	if len(o.Teams) == 0 {
		return nil, errors.New("simulate: no teams")
	}
	if err := checkTrace(trace, "trace"); err != nil {
		return nil, err
	}
	if o.Mode == "" {
		o.Mode = ModeEngine
	}
	switch o.Mode {
	case ModeEngine, ModeFIFO, ModeKueue, ModeBatch:
	default:
		return nil, fmt.Errorf("simulate: mode %q: want engine, fifo, kueue or batch-fairshare", o.Mode)
	}
	if o.RestartDelay == 0 {
		o.RestartDelay = 15
	}
	if o.ResizeDelay <= 0 {
		o.ResizeDelay = o.RestartDelay
	}
	if o.ShareDecay == 0 {
		o.ShareDecay = time.Hour
	}
	if o.Tick <= 0 {
		o.Tick = 10
	}
	fleet := o.Fleet
	if fleet == nil {
		fleet = BuildFleet(DefaultFleet(o.Teams))
	}
	sm := &simulation{o: o, rep: &Report{Mode: string(o.Mode), Policy: string(o.Mode), Description: Describe(o.Mode), RestartDelay: o.RestartDelay},
		nominal: map[[2]string]int{}, st: policy.State{Config: o.Config, Nodes: fleet, Teams: o.Teams}}
	sm.schedule = sm.scheduler()
	if err := sm.setup(trace); err != nil {
		return nil, err
	}
	rep := sm.rep
	if len(sm.jobs) == 0 {
		return rep, nil
	}
	sm.loop()
	sm.report()
	return rep, nil
}

// simulation is one run's state.
type simulation struct {
	o       Options
	rep     *Report
	st      policy.State
	jobs    []*sjob // in submission order
	byName  map[string]*sjob
	nominal map[[2]string]int // team and flavor -> nominal quota
	active  []*sjob           // pending or running
	next    int               // the next job to arrive
	t       float64
	first   float64 // the first submission
	maxT    float64
	ws, we  float64 // the measurement window
	allocs  []policy.Allocation
	// allocGS and prodGS are the accelerator-seconds allocated and
	// productive within the window.
	allocGS, prodGS float64
	dirty, needTick bool
	lastCycle       float64
	engineTime      time.Duration
	// schedule is the policy; batchUsage the fair-share usage it keeps.
	schedule   func(policy.State) policy.Decision
	batchUsage policy.BatchUsage
	lastDecay  float64
	// allAlloc and allProd are accelerator-seconds allocated and
	// productive over the whole run (the busy period); lostGS is progress
	// lost to preemptions (since the last checkpoint).
	allAlloc, allProd, lostGS float64
	jcts                      []float64
}

// setup builds the teams' reports and the jobs, in submission order, and
// the measurement window.
func (sm *simulation) setup(trace []TraceJob) error {
	rep, o, cfg := sm.rep, sm.o, sm.st.Config
	teamRep := map[string]*TeamReport{}
	onlyFlavor := map[string]string{}
	for _, t := range sm.st.Teams {
		if err := t.Validate(); err != nil {
			return fmt.Errorf("simulate: %v", err)
		}
		tr := &TeamReport{Team: t.Name}
		for _, q := range t.Quotas {
			tr.Nominal += q.Nominal
			sm.nominal[[2]string{t.Name, q.Flavor}] = q.Nominal
		}
		if len(t.Quotas) == 1 {
			onlyFlavor[t.Name] = t.Quotas[0].Flavor
		}
		teamRep[t.Name] = tr
		rep.Teams = append(rep.Teams, tr)
	}
	for _, n := range sm.st.Nodes {
		rep.Capacity += n.HealthyAccelerators()
	}
	if rep.Capacity == 0 {
		return errors.New("simulate: the fleet has no accelerators")
	}
	jobs := make([]*sjob, len(trace))
	for i := range trace {
		tj := &trace[i]
		tr := teamRep[tj.Team]
		if tr == nil {
			return fmt.Errorf("simulate: job %q: team %q is not in the teams file", tj.Name, tj.Team)
		}
		spec := jobSpec(tj, o.Mode)
		if err := spec.Validate(cfg); err != nil {
			return fmt.Errorf("simulate: %v", err)
		}
		fl := tj.Flavor
		if fl == "" {
			fl = onlyFlavor[tj.Team]
		}
		jobs[i] = &sjob{tj: tj, spec: spec, remaining: tj.Work, owedSince: -1, flavor: fl, tr: tr}
		tr.Jobs++
	}
	sort.SliceStable(jobs, func(a, b int) bool { return jobs[a].tj.Submit < jobs[b].tj.Submit })
	sm.rejectTooLarge(jobs)
	sm.jobs = jobs
	rep.Jobs = len(jobs)
	if len(jobs) == 0 {
		return nil
	}
	first, last := jobs[0].tj.Submit, jobs[len(jobs)-1].tj.Submit
	ws, we := o.WindowStart, o.WindowEnd
	if ws == 0 && we == 0 {
		ws, we = first, last
	}
	if we <= ws {
		we = ws + 1
	}
	rep.WindowStart, rep.WindowEnd = ws, we
	sm.ws, sm.we, sm.first, sm.t = ws, we, first, first
	sm.maxT = o.MaxTime
	if sm.maxT <= 0 {
		sm.maxT = last + 30*86400
	}
	sm.byName = make(map[string]*sjob, len(jobs))
	for _, j := range jobs {
		sm.byName[j.tj.Name] = j
	}
	sm.dirty, sm.lastCycle = true, math.Inf(-1)
	return nil
}

// rejectTooLarge rejects, in every mode alike, the jobs whose smallest
// size needs more accelerators of their flavor than the fleet has: no
// policy can ever run them.
func (sm *simulation) rejectTooLarge(jobs []*sjob) {
	capacity := map[string]int{}
	for _, n := range sm.st.Nodes {
		capacity[n.Flavor] += n.HealthyAccelerators()
	}
	for _, j := range jobs {
		if j.spec.MinNodes*j.spec.PerNode.Accelerators > capacity[j.flavor] {
			j.state = stDone
			j.tr.Rejected++
			sm.rep.Rejected++
		}
	}
}

// jobSpec is the engine's spec of a trace job: static at its node count,
// or elastic (engine mode only).
func jobSpec(tj *TraceJob, mode Mode) policy.Job {
	spec := policy.Job{Name: tj.Name, Team: tj.Team, Priority: tj.Priority, Flavor: tj.Flavor,
		PerNode: policy.Resources{Accelerators: tj.GPUsPerNode}, SubmitTime: at(tj.Submit)}
	n := tj.StaticNodes()
	spec.MinNodes, spec.MaxNodes = n, n
	if tj.Elastic && mode == ModeEngine {
		spec.Elastic, spec.Step = true, tj.Step
		spec.MinNodes, spec.MaxNodes = max(1, tj.MinNodes), max(tj.MaxNodes, tj.MinNodes, 1)
		if tj.MinNodes == 0 {
			spec.MinNodes = n
		}
		if tj.MaxNodes == 0 {
			spec.MaxNodes = max(n, spec.MinNodes)
		}
	}
	return spec
}

// loop runs the engine at every arrival and completion (and every Tick
// while it may decide more) and advances virtual time between events.
func (sm *simulation) loop() {
	for {
		for sm.next < len(sm.jobs) && sm.jobs[sm.next].tj.Submit <= sm.t {
			if sm.jobs[sm.next].state == stDone { // rejected
				sm.next++
				continue
			}
			sm.jobs[sm.next].state = stPending
			sm.active = append(sm.active, sm.jobs[sm.next])
			sm.next++
			sm.dirty = true
		}
		if sm.dirty || (sm.t-sm.lastCycle >= sm.o.Tick-1e-9 && sm.needTick) {
			sm.cycle()
		}
		tn, ok := sm.nextEvent()
		if !ok {
			return
		}
		sm.advance(tn)
	}
}

// cycle runs the engine on the active jobs and applies its decision.
func (sm *simulation) cycle() {
	st, rep := &sm.st, sm.rep
	markOwed(sm.active, sm.allocs, sm.byName, sm.nominal, sm.t)
	st.Now = at(sm.t)
	st.Jobs = st.Jobs[:0]
	for _, j := range sm.active {
		if j.state != stDone {
			st.Jobs = append(st.Jobs, j.spec)
		}
	}
	st.Allocations = sm.allocs
	start := time.Now()
	d := sm.schedule(*st)
	sm.engineTime += time.Since(start)
	rep.Cycles++
	if sm.o.OnCycle != nil {
		sm.o.OnCycle(sm.t, &d)
	}
	sm.allocs = d.Allocations
	changed := sm.apply(d)
	sm.dirty = false
	sm.lastCycle = sm.t
	// The engine is a pure function: with no arrival or completion,
	// a new cycle can only differ when jobs were just requeued (they
	// wait one cycle) or when an elastic job's stable period ends
	// while capacity is idle.
	sm.needTick = changed
	if !sm.needTick {
		used := 0
		for _, a := range sm.allocs {
			used += a.Size * a.AcceleratorsPerNode
		}
		sm.needTick = used < rep.Capacity && growable(sm.active)
	}
}

// nextEvent is the time of the next arrival, completion or tick; ok is
// false when there is none before MaxTime.
func (sm *simulation) nextEvent() (tn float64, ok bool) {
	tn = math.Inf(1)
	if sm.next < len(sm.jobs) {
		tn = sm.jobs[sm.next].tj.Submit
	}
	for _, j := range sm.active {
		if j.state == stRunning && j.gpus > 0 {
			j.finish = math.Max(sm.t, j.prodFrom) + j.remaining/float64(j.gpus)
			tn = math.Min(tn, j.finish)
		}
	}
	if sm.needTick {
		tn = math.Min(tn, sm.lastCycle+sm.o.Tick)
	}
	if math.IsInf(tn, 1) || tn > sm.maxT {
		return 0, false
	}
	return math.Max(tn, sm.t), true
}

// overlap is how much of [a, b] lies in the measurement window.
func (sm *simulation) overlap(a, b float64) float64 {
	return math.Max(0, math.Min(b, sm.we)-math.Max(a, sm.ws))
}

// advance runs the running jobs to tn: their work, the accelerator-
// seconds allocated and productive, the jobs that finished.
func (sm *simulation) advance(tn float64) {
	t, rep := sm.t, sm.rep
	done := false
	sm.accrueWaiting(tn - t)
	for _, j := range sm.active {
		if j.state != stRunning {
			continue
		}
		g := float64(j.gpus)
		a := sm.overlap(t, tn) * g
		sm.allocGS += a
		j.tr.allocGS += a
		sm.allAlloc += (tn - t) * g
		j.tr.allAlloc += (tn - t) * g
		pf := math.Max(t, j.prodFrom)
		if tn > pf {
			sm.prodGS += sm.overlap(pf, tn) * g
			sm.allProd += (tn - pf) * g
			j.remaining -= (tn - pf) * g
		}
		if j.remaining <= 1e-6*math.Max(1, g) || j.finish <= tn+1e-9 {
			j.state = stDone
			j.tr.Completed++
			rep.Completed++
			rep.Makespan = tn - sm.first
			sm.jcts = append(sm.jcts, tn-j.tj.Submit)
			done = true
		}
	}
	sm.t = tn
	if done {
		sm.dropDone()
	}
}

// accrueWaiting adds dt to each team that has a job waiting, with the
// part of its nominal quota it holds meanwhile (for Fairness).
func (sm *simulation) accrueWaiting(dt float64) {
	if dt <= 0 {
		return
	}
	used := map[*TeamReport]int{}
	waiting := map[*TeamReport]bool{}
	for _, j := range sm.active {
		switch j.state {
		case stRunning:
			used[j.tr] += j.gpus
		case stPending:
			waiting[j.tr] = true
		}
	}
	for tr := range waiting {
		if tr.Nominal > 0 {
			tr.waitT += dt
			tr.waitQuota += dt * math.Min(1, float64(used[tr])/float64(tr.Nominal))
		}
	}
}

// dropDone forgets the finished jobs and their allocations.
func (sm *simulation) dropDone() {
	keep := sm.active[:0]
	for _, j := range sm.active {
		if j.state != stDone {
			keep = append(keep, j)
		}
	}
	for i := len(keep); i < len(sm.active); i++ {
		sm.active[i] = nil
	}
	sm.active = keep
	k := sm.allocs[:0:0]
	for _, a := range sm.allocs {
		if sm.byName[a.Job].state != stDone {
			k = append(k, a)
		}
	}
	sm.allocs = k
	sm.dirty = true
}

// report fills in the figures: utilisation over the window, each team's
// share, waits and reclaim latencies.
func (sm *simulation) report() {
	rep, ws, we := sm.rep, sm.ws, sm.we
	window := (we - ws) * float64(rep.Capacity)
	rep.Allocated = 100 * sm.allocGS / window
	rep.Utilization = 100 * sm.prodGS / window
	rep.EngineMillis = float64(sm.engineTime.Microseconds()) / 1000
	var allWaits, allReclaims []float64
	for _, tr := range rep.Teams {
		tr.AvgAllocated = tr.allocGS / (we - ws)
		if tr.Nominal > 0 {
			tr.OfNominal = 100 * tr.AvgAllocated / float64(tr.Nominal)
		}
		tr.OfFleet = 100 * tr.AvgAllocated / float64(rep.Capacity)
		tr.WaitP50, tr.WaitP95 = percentile(tr.waits, 50), percentile(tr.waits, 95)
		tr.ReclaimP95, tr.ReclaimMax = percentile(tr.reclaims, 95), percentile(tr.reclaims, 100)
		tr.ReclaimSamples = len(tr.reclaims)
		tr.NeverStarted = tr.Jobs - len(tr.waits)
		allWaits = append(allWaits, tr.waits...)
		allReclaims = append(allReclaims, tr.reclaims...)
	}
	rep.WaitP50, rep.WaitP95 = percentile(allWaits, 50), percentile(allWaits, 95)
	rep.ReclaimP95, rep.ReclaimMax = percentile(allReclaims, 95), percentile(allReclaims, 100)
	rep.ReclaimSamples = len(allReclaims)
	sm.figures(allWaits)
}

// at is virtual time sec.
func at(sec float64) time.Time { return epoch.Add(time.Duration(sec * float64(time.Second))) }

func growable(active []*sjob) bool {
	for _, j := range active {
		if j.state == stRunning && j.spec.Elastic && j.size < j.spec.MaxNodes {
			return true
		}
	}
	return false
}

// apply updates the simulated jobs from a decision and reports whether any
// job was shrunk or preempted (so the freed capacity is handed out on the
// next cycle).
func (sm *simulation) apply(d policy.Decision) bool {
	byName, t, restart, rep := sm.byName, sm.t, sm.o.RestartDelay, sm.rep
	changed := false
	for _, r := range d.Reasons {
		j := byName[r.Job]
		if j == nil || j.state == stDone {
			continue
		}
		if r.Kind == policy.KindPending && r.Code == policy.CodeQuotaExceeded {
			r.Kind = policy.KindInvalid // the engine's "can never fit": quotas do not change here
		}
		switch r.Kind {
		case policy.KindInvalid:
			// Rejected: it can never run (it leaves the queue).
			j.state = stDone
			rep.Rejected++
			j.tr.Rejected++
			changed = true
		case policy.KindAdmitted:
			j.state = stRunning
			j.prodFrom = t
			if j.started || r.Code == policy.CodeReclaim || r.Code == policy.CodePriorityPreemption {
				j.prodFrom = t + restart
			}
			if !j.started {
				j.started = true
				j.tr.waits = append(j.tr.waits, t-j.tj.Submit)
			}
			if j.owedSince >= 0 {
				j.tr.reclaims = append(j.tr.reclaims, j.prodFrom-j.owedSince)
				j.owedSince = -1
			}
		case policy.KindGrown, policy.KindShrunk, policy.KindRepaired, policy.KindMoved:
			j.prodFrom = t + restart
			if r.Kind == policy.KindGrown || r.Kind == policy.KindShrunk {
				j.prodFrom = t + sm.o.ResizeDelay
			}
			if r.Kind == policy.KindGrown {
				rep.Grows++
				j.tr.Grown++
			} else if r.Kind == policy.KindShrunk {
				rep.Shrinks++
				j.tr.Shrunk++
			} else if r.Kind == policy.KindMoved {
				rep.Moves++
			}
		case policy.KindPreempted:
			j.state = stPending
			if ci := sm.o.CheckpointInterval; ci > 0 && j.gpus > 0 {
				lost := math.Min(ci/2, math.Max(0, t-j.prodFrom)) * float64(j.gpus)
				j.remaining += lost
				sm.lostGS += lost
				// The lost progress was counted as productive: it was not.
				sm.allProd -= lost
				sm.prodGS -= sm.overlap(t-lost/float64(j.gpus), t) * float64(j.gpus)
			}
			rep.Preemptions++
			j.tr.Preempted++
		}
		if r.Kind == policy.KindPreempted || r.Kind == policy.KindShrunk {
			changed = true
		}
		if r.ToSize == 0 && j.state == stRunning {
			j.state = stPending
		}
	}
	for _, a := range d.Allocations {
		if j := byName[a.Job]; j != nil {
			j.size, j.gpus = a.Size, a.Size*a.AcceleratorsPerNode
		}
	}
	for _, r := range d.Reasons {
		if j := byName[r.Job]; j != nil && r.ToSize == 0 {
			j.size, j.gpus = 0, 0
		}
	}
	return changed
}

// markOwed records when each pending job's demand became covered by its
// team's nominal quota (used + earlier pending demand + its own <= nominal,
// in admission order): the start of a reclaim-latency sample.
func markOwed(active []*sjob, allocs []policy.Allocation, byName map[string]*sjob, nominal map[[2]string]int, t float64) {
	used := map[[2]string]int{}
	for _, a := range allocs {
		if j := byName[a.Job]; j != nil {
			used[[2]string{j.tj.Team, j.flavor}] += a.Size * a.AcceleratorsPerNode
		}
	}
	var pend []*sjob
	for _, j := range active {
		if j.state == stPending {
			pend = append(pend, j)
		}
	}
	sort.SliceStable(pend, func(a, b int) bool {
		pa, pb := prio(pend[a]), prio(pend[b])
		if pa != pb {
			return pa > pb
		}
		return pend[a].tj.Submit < pend[b].tj.Submit
	})
	for _, j := range pend {
		k := [2]string{j.tj.Team, j.flavor}
		need := j.spec.MinNodes * j.spec.PerNode.Accelerators
		if used[k]+need <= nominal[k] {
			used[k] += need
			if j.owedSince < 0 {
				j.owedSince = t
			}
		} else {
			j.owedSince = -1
		}
	}
}

func prio(j *sjob) int {
	if j.spec.Priority != nil {
		return *j.spec.Priority
	}
	return policy.DefaultPriority
}

func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// scheduler is the policy of the run's mode.
func (sm *simulation) scheduler() func(policy.State) policy.Decision {
	switch sm.o.Mode {
	case ModeFIFO:
		return policy.FIFO
	case ModeKueue:
		kc := policy.KueueConfig{Queueing: sm.o.Config.Queueing, ReclaimWithinCohort: policy.KueueAny}
		for _, t := range sm.o.Teams {
			if t.Preemption == policy.PreemptLowerPriority {
				kc.WithinClusterQueue = policy.KueueLowerPriority
			}
		}
		return func(st policy.State) policy.Decision { return policy.Kueue(st, kc) }
	case ModeBatch:
		bc := policy.BatchConfig{ShareDecay: sm.o.ShareDecay}
		return func(st policy.State) policy.Decision {
			sm.batchUsage = policy.DecayUsage(sm.batchUsage, st.Allocations, sm.t-sm.lastDecay, bc.ShareDecay)
			sm.lastDecay = sm.t
			return policy.BatchFairShare(st, bc, sm.batchUsage)
		}
	}
	return policy.Schedule
}

// figures fills in the job-level figures: JCT, queueing delay, the busy
// period's utilisation, fairness against quota and the cost of restarts.
func (sm *simulation) figures(waits []float64) {
	rep := sm.rep
	rep.MeanJCT = mean(sm.jcts)
	rep.JCTP50, rep.JCTP95, rep.JCTP99 = percentile(sm.jcts, 50), percentile(sm.jcts, 95), percentile(sm.jcts, 99)
	rep.MeanWait = mean(waits)
	rep.JCTs = sm.jcts
	if busy := rep.Makespan * float64(rep.Capacity); busy > 0 {
		rep.BusyAllocated = 100 * sm.allAlloc / busy
		rep.BusyUtilization = 100 * sm.allProd / busy
	}
	rep.Resizes = rep.Grows + rep.Shrinks
	rep.GPUHoursLost = (sm.allAlloc - sm.allProd) / 3600
	var xs []float64
	for _, tr := range rep.Teams {
		if tr.waitT > 0 {
			tr.QuotaWhileWaiting = 100 * tr.waitQuota / tr.waitT
			xs = append(xs, tr.waitQuota/tr.waitT)
		}
	}
	rep.Fairness = jain(xs)
}

// jain is Jain's fairness index of xs: (sum x)^2 / (n sum x^2), 1 when all
// are equal (0 for none).
func jain(xs []float64) float64 {
	s, s2 := 0.0, 0.0
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(xs)) * s2)
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

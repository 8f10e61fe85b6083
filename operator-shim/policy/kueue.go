package policy

import (
	"fmt"
	"sort"
)

// KueuePreemption is a ClusterQueue preemption setting (Kueue's
// spec.preemption.reclaimWithinCohort and withinClusterQueue).
type KueuePreemption string

const (
	// KueueNever never preempts.
	KueueNever KueuePreemption = "Never"
	// KueueLowerPriority preempts only lower-priority workloads.
	KueueLowerPriority KueuePreemption = "LowerPriority"
	// KueueAny preempts any workload (reclaimWithinCohort only).
	KueueAny KueuePreemption = "Any"
)

// KueueConfig is the ClusterQueues' shared settings. Each team is one
// ClusterQueue: its cohort is Team.Cohort ("" is one default cohort, as in
// the engine), its nominal quota, borrowingLimit (nil: unlimited) and
// lendingLimit (nil: all of the nominal quota) are Team.Quotas.
type KueueConfig struct {
	// Queueing is the queueingStrategy: BestEffortFIFO (default) or
	// StrictFIFO.
	Queueing QueueingStrategy `json:"queueing,omitempty"`
	// ReclaimWithinCohort: a workload that fits its ClusterQueue's nominal
	// quota may preempt workloads of other ClusterQueues of the cohort
	// that are borrowing (Never, LowerPriority or Any; default Never).
	ReclaimWithinCohort KueuePreemption `json:"reclaimWithinCohort,omitempty"`
	// WithinClusterQueue: a workload may preempt lower-priority workloads
	// of its own ClusterQueue (Never or LowerPriority; default Never).
	WithinClusterQueue KueuePreemption `json:"withinClusterQueue,omitempty"`
	// noBorrow removes borrowing and lending (the FIFO baseline).
	noBorrow bool
}

// Kueue is one Kueue scheduling cycle over st (Kueue v0.9 semantics as
// documented in its ClusterQueue, Cohort and Preemption concepts):
//
//   - A workload is admitted when its ClusterQueue's usage stays within
//     nominal + borrowingLimit and the cohort has the capacity: what the
//     ClusterQueue uses beyond its unlendable part (nominal -
//     lendingLimit) draws on the cohort's pool, the sum of the members'
//     lendable quota. It also needs free nodes (placement as the engine).
//   - Heads are considered across ClusterQueues with workloads that fit
//     without borrowing first, then by priority, then by creation time.
//   - StrictFIFO: a ClusterQueue's head that does not fit blocks the
//     ClusterQueue. BestEffortFIFO: it is skipped and later workloads are
//     tried.
//   - Preemption: a workload that fits within its nominal quota takes
//     capacity back from other ClusterQueues of the cohort that are
//     borrowing (ReclaimWithinCohort; with LowerPriority only from lower
//     priorities), and one may preempt lower-priority workloads of its own
//     ClusterQueue (WithinClusterQueue). Candidates: other ClusterQueues
//     first, then lower priority, then the most recently admitted; a
//     borrowing ClusterQueue stops being a candidate once it is back
//     within its nominal quota; only the victims needed are kept.
//
// Workloads run at a static size (Job.MinNodes); none is ever resized.
func Kueue(st State, kc KueueConfig) Decision {
	c := newCycle(st)
	k := &kueueCycle{bcycle: c, kc: kc}
	k.run()
	return c.decision()
}

// FIFO is the static FIFO baseline: every team strictly first-in first-out
// within its own nominal quota, no lending, no borrowing, no preemption;
// a job larger than its team's quota is rejected instead of blocking the
// team's queue.
func FIFO(st State) Decision {
	return Kueue(st, KueueConfig{Queueing: StrictFIFO, noBorrow: true})
}

// kueueCycle is one Kueue cycle.
type kueueCycle struct {
	*bcycle
	kc KueueConfig
}

// cq is a ClusterQueue's quota on a flavor.
type cq struct {
	nominal, borrow, lend int
}

// quota is team's ClusterQueue quota on flavor (ok false: none).
func (k *kueueCycle) quota(team, flavor string) (q cq, ok bool) {
	t := k.teams[team]
	if t == nil {
		return q, false
	}
	for _, fq := range t.Quotas {
		if fq.Flavor != flavor {
			continue
		}
		q = cq{nominal: fq.Nominal, borrow: unlimited, lend: fq.Nominal}
		if fq.BorrowingLimit != nil {
			q.borrow = *fq.BorrowingLimit
		}
		if fq.LendingLimit != nil {
			q.lend = min(*fq.LendingLimit, fq.Nominal)
		}
		if k.kc.noBorrow {
			q.borrow, q.lend = 0, 0
		}
		return q, true
	}
	return q, false
}

// pool is the cohort's lendable pool on flavor and how much of it is used,
// leaving out team's own use (so the caller adds its own).
func (k *kueueCycle) pool(team, flavor string) (pool, used int) {
	cohort := k.teams[team].Cohort
	for name, t := range k.teams {
		if t.Cohort != cohort {
			continue
		}
		q, ok := k.quota(name, flavor)
		if !ok {
			continue
		}
		pool += q.lend
		if name != team {
			used += max(0, k.usage[[2]string{name, flavor}]-(q.nominal-q.lend))
		}
	}
	return pool, used
}

// fits reports whether j's ClusterQueue and cohort have quota for it now;
// code says why not.
func (k *kueueCycle) fits(j *bjob) (bool, ReasonCode) {
	q, ok := k.quota(j.team, j.flavor)
	if !ok {
		return false, CodeNoFlavor
	}
	u := k.usage[[2]string{j.team, j.flavor}] + j.gpus
	if q.borrow != unlimited && u > q.nominal+q.borrow {
		return false, CodeBorrowingLimit
	}
	pool, used := k.pool(j.team, j.flavor)
	if used+max(0, u-(q.nominal-q.lend)) > pool {
		return false, CodeCohortExhausted
	}
	return true, ""
}

// reach is the most j's ClusterQueue can ever hold.
func (k *kueueCycle) reach(j *bjob) int {
	q, ok := k.quota(j.team, j.flavor)
	if !ok {
		return 0
	}
	pool, _ := k.pool(j.team, j.flavor)
	r := q.nominal - q.lend + pool
	if q.borrow != unlimited {
		r = min(r, q.nominal+q.borrow)
	}
	return r
}

// run admits (and preempts for) the pending workloads.
func (k *kueueCycle) run() {
	queues := map[string][]*bjob{} // per ClusterQueue, admission order
	for _, j := range k.pending() {
		if r := k.reach(j); j.gpus > r || !k.placeable(j) {
			j.reject(CodeQuotaExceeded, fmt.Sprintf("needs %d accelerators, more than team %s can ever get (%d) or the fleet can place", j.gpus, j.team, r))
			continue
		}
		queues[j.team] = append(queues[j.team], j)
	}
	strict := k.kc.Queueing == StrictFIFO
	blocked := map[string]bool{}
	for progress := true; progress; {
		progress = false
		var heads []*bjob
		for team, q := range queues {
			for _, j := range q {
				if j.running {
					continue
				}
				if strict && blocked[team] {
					break
				}
				heads = append(heads, j)
				if strict {
					break
				}
			}
		}
		borrows := func(j *bjob) bool {
			q, _ := k.quota(j.team, j.flavor)
			return k.usage[[2]string{j.team, j.flavor}]+j.gpus > q.nominal
		}
		sort.SliceStable(heads, func(a, b int) bool {
			if ba, bb := borrows(heads[a]), borrows(heads[b]); ba != bb {
				return !ba
			}
			return before(heads[a], heads[b])
		})
		for _, j := range heads {
			if j.running || (strict && blocked[j.team]) {
				continue
			}
			if k.admit(j) {
				progress = true
				if strict {
					break // the queue has a new head
				}
			} else if strict {
				blocked[j.team] = true
			}
		}
	}
	for team, q := range queues {
		if !strict || !blocked[team] {
			continue
		}
		head := true
		for _, j := range q {
			if j.running {
				continue
			}
			if !head && j.reason.Kind == KindPending {
				j.reason.Code, j.reason.Message = CodeStrictFIFO, "StrictFIFO: waiting behind an earlier job of the ClusterQueue"
			}
			head = false
		}
	}
}

// admit tries to admit j, preempting if the settings allow it.
func (k *kueueCycle) admit(j *bjob) bool {
	ok, code := k.fits(j)
	if ok {
		if nodes := k.place(j); nodes != nil {
			q, _ := k.quota(j.team, j.flavor)
			c := CodeWithinQuota
			if k.usage[[2]string{j.team, j.flavor}]+j.gpus > q.nominal {
				c = CodeBorrowing
			}
			k.start(j, nodes, c, "admitted by Kueue")
			return true
		}
		code = CodeNoCapacity
	}
	if k.preempt(j) {
		return true
	}
	j.reason.Code, j.reason.Message = code, fmt.Sprintf("waiting: %s", code)
	return false
}

// preempt admits j by preempting candidates (see Kueue), or changes nothing.
func (k *kueueCycle) preempt(j *bjob) bool {
	q, ok := k.quota(j.team, j.flavor)
	if !ok {
		return false
	}
	key := [2]string{j.team, j.flavor}
	within := k.usage[key]+j.gpus <= q.nominal
	reclaim := within && k.kc.ReclaimWithinCohort != "" && k.kc.ReclaimWithinCohort != KueueNever
	own := k.kc.WithinClusterQueue == KueueLowerPriority
	var cands []*bjob
	for _, v := range k.jobs {
		if !v.running || v.flavor != j.flavor || v == j {
			continue
		}
		switch {
		case v.team == j.team:
			if own && v.prio < j.prio {
				cands = append(cands, v)
			}
		case reclaim && k.teams[v.team] != nil && k.teams[v.team].Cohort == k.teams[j.team].Cohort:
			if k.kc.ReclaimWithinCohort == KueueAny || v.prio < j.prio {
				cands = append(cands, v)
			}
		}
	}
	if len(cands) == 0 {
		return false
	}
	sort.SliceStable(cands, func(a, b int) bool {
		x, y := cands[a], cands[b]
		if ox, oy := x.team != j.team, y.team != j.team; ox != oy {
			return ox
		}
		if x.prio != y.prio {
			return x.prio < y.prio
		}
		if !x.since.Equal(y.since) {
			return x.since.After(y.since)
		}
		return x.name < y.name
	})
	var victims []*bjob
	var nodes []*bnode
	for _, v := range cands {
		if v.team != j.team {
			vq, _ := k.quota(v.team, v.flavor)
			if k.usage[[2]string{v.team, v.flavor}] <= vq.nominal {
				continue // no longer borrowing
			}
		}
		k.stop(v)
		victims = append(victims, v)
		if ok, _ := k.fits(j); ok {
			if nodes = k.place(j); nodes != nil {
				break
			}
		}
	}
	if nodes == nil {
		for _, v := range victims {
			k.resume(v)
		}
		return false
	}
	// Keep only the victims needed.
	kept := victims[:0:0]
	for i := len(victims) - 1; i >= 0; i-- {
		v := victims[i]
		k.resume(v)
		if ok, _ := k.fits(j); ok {
			if n := k.place(j); n != nil {
				nodes = n
				continue
			}
		}
		k.stop(v)
		kept = append(kept, v)
	}
	nodes = k.place(j)
	code := CodeReclaim
	if !within || (len(kept) > 0 && kept[0].team == j.team) {
		code = CodePriorityPreemption
	}
	for _, v := range kept {
		c := CodeReclaim
		if v.team == j.team {
			c = CodePriorityPreemption
		}
		v.reason = Reason{Job: v.name, Team: v.team, Kind: KindPreempted, Code: c, FromSize: v.size,
			Message: "preempted by Kueue for " + j.name, For: []string{j.name}, ForTeam: j.team}
	}
	k.start(j, nodes, code, fmt.Sprintf("admitted by Kueue after preempting %d workload(s)", len(kept)))
	return true
}

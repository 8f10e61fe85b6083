package sim

import (
	"container/heap"
	"errors"
	"math"
	"sort"
)

// Bound is the oracle row of a comparison: figures no schedule of trace
// on capacity accelerators can beat, whatever the policy, ignoring
// placement, restart costs and quotas (a fluid relaxation). Every job may
// run at up to its largest size (MaxNodes x GPUsPerNode for an elastic
// job, else its static size) and scales linearly. Each figure is a bound,
// not one schedule's outcome:
//
//   - a job completes no sooner than Submit + Work / (largest size), so
//     each JCT percentile is at least that of these minimum run times;
//   - mean JCT is at least the larger of their mean and that of
//     preemptive shortest-remaining-work-first on one machine of speed
//     capacity, optimal for the sum of completion times of that
//     relaxation;
//   - makespan is at least the latest (submission + minimum run time) and,
//     for every submission time s, s + (work submitted at or after s) /
//     capacity;
//   - utilisation over the window is at most the work that could be done
//     in it (each job from its submission, at its largest size, until
//     its work is done) over capacity x window, and over the busy period
//     at most all the work over capacity x the makespan bound.
//
// Jobs larger than the fleet are rejected (as Run rejects them). Queueing
// delay, preemptions, resizes and lost GPU-hours are 0; fairness
// is not bounded (0).
func Bound(trace []TraceJob, capacity int, windowStart, windowEnd float64) (*Report, error) {
	if err := checkTrace(trace, "trace"); err != nil {
		return nil, err
	}
	if capacity < 1 {
		return nil, errors.New("bound: capacity must be >= 1")
	}
	rep := &Report{Mode: string(ModeOracle), Policy: string(ModeOracle), Description: Describe(ModeOracle),
		Jobs: len(trace), Completed: len(trace), Capacity: capacity}

	var jobs []TraceJob
	for _, j := range trace {
		if j.StaticNodes()*j.GPUsPerNode > capacity && (!j.Elastic || max(1, j.MinNodes)*j.GPUsPerNode > capacity) {
			rep.Rejected++ // larger than the fleet: rejected in every mode
			continue
		}
		jobs = append(jobs, j)
	}
	rep.Completed = len(jobs)
	if len(jobs) == 0 {
		return rep, nil
	}
	sort.SliceStable(jobs, func(a, b int) bool { return jobs[a].Submit < jobs[b].Submit })
	first, last := jobs[0].Submit, jobs[len(jobs)-1].Submit
	if windowStart == 0 && windowEnd == 0 {
		windowStart, windowEnd = first, last
	}
	if windowEnd <= windowStart {
		windowEnd = windowStart + 1
	}
	rep.WindowStart, rep.WindowEnd = windowStart, windowEnd
	C := float64(capacity)
	minRun := make([]float64, len(jobs))
	total, inWindow, makespan := 0.0, 0.0, 0.0
	for i, j := range jobs {
		g := float64(largest(j))
		minRun[i] = j.Work / g
		total += j.Work
		makespan = math.Max(makespan, j.Submit+minRun[i]-first)
		from := math.Max(j.Submit, windowStart)
		inWindow += math.Min(j.Work, g*math.Max(0, windowEnd-from))
	}
	suffix := 0.0
	for i := len(jobs) - 1; i >= 0; i-- {
		suffix += jobs[i].Work
		makespan = math.Max(makespan, jobs[i].Submit-first+suffix/C)
	}
	rep.Makespan = makespan
	rep.MeanJCT = math.Max(mean(minRun), srptMeanJCT(jobs, C))
	rep.JCTP50, rep.JCTP95, rep.JCTP99 = percentile(minRun, 50), percentile(minRun, 95), percentile(minRun, 99)
	rep.JCTs = minRun
	rep.Utilization = math.Min(100, 100*inWindow/(C*(windowEnd-windowStart)))
	rep.Allocated = rep.Utilization
	rep.BusyUtilization = math.Min(100, 100*total/(C*makespan))
	rep.BusyAllocated = rep.BusyUtilization
	return rep, nil
}

// largest is the most accelerators j can ever hold.
func largest(j TraceJob) int {
	n := j.StaticNodes()
	if j.Elastic {
		n = max(n, j.MaxNodes, j.MinNodes)
	}
	return max(1, n) * j.GPUsPerNode
}

// srptMeanJCT is the mean completion time (from submission) of preemptive
// shortest-remaining-work-first on one machine of speed c; jobs are in
// submission order.
func srptMeanJCT(jobs []TraceJob, c float64) float64 {
	h := &workHeap{}
	t, sum := jobs[0].Submit, 0.0
	i := 0
	for i < len(jobs) || h.Len() > 0 {
		if h.Len() == 0 && t < jobs[i].Submit {
			t = jobs[i].Submit
		}
		for i < len(jobs) && jobs[i].Submit <= t {
			heap.Push(h, rem{work: jobs[i].Work, submit: jobs[i].Submit})
			i++
		}
		top := &(*h)[0]
		done := t + top.work/c
		if i < len(jobs) && jobs[i].Submit < done {
			top.work -= (jobs[i].Submit - t) * c
			t = jobs[i].Submit
			heap.Fix(h, 0)
			continue
		}
		t = done
		sum += t - top.submit
		heap.Pop(h)
	}
	return sum / float64(len(jobs))
}

type rem struct{ work, submit float64 }

// workHeap is a min-heap of remaining work.
type workHeap []rem

func (h workHeap) Len() int           { return len(h) }
func (h workHeap) Less(a, b int) bool { return h[a].work < h[b].work }
func (h workHeap) Swap(a, b int)      { h[a], h[b] = h[b], h[a] }
func (h *workHeap) Push(x any)        { *h = append(*h, x.(rem)) }
func (h *workHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Compare runs each mode over trace with o (Mode replaced), with the time
// series (RunSeries), and the oracle's Bound for ModeOracle, in the order
// given.
func Compare(trace []TraceJob, modes []Mode, o Options) ([]*Report, error) {
	var out []*Report
	for _, m := range modes {
		var rep *Report
		var err error
		if m == ModeOracle {
			fleet := o.Fleet
			if fleet == nil {
				fleet = BuildFleet(DefaultFleet(o.Teams))
			}
			capacity := 0
			for _, n := range fleet {
				capacity += n.HealthyAccelerators()
			}
			rep, err = Bound(trace, capacity, o.WindowStart, o.WindowEnd)
		} else {
			mo := o
			mo.Mode = m
			rep, err = RunSeries(trace, mo)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, rep)
	}
	return out, nil
}

package sim

import (
	"fmt"
	"strings"
	"text/tabwriter"
)

// Report is a simulation's outcome. It renders as a table (Table) and as
// JSON (its fields are tagged).
type Report struct {
	Mode string `json:"mode"`
	// Policy is Mode again (the comparison's key); Description says in a
	// line what the policy is (which FIFO, which Kueue settings).
	Policy      string `json:"policy"`
	Description string `json:"description"`
	// Jobs in the trace and Completed by the end; Rejected jobs can never
	// run under the policy (larger than anything their team can get).
	Jobs      int `json:"jobs"`
	Completed int `json:"completed"`
	Rejected  int `json:"rejected"`
	// MeanJCT and JCTP50/P95/P99 (s): job completion time, submission to
	// completion, over completed jobs.
	MeanJCT float64 `json:"meanJCT"`
	JCTP50  float64 `json:"jctP50"`
	JCTP95  float64 `json:"jctP95"`
	JCTP99  float64 `json:"jctP99"`
	// MeanWait (s): mean queueing delay, submission to first admission.
	MeanWait float64 `json:"meanWait"`
	// BusyUtilization and BusyAllocated (%): productive and allocated
	// accelerator-seconds over capacity x makespan (the busy period, from
	// the first submission to the last completion).
	BusyUtilization float64 `json:"busyUtilization"`
	BusyAllocated   float64 `json:"busyAllocated"`
	// Fairness is Jain's index over the teams of QuotaWhileWaiting (the
	// part of its nominal quota a team held while it had jobs waiting):
	// 1 when every team got the same part of its quota while it waited.
	// (Over the whole run every policy that completes every job hands
	// out the same GPU-seconds, so only the waiting periods tell.)
	Fairness float64 `json:"fairness"`
	// Resizes is Grows + Shrinks.
	Resizes int `json:"resizes"`
	// GPUHoursLost to restarts: accelerators held while restarting
	// (restart and resize delays) plus progress lost to preemptions.
	GPUHoursLost float64 `json:"gpuHoursLost"`
	// JCTs are the completed jobs' completion times (s), for the CDF.
	JCTs []float64 `json:"-"`
	// Capacity is the fleet's accelerators.
	Capacity int `json:"capacity"`
	// WindowStart/End (s) is the utilisation window.
	WindowStart float64 `json:"windowStart"`
	WindowEnd   float64 `json:"windowEnd"`
	// Makespan (s) from the first submission to the last completion.
	Makespan float64 `json:"makespan"`
	// Utilization is productive accelerator-seconds (restart delays
	// excluded) over capacity x window, in percent.
	Utilization float64 `json:"utilization"`
	// Allocated is allocated accelerator-seconds over capacity x window, in percent.
	Allocated float64 `json:"allocated"`
	// WaitP50/P95 (s): submission to first admission, over started jobs.
	WaitP50 float64 `json:"waitP50"`
	WaitP95 float64 `json:"waitP95"`
	// Reclaim latency (s): from the moment a pending job's demand fits its
	// team's nominal quota (counting the team's running jobs and earlier
	// pending jobs) to the job running productively (restart delay
	// included); over ReclaimSamples such jobs.
	ReclaimP95     float64 `json:"reclaimP95"`
	ReclaimMax     float64 `json:"reclaimMax"`
	ReclaimSamples int     `json:"reclaimSamples"`
	// Preemptions, Shrinks and Grows count engine decisions.
	Preemptions int `json:"preemptions"`
	Shrinks     int `json:"shrinks"`
	Grows       int `json:"grows"`
	// Moves counts single-node jobs moved to defragment for guaranteed demand.
	Moves int `json:"moves"`
	// Cycles is the number of engine cycles; EngineMillis their total time.
	Cycles       int     `json:"cycles"`
	EngineMillis float64 `json:"engineMillis"`
	// RestartDelay (s) charged for every planned change.
	RestartDelay float64       `json:"restartDelay"`
	Teams        []*TeamReport `json:"teams"`
	// Series is the time series (RunSeries only).
	Series *Series `json:"series,omitempty"`
}

// TeamReport is one team's part of a Report.
type TeamReport struct {
	Team    string `json:"team"`
	Nominal int    `json:"nominal"`
	Jobs    int    `json:"jobs"`
	// Completed jobs, Rejected jobs and jobs that NeverStarted.
	Completed    int `json:"completed"`
	Rejected     int `json:"rejected,omitempty"`
	NeverStarted int `json:"neverStarted"`
	// AvgAllocated is the team's mean allocated accelerators over the window;
	// OfNominal and OfFleet relate it to its quota and to the fleet (%).
	AvgAllocated   float64 `json:"avgAllocated"`
	OfNominal      float64 `json:"ofNominal"`
	OfFleet        float64 `json:"ofFleet"`
	WaitP50        float64 `json:"waitP50"`
	WaitP95        float64 `json:"waitP95"`
	ReclaimP95     float64 `json:"reclaimP95"`
	ReclaimMax     float64 `json:"reclaimMax"`
	ReclaimSamples int     `json:"reclaimSamples"`
	Preempted      int     `json:"preempted"`
	Shrunk         int     `json:"shrunk"`
	Grown          int     `json:"grown"`

	allocGS float64
	// QuotaWhileWaiting (%) is the time-averaged part of its nominal quota
	// the team held while it had jobs waiting (100: it always held its
	// quota when it wanted more).
	QuotaWhileWaiting float64 `json:"quotaWhileWaiting"`

	allAlloc  float64
	waitT     float64
	waitQuota float64
	waits     []float64
	reclaims  []float64
}

// Table renders the report for people.
func (r *Report) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "mode %s: %d jobs (%d completed, %d rejected), %d accelerators, window %s..%s, makespan %s\n",
		r.Mode, r.Jobs, r.Completed, r.Rejected, r.Capacity, dur(r.WindowStart), dur(r.WindowEnd), dur(r.Makespan))
	if r.Description != "" {
		fmt.Fprintf(&b, "policy: %s\n", r.Description)
	}
	fmt.Fprintf(&b, "JCT mean %s p50 %s p95 %s p99 %s; queueing delay mean %s; busy period %.1f%% productive, %.1f%% allocated; fairness %.3f; %.1f GPU-hours lost to restarts\n",
		dur(r.MeanJCT), dur(r.JCTP50), dur(r.JCTP95), dur(r.JCTP99), dur(r.MeanWait), r.BusyUtilization, r.BusyAllocated, r.Fairness, r.GPUHoursLost)
	fmt.Fprintf(&b, "utilization %.1f%% productive, %.1f%% allocated; wait p50 %s p95 %s; reclaim p95 %s max %s (%d samples)\n",
		r.Utilization, r.Allocated, dur(r.WaitP50), dur(r.WaitP95), dur(r.ReclaimP95), dur(r.ReclaimMax), r.ReclaimSamples)
	fmt.Fprintf(&b, "preemptions %d, shrinks %d, grows %d, moves %d; %d engine cycles (%.0f ms); restart delay %s\n\n",
		r.Preemptions, r.Shrinks, r.Grows, r.Moves, r.Cycles, r.EngineMillis, dur(r.RestartDelay))
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "TEAM\tNOMINAL\tJOBS\tDONE\tAVG USED\t% NOMINAL\t% FLEET\tWAIT P50\tWAIT P95\tRECLAIM P95\tRECLAIM MAX\tPREEMPTED\tSHRUNK\tGROWN\t")
	for _, t := range r.Teams {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t\n",
			t.Team, t.Nominal, t.Jobs, t.Completed, t.AvgAllocated, t.OfNominal, t.OfFleet,
			dur(t.WaitP50), dur(t.WaitP95), dur(t.ReclaimP95), dur(t.ReclaimMax), t.Preempted, t.Shrunk, t.Grown)
	}
	w.Flush()
	return b.String()
}

func dur(s float64) string {
	switch {
	case s < 120:
		return fmt.Sprintf("%.0fs", s)
	case s < 2*3600:
		return fmt.Sprintf("%.1fm", s/60)
	case s < 2*86400:
		return fmt.Sprintf("%.1fh", s/3600)
	}
	return fmt.Sprintf("%.1fd", s/86400)
}

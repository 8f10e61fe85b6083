package policy

import (
	"math"
	"testing"
	"time"
)

// The baselines' rules, each written from the documentation of the system
// it models (Kueue's ClusterQueue, Cohort and Preemption concepts; AWS
// Batch's fair-share scheduling policies).

func kq(name string, nominal int, borrow, lend *int) Team {
	return Team{Name: name, Cohort: "c", Quotas: []FlavorQuota{{Flavor: h100, Nominal: nominal, BorrowingLimit: borrow, LendingLimit: lend}}}
}

func running(st State, names ...string) State {
	d := Kueue(st, KueueConfig{})
	for _, a := range d.Allocations {
		for _, n := range names {
			if a.Job == n {
				st.Allocations = append(st.Allocations, a)
			}
		}
	}
	return st
}

func at(job Job, sec int) Job {
	job.SubmitTime = t0.Add(time.Duration(sec) * time.Second)
	return job
}

func kinds(d Decision) map[string]string {
	out := map[string]string{}
	for _, r := range d.Reasons {
		out[r.Job] = string(r.Kind) + "/" + string(r.Code)
	}
	return out
}

func TestKueueRules(t *testing.T) {
	nodes := mkNodes("n", 4, 8) // 32 accelerators
	for _, tc := range []struct {
		rule string
		kc   KueueConfig
		st   func() State
		fifo bool
		want map[string]string
	}{
		{
			// "borrowingLimit: how much quota a ClusterQueue can borrow
			// from the cohort": a (8 + 8) admits two of its three jobs.
			rule: "BorrowingLimit", kc: KueueConfig{},
			st: func() State {
				return State{Now: t0, Nodes: nodes, Teams: []Team{kq("a", 8, ip(8), nil), kq("b", 24, nil, nil)},
					Jobs: []Job{at(job("a1", "a", 50, 1, 1, false), 1), at(job("a2", "a", 50, 1, 1, false), 2), at(job("a3", "a", 50, 1, 1, false), 3)}}
			},
			want: map[string]string{"a1": "Admitted/WithinQuota", "a2": "Admitted/Borrowing", "a3": "Pending/BorrowingLimit"},
		},
		{
			// "lendingLimit: the most quota a ClusterQueue lends to the
			// cohort": b lends 8 of its 24, so a gets 8 + 8.
			rule: "LendingLimit", kc: KueueConfig{},
			st: func() State {
				return State{Now: t0, Nodes: nodes, Teams: []Team{kq("a", 8, nil, nil), kq("b", 24, nil, ip(8))},
					Jobs: []Job{at(job("a1", "a", 50, 1, 1, false), 1), at(job("a2", "a", 50, 1, 1, false), 2), at(job("a3", "a", 50, 1, 1, false), 3)}}
			},
			want: map[string]string{"a1": "Admitted/WithinQuota", "a2": "Admitted/Borrowing", "a3": "Pending/CohortExhausted"},
		},
		{
			// "reclaimWithinCohort: Any: a pending workload that fits
			// within its nominal quota preempts borrowing workloads of
			// the cohort", the most recently admitted first.
			rule: "ReclaimWithinCohort", kc: KueueConfig{ReclaimWithinCohort: KueueAny},
			st: func() State {
				st := State{Now: t0, Nodes: nodes, Teams: []Team{kq("a", 8, nil, nil), kq("b", 24, nil, nil)},
					Jobs: []Job{at(job("a1", "a", 50, 1, 1, false), 1), at(job("a2", "a", 50, 1, 1, false), 2), at(job("a3", "a", 50, 1, 1, false), 3), at(job("a4", "a", 50, 1, 1, false), 4)}}
				st = running(st, "a1", "a2", "a3", "a4")
				for i := range st.Allocations {
					st.Allocations[i].Since = t0.Add(time.Duration(i) * time.Second)
				}
				st.Now = t0.Add(time.Minute)
				st.Jobs = append(st.Jobs, at(job("b1", "b", 50, 1, 1, false), 60))
				return st
			},
			want: map[string]string{"a1": "Running/", "a2": "Running/", "a3": "Running/", "a4": "Preempted/Reclaim", "b1": "Admitted/Reclaim"},
		},
		{
			// reclaimWithinCohort: Never (Kueue's default): b waits.
			rule: "ReclaimWithinCohortNever", kc: KueueConfig{},
			st: func() State {
				st := State{Now: t0, Nodes: nodes, Teams: []Team{kq("a", 8, nil, nil), kq("b", 24, nil, nil)},
					Jobs: []Job{job("a1", "a", 50, 4, 4, false)}}
				st = running(st, "a1")
				st.Jobs = append(st.Jobs, at(job("b1", "b", 50, 1, 1, false), 60))
				return st
			},
			want: map[string]string{"a1": "Running/", "b1": "Pending/CohortExhausted"},
		},
		{
			// "BestEffortFIFO: when a workload can't be admitted, the
			// next ones in the queue are tried".
			rule: "BestEffortFIFOSkipsBlockedHead", kc: KueueConfig{Queueing: BestEffortFIFO},
			st: func() State {
				return State{Now: t0, Nodes: nodes, Teams: []Team{kq("a", 16, ip(0), nil), kq("b", 16, nil, ip(0))},
					Jobs: []Job{at(job("a1", "a", 50, 1, 1, false), 1), at(job("a2", "a", 50, 2, 2, false), 2), at(job("a3", "a", 50, 1, 1, false), 3)}}
			},
			want: map[string]string{"a1": "Admitted/WithinQuota", "a2": "Pending/BorrowingLimit", "a3": "Admitted/WithinQuota"},
		},
		{
			// "StrictFIFO: the head blocks the queue".
			rule: "StrictFIFOBlocksBehindHead", kc: KueueConfig{Queueing: StrictFIFO},
			st: func() State {
				return State{Now: t0, Nodes: nodes, Teams: []Team{kq("a", 16, ip(0), nil), kq("b", 16, nil, ip(0))},
					Jobs: []Job{at(job("a1", "a", 50, 1, 1, false), 1), at(job("a2", "a", 50, 2, 2, false), 2), at(job("a3", "a", 50, 1, 1, false), 3)}}
			},
			want: map[string]string{"a1": "Admitted/WithinQuota", "a2": "Pending/BorrowingLimit", "a3": "Pending/StrictFIFO"},
		},
		{
			// "withinClusterQueue: LowerPriority: preempt lower-priority
			// workloads of the same ClusterQueue".
			rule: "WithinClusterQueueLowerPriority", kc: KueueConfig{WithinClusterQueue: KueueLowerPriority},
			st: func() State {
				st := State{Now: t0, Nodes: nodes, Teams: []Team{kq("a", 8, ip(0), nil), kq("b", 24, nil, nil)},
					Jobs: []Job{job("lo", "a", 10, 1, 1, false)}}
				st = running(st, "lo")
				st.Jobs = append(st.Jobs, at(job("hi", "a", 90, 1, 1, false), 60))
				return st
			},
			want: map[string]string{"lo": "Preempted/PriorityPreemption", "hi": "Admitted/PriorityPreemption"},
		},
		{
			// The fixed FIFO: a job larger than its team's quota is
			// rejected; the queue behind it goes on.
			rule: "FIFORejectsWhatNeverFits", fifo: true,
			st: func() State {
				return State{Now: t0, Nodes: nodes, Teams: []Team{kq("a", 8, nil, nil), kq("b", 24, nil, nil)},
					Jobs: []Job{at(job("big", "a", 50, 2, 2, false), 1), at(job("a2", "a", 50, 1, 1, false), 2), at(job("a3", "a", 50, 1, 1, false), 3)}}
			},
			want: map[string]string{"big": "Invalid/QuotaExceeded", "a2": "Admitted/WithinQuota", "a3": "Pending/BorrowingLimit"},
		},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			var d Decision
			if tc.fifo {
				d = FIFO(tc.st())
			} else {
				d = Kueue(tc.st(), tc.kc)
			}
			got := kinds(d)
			for j, w := range tc.want {
				if got[j] != w {
					t.Errorf("%s: %s, want %s (all: %v)", j, got[j], w, got)
				}
			}
		})
	}
}

func oneGPUJobs(team string, n int) []Job {
	var out []Job
	for i := 0; i < n; i++ {
		out = append(out, at(frac(team+string(rune('0'+i)), team, 50, 1), i))
	}
	return out
}

func admittedPerTeam(d Decision) map[string]int {
	out := map[string]int{}
	for _, r := range d.Reasons {
		if r.Kind == KindAdmitted {
			out[r.Team]++
		}
	}
	return out
}

func TestBatchFairShareRules(t *testing.T) {
	nodes := mkNodes("n", 1, 8)
	teams := []Team{mkTeam("a", 4), mkTeam("b", 4)}
	decay := time.Hour
	jobs := append(oneGPUJobs("a", 8), oneGPUJobs("b", 8)...)
	for _, tc := range []struct {
		rule  string
		teams []Team
		bc    BatchConfig
		usage BatchUsage
		jobs  []Job
		want  map[string]int
	}{
		// "A value of zero indicates that only current usage is
		// measured": equal shares split the fleet.
		{rule: "NoDecayCurrentUsageOnly", teams: teams, bc: BatchConfig{}, usage: BatchUsage{"a": 1e9}, want: map[string]int{"a": 4, "b": 4}},
		// "Shares with a higher aggregate usage are less likely to be
		// assigned resources": a's recent usage (4 accelerators over the
		// decay window) gives b the first four.
		{rule: "ShareDecayRecentUsageCounts", teams: teams, bc: BatchConfig{ShareDecay: decay}, usage: BatchUsage{"a": 4 * decay.Seconds()}, want: map[string]int{"a": 2, "b": 6}},
		// "weightFactor 0.125 gets eight times the resources of 1":
		// weight 3 (weightFactor 1/3) gets three times as much.
		{rule: "WeightFactor", teams: []Team{{Name: "a", Weight: 3, Quotas: teams[0].Quotas}, teams[1]}, bc: BatchConfig{}, want: map[string]int{"a": 6, "b": 2}},
		// "computeReservation 50 reserves 50 % with one active share
		// identifier": a alone gets half the fleet while b is idle.
		{rule: "ComputeReservation", teams: teams, jobs: oneGPUJobs("a", 8), bc: BatchConfig{ComputeReservation: 50}, want: map[string]int{"a": 4}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			js := jobs
			if tc.jobs != nil {
				js = tc.jobs
			}
			d := BatchFairShare(State{Now: t0, Nodes: nodes, Teams: tc.teams, Jobs: js}, tc.bc, tc.usage)
			got := admittedPerTeam(d)
			for team, w := range tc.want {
				if got[team] != w {
					t.Errorf("team %s got %d, want %d (%v)", team, got[team], w, got)
				}
			}
		})
	}
}

// The share decay: usage halves after decay x ln 2 with nothing running,
// and past usage stops counting after many decay windows.
func TestBatchShareDecay(t *testing.T) {
	u := BatchUsage{"a": 1000}
	got := DecayUsage(u, nil, 3600*math.Ln2, time.Hour)
	if math.Abs(got["a"]-500) > 1e-6 || u["a"] != 1000 {
		t.Fatalf("decayed %v (input %v)", got, u)
	}
	got = DecayUsage(u, []Allocation{{Team: "b", Size: 1, AcceleratorsPerNode: 8}}, 10, time.Hour)
	if got["b"] < 79 || got["b"] > 80 {
		t.Fatalf("8 accelerators for 10 s: %v", got)
	}
	old := DecayUsage(BatchUsage{"a": 4 * 3600}, nil, 20*3600, time.Hour)
	d := BatchFairShare(State{Now: t0, Nodes: mkNodes("n", 1, 8), Teams: []Team{mkTeam("a", 4), mkTeam("b", 4)},
		Jobs: append(oneGPUJobs("a", 8), oneGPUJobs("b", 8)...)}, BatchConfig{ShareDecay: time.Hour}, old)
	if got := admittedPerTeam(d); got["a"] != 4 || got["b"] != 4 {
		t.Fatalf("after 20 decay windows the old usage should not count: %v", got)
	}
}

// No preemption in AWS Batch: a share that arrives late waits for
// capacity even far below its fair share.
func TestBatchFairShareNeverPreempts(t *testing.T) {
	st := State{Now: t0, Nodes: mkNodes("n", 1, 8), Teams: []Team{mkTeam("a", 4), mkTeam("b", 4)}, Jobs: oneGPUJobs("a", 8)}
	d := BatchFairShare(st, BatchConfig{}, nil)
	st.Allocations = d.Allocations
	st.Jobs = append(st.Jobs, oneGPUJobs("b", 2)...)
	d = BatchFairShare(st, BatchConfig{}, nil)
	got := kinds(d)
	for _, r := range d.Reasons {
		if r.Kind == KindPreempted {
			t.Fatalf("preempted: %v", got)
		}
	}
	if got["b0"] != "Pending/NoCapacity" || len(d.Allocations) != 8 {
		t.Fatalf("%v", got)
	}
}

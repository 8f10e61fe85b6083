package sim

import (
	"encoding/json"
	"path/filepath"
	"testing"
)

// On the public Philly trace (examples/traces), every policy completes
// every job (the fixed FIFO rejects none: the teams' quotas cover their
// largest jobs), the JSON carries the comparison's keys, and no policy
// beats the oracle's bound.
func TestPublicTraceEveryPolicyCompletesEveryJob(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every policy over 3,307 jobs and 98 days")
	}
	dir := filepath.Join("..", "..", "examples", "traces")
	trace, err := LoadTrace(filepath.Join(dir, "philly-4vc.csv"))
	if err != nil {
		t.Fatal(err)
	}
	tf, err := LoadTeams(filepath.Join(dir, "philly-4vc-teams.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	reps, err := Compare(trace, Modes, Options{Teams: tf.Teams, Fleet: BuildFleet(tf.Fleet), RestartDelay: 1.74, ResizeDelay: 0.14, CheckpointInterval: 600})
	if err != nil {
		t.Fatal(err)
	}
	bound := reps[len(reps)-1]
	for _, r := range reps {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"policy", "jobs", "completed", "meanJCT", "utilization"} {
			if _, ok := m[k]; !ok {
				t.Errorf("%s: no %q in %s", r.Policy, k, b[:200])
			}
		}
		if r.Jobs != len(trace) || r.Completed != r.Jobs {
			t.Errorf("%s completed %d of %d jobs (%d rejected)", r.Policy, r.Completed, r.Jobs, r.Rejected)
		}
		if r.MeanJCT < bound.MeanJCT || r.Makespan < bound.Makespan || r.BusyUtilization > bound.BusyUtilization+1e-6 || r.Utilization > bound.Utilization+1e-6 {
			t.Errorf("%s beats the bound: meanJCT %.0f (bound %.0f), makespan %.0f (%.0f)", r.Policy, r.MeanJCT, bound.MeanJCT, r.Makespan, bound.Makespan)
		}
		t.Logf("%-16s meanJCT %8.0f s p95 %8.0f s wait %8.0f s util %.1f%% busy %.1f%% fairness %.3f preemptions %d resizes %d lost %.1f GPU-h",
			r.Policy, r.MeanJCT, r.JCTP95, r.MeanWait, r.Utilization, r.BusyUtilization, r.Fairness, r.Preemptions, r.Resizes, r.GPUHoursLost)
	}
}

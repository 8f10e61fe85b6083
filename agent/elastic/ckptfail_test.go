package elastic

import (
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
)

func TestLostSteps(t *testing.T) {
	for _, tc := range []struct {
		rule              string
		failed, committed int64
		want              string
	}{
		{"nothing committed: from step 0", 12, -1, "the job restarts from step 0: 12 steps lost"},
		{"steps after the last commit are lost", 12, 10, "the job resumes from step 10, the last committed checkpoint: 2 steps lost"},
		{"the failed step is committed already: nothing lost", 10, 10, "step 10 is committed already: no step lost"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := lostSteps(tc.failed, tc.committed); got != tc.want {
				t.Errorf("lostSteps(%d, %d) = %q, want %q", tc.failed, tc.committed, got, tc.want)
			}
		})
	}
}

func TestPlannedCheckpointFailed(t *testing.T) {
	retry := func(d time.Duration) control.Advice {
		return control.Advice{Action: control.AdviceRetry, RetryAfter: d}
	}
	for _, tc := range []struct {
		rule string
		v    ckptFailView
		want control.Advice
	}{
		{"a periodic save's error stands", ckptFailView{Planned: false, InProcess: true, Survivors: true, Tries: 1}, control.Advice{}},
		{"in process with survivors: go on with the state in memory", ckptFailView{Planned: true, InProcess: true, Survivors: true, Tries: 1}, control.Advice{Action: control.AdviceGoOn}},
		{"in process, no survivors (preemption): retry", ckptFailView{Planned: true, InProcess: true, Survivors: false, Tries: 1}, retry(time.Second)},
		{"restart path: the first failure is retried after a pause", ckptFailView{Planned: true, Survivors: true, Tries: 1}, retry(time.Second)},
		{"restart path: each retry waits longer", ckptFailView{Planned: true, Survivors: true, Tries: 2}, retry(2 * time.Second)},
		{"retries spent: stop", ckptFailView{Planned: true, Survivors: true, Tries: maxSaveRetries + 1}, control.Advice{}},
		{"time enough before the graceful timeout: retry", ckptFailView{Planned: true, Survivors: true, Tries: 1, TimeLeft: 10 * time.Second}, retry(time.Second)},
		{"too little time before the graceful timeout: stop", ckptFailView{Planned: true, Survivors: true, Tries: 1, TimeLeft: 1500 * time.Millisecond}, control.Advice{}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got, why := plannedCheckpointFailed(tc.v); got != tc.want {
				t.Errorf("plannedCheckpointFailed(%+v) = %+v (%s), want %+v", tc.v, got, why, tc.want)
			}
		})
	}
}

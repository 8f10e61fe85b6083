package fleet

import (
	"math"
	"testing"
	"time"
)

// WorkerRestarts.Restarting's rules, one row each (and their edges).
func TestWorkerRestartsRestartingRules(t *testing.T) {
	now := time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)
	const none = time.Duration(math.MinInt64) // no time recorded
	// rec is a record of count restarts, the last one last ago, and a
	// checkpoint ckpt ago.
	rec := func(count int64, last, ckpt time.Duration) *WorkerRestarts {
		w := &WorkerRestarts{Count: count, LastRound: 4, LastNode: "n1", LastError: "worker 0 exited 1"}
		if last != none {
			w.LastTime = now.Add(-last)
		}
		if ckpt != none {
			w.CheckpointTime = now.Add(-ckpt)
		}
		return w
	}
	for _, tc := range []struct {
		rule     string
		w        *WorkerRestarts
		finished bool
		want     bool
	}{
		{RuleRestartsFinished, rec(3, time.Second, none), true, false},
		{RuleRestartsNone, nil, false, false},
		{RuleRestartsNone, rec(0, time.Second, none), false, false}, // a failure not counted (a lost member)
		{RuleRestartsTimeUnknown, rec(2, none, none), false, false},
		{RuleRestartsCheckpoint, rec(2, time.Minute, 10*time.Second), false, false},
		{RuleRestartsRecent, rec(2, time.Minute, 2*time.Minute), false, true}, // the checkpoint is older than the failure
		{RuleRestartsRecent, rec(1, 0, none), false, true},
		{RuleRestartsRecent, rec(1, RestartingWindow-time.Nanosecond, none), false, true},
		{RuleRestartsRecent, rec(1, -time.Minute, none), false, true},        // the node's clock is ahead
		{RuleRestartsRecent, rec(45, time.Second, time.Second), false, true}, // a checkpoint at the failure's instant is not after it
		{RuleRestartsSettled, rec(1, RestartingWindow, none), false, false},
		{RuleRestartsSettled, rec(7, time.Hour, none), false, false},
	} {
		got, rule := tc.w.Restarting(tc.finished, now)
		if got != tc.want || rule != tc.rule {
			t.Errorf("%s: Restarting(%+v, finished %v) = %v by rule %s", tc.rule, tc.w, tc.finished, got, rule)
		}
	}
}

// JobOfRestartsKey names the job of a restart count's key only.
func TestJobOfRestartsKey(t *testing.T) {
	k := NewKeys("")
	for _, tc := range []struct {
		name, key, job string
		ok             bool
	}{
		{"a restart count", k.Restarts("train-1"), "train-1", true},
		{"the counted round", k.RestartsCounted("train-1"), "", false},
		{"a rendezvous key", k.Rdzv("train-1").Head, "", false},
		{"a job named restarts' checkpoint", k.Checkpoint("restarts"), "", false},
		{"no job", k.JobsPrefix() + "/restarts", "", false},
		{"another prefix", NewKeys("/other").Restarts("train-1"), "", false},
	} {
		if job, ok := k.JobOfRestartsKey(tc.key); job != tc.job || ok != tc.ok {
			t.Errorf("%s: JobOfRestartsKey(%q) = %q %v", tc.name, tc.key, job, ok)
		}
	}
}

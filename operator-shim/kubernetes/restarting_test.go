package kubernetes

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

// A job whose workers hyperpodrun restarted recently (issue 24: a crash
// loop inside hyperpodrun showed Running with nothing about it) is
// Running with reason Restarting, the count in status.restarts and the
// last error in the message; an old restart, a checkpoint since, a
// finished job and a refused pod keep their own reason. The message
// names the failure's time, not its age, so a steady status is not
// rewritten at every resync.
func TestStatusShowsHyperpodrunsWorkerRestarts(t *testing.T) {
	within := &fleet.Status{Reason: api.Reason{Job: "llama", Kind: api.KindRunning, Code: api.CodeWithinQuota, Message: "within quota"}}
	restarts := func(last, ckpt time.Duration) *fleet.WorkerRestarts {
		w := &fleet.WorkerRestarts{Count: 3, MaxRestarts: 5, LastRound: 7, LastNode: "b", LastError: "worker 1 exited 1\n[default1]:OSError: [Errno 28] No space left on device",
			LastTime: t0.Add(-last)}
		if ckpt > 0 {
			w.CheckpointTime = t0.Add(-ckpt)
		}
		return w
	}
	base := func(w *fleet.WorkerRestarts) StatusInput {
		return StatusInput{Desired: desired(1, "a"), Decision: within, Pods: []PodView{running("pa", "a")}, Restarts: 3, WorkerRestarts: w, Now: t0}
	}
	for _, tc := range []struct {
		rule          string
		in            StatusInput
		phase, reason string
		message       string
	}{
		{"a recent restart is Restarting", base(restarts(time.Minute, 0)), v1alpha1.PhaseRunning, ReasonRestarting,
			"hyperpodrun restarted the workers after failures 3 time(s) of maxRestarts 5, the last at 2025-12-31T23:59:00Z (round 7 on b): worker 1 exited 1"},
		{"an old restart is not", base(restarts(time.Hour, 0)), v1alpha1.PhaseRunning, string(api.CodeWithinQuota), "within quota"},
		{"a checkpoint since is progress", base(restarts(time.Minute, time.Second)), v1alpha1.PhaseRunning, string(api.CodeWithinQuota), "within quota"},
		{"no restart record", base(nil), v1alpha1.PhaseRunning, string(api.CodeWithinQuota), "within quota"},
		{"a finished job shows its outcome", func() StatusInput {
			in := base(restarts(time.Minute, 0))
			in.Finish = &fleet.Finish{Outcome: fleet.Failed, Message: "budget spent", Time: t0}
			return in
		}(), v1alpha1.PhaseFailed, fleet.Failed, "budget spent"},
		{"a refused pod says so first", func() StatusInput {
			in := base(restarts(time.Minute, 0))
			in.PodError = errors.New("quota exceeded")
			return in
		}(), v1alpha1.PhaseRunning, ReasonPodCreateFailed, "quota exceeded"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			s := ComputeStatus(job(nil), v1alpha1.ElasticJobStatus{}, tc.in)
			if s.Phase != tc.phase || s.Reason != tc.reason || !strings.HasPrefix(s.Message, tc.message) || (s.Phase == v1alpha1.PhaseRunning && s.Restarts != 3) {
				t.Errorf("got %s %s %q (restarts %d), want %s %s %q", s.Phase, s.Reason, s.Message, s.Restarts, tc.phase, tc.reason, tc.message)
			}
			in := tc.in
			in.Now = t0.Add(30 * time.Second)
			if s2 := ComputeStatus(job(nil), s, in); s2.Message != s.Message {
				t.Errorf("the message changed with time alone: %q -> %q", s.Message, s2.Message)
			}
		})
	}
}

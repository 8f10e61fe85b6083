package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// A planned change whose checkpoint could not be saved counts no restart,
// but describe says what it cost (issue 24: a planned change never loses
// steps without saying so in the job's status), in text and in JSON.
func TestDescribeShowsAPlannedChangesFailedCheckpoint(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ep := strings.Join(srv.Endpoints, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	for _, name := range []string{"shrunk", "calm"} {
		if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: name, Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 2},
			Run: fleet.RunSpec{Script: "train.py", MaxRestarts: 4}}); err != nil {
			t.Fatal(err)
		}
	}
	detail := "rank 0 could not save the checkpoint of step 14 (OSError: [Errno 28] No space left on device); the job resumes from step 10, the last committed checkpoint: 4 steps lost; the save was tried 3 times"
	if err := st.PutCheckpointFailure(ctx, "shrunk", fleet.CheckpointFailure{Round: 1, Node: "node-b", Step: 14, Committed: 10, LostSteps: 4,
		Detail: detail, Time: time.Date(2026, 11, 26, 2, 32, 18, 0, time.UTC)}); err != nil {
		t.Fatal(err)
	}
	out := mustCtl(t, ep, "describe", "job", "shrunk")
	for _, want := range []string{
		"Failed checkpoint: the planned change of round 1 on node-b at 2026-11-26T02:32:18Z (4 steps lost):\n",
		"            " + detail + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("describe job shrunk lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Restarts:") {
		t.Errorf("a planned change's failed checkpoint shows as a restart:\n%s", out)
	}
	if out := mustCtl(t, ep, "describe", "job", "calm"); strings.Contains(out, "Failed checkpoint") {
		t.Errorf("a job whose checkpoints never failed shows one:\n%s", out)
	}
	js := mustCtl(t, ep, "describe", "job", "shrunk", "-o", "json")
	if !strings.Contains(js, `"checkpointFailure"`) || !strings.Contains(js, `"lostSteps": 4`) {
		t.Errorf("describe -o json lacks the failed checkpoint:\n%s", js)
	}
}

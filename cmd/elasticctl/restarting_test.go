package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// A job whose hyperpodrun keeps failing on a node (a crash loop) used to
// show Running with no reason: get jobs now shows it Restarting with its
// count, and describe shows the count and the last error. A finished job
// shows its outcome, whatever a node still says.
func TestCrashLoopingJobShowsRestarting(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ep := strings.Join(srv.Endpoints, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	for _, name := range []string{"looping", "healthy", "done"} {
		if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: name, Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
			Run: fleet.RunSpec{Script: "train.py", MaxRestarts: 5}}); err != nil {
			t.Fatal(err)
		}
	}
	// The records as the coordinator writes them from node-a's reports.
	for _, p := range []fleet.Problem{
		{Job: "looping", Node: "node-a", Message: "restarting on node node-a: hyperpodrun failed 3 time(s) in a row (maxRestarts 5); last: exited with status 1: cannot create log dir",
			Restarts: 3, LastError: "exited with status 1: cannot create log dir", Time: time.Now().UTC()},
		{Job: "healthy", Node: "node-a", Message: "containerd is down", Time: time.Now().UTC()},
		{Job: "done", Node: "node-a", Message: "restarting", Restarts: 6, LastError: "exited with status 1", Time: time.Now().UTC()},
	} {
		op, err := st.PutProblemOp(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Do(ctx, op); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.RecordFinish(ctx, "done", fleet.Finish{Outcome: fleet.Failed, Node: "node-a", Message: "hyperpodrun failed 6 time(s) in a row", Time: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	out := mustCtl(t, ep, "get", "jobs")
	for _, re := range []string{
		`(?m)^looping\s+t\s+\d+\s+Restarting\s+0\s+1:1\s+Restarts:3\s`,
		`(?m)^healthy\s+t\s+\d+\s+Submitted\s`,
		`(?m)^done\s+t\s+\d+\s+Failed\s`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("get jobs does not match %s:\n%s", re, out)
		}
	}
	if out := mustCtl(t, ep, "get", "jobs", "-l", "state=Restarting", "-o", "name"); strings.TrimSpace(out) != "job/looping" {
		t.Errorf("get jobs -l state=Restarting: %q", out)
	}
	out = mustCtl(t, ep, "describe", "job", "looping")
	for _, re := range []string{
		`(?m)^State:\s+Restarting$`,
		`(?m)^Restarts:\s+3 in a row on node-a \(maxRestarts 5\)$`,
		`(?m)^Last error: exited with status 1: cannot create log dir$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("describe job looping does not match %s:\n%s", re, out)
		}
	}
}

// A crash-looping job shows Restarting in every listing, not only the
// whole table: named (get jobs NAME) and in the watch, which prints the row
// again when a node's problem record appears.
func TestNamedAndWatchedJobsShowRestarting(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ep := strings.Join(srv.Endpoints, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "looping", Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
		Run: fleet.RunSpec{Script: "train.py", MaxRestarts: 5}}); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var w syncBuffer
	done := watchCtl(wctx, ep, &w, "get", "jobs", "-w", "looping")
	testutil.Eventually(t, 15*time.Second, "the watch to print the job", func() (bool, string) {
		return strings.Contains(w.String(), "Submitted"), w.String()
	})

	op, err := st.PutProblemOp(fleet.Problem{Job: "looping", Node: "node-a", Restarts: 3, LastError: "exited with status 1",
		Message: "restarting on node node-a: hyperpodrun failed 3 time(s) in a row (maxRestarts 5); last: exited with status 1", Time: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Txn(ctx).Then(op).Commit(); err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^looping\s+t\s+\d+\s+Restarting\s+0\s+1:1\s+Restarts:3\s`)
	testutil.Eventually(t, 15*time.Second, "the watch to print looping Restarting", func() (bool, string) {
		return row.MatchString(w.String()), w.String()
	})
	if out := mustCtl(t, ep, "get", "jobs", "looping"); !row.MatchString(out) {
		t.Errorf("get jobs looping does not show it Restarting:\n%s", out)
	}
	stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not stop")
	}
}

// A job whose workers keep failing restarts inside its hyperpodruns, not
// through a node agent, so no problem record shows it: describe reads the
// count hyperpodrun holds against --max-restarts and the last round's
// failure report (issue 24: a crash loop shows its count and last error).
// A malformed failure record is named, never a crash.
func TestDescribeShowsHyperpodrunsRestartsAndLastError(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ep := strings.Join(srv.Endpoints, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	for _, name := range []string{"flaky", "calm", "garbled"} {
		if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: name, Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 2},
			Run: fleet.RunSpec{Script: "train.py", MaxRestarts: 4}}); err != nil {
			t.Fatal(err)
		}
	}
	k := st.Keys
	summary := "[default0]:Traceback (most recent call last):\n[default0]:  File \"train.py\", line 9\n[default0]:OSError: [Errno 28] No space left on device"
	puts := map[string]string{
		k.Restarts("flaky"):          "3",
		k.Rdzv("flaky").Failure(6):   `{"node":"node-a","detail":"worker 0 exited 1","summary":"old failure"}`,
		k.Rdzv("flaky").Failure(7):   `{"node":"node-b","detail":"worker 1 exited 1","summary":` + strconv.Quote(summary) + `}`,
		k.Restarts("garbled"):        "1",
		k.Rdzv("garbled").Failure(2): `{not json`,
	}
	for key, v := range puts {
		if _, err := cli.Put(ctx, key, v); err != nil {
			t.Fatal(err)
		}
	}
	out := mustCtl(t, ep, "describe", "job", "flaky")
	for _, want := range []string{
		"Restarts:   3 of maxRestarts 4 (workers restarted by hyperpodrun after failures)",
		"Last error: round 7 on node-b:",
		"            worker 1 exited 1\n            [default0]:Traceback",
		"            [default0]:OSError: [Errno 28] No space left on device",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("describe job flaky lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "old failure") {
		t.Errorf("describe job flaky shows an older round's failure, not the last:\n%s", out)
	}
	if out := mustCtl(t, ep, "describe", "job", "calm"); strings.Contains(out, "Restarts:") || strings.Contains(out, "Last error:") {
		t.Errorf("a job that never restarted shows restarts:\n%s", out)
	}
	if out := mustCtl(t, ep, "describe", "job", "garbled"); !strings.Contains(out, "Last error: round 2:") || !strings.Contains(out, "malformed failure record at") {
		t.Errorf("a malformed failure record is not named:\n%s", out)
	}
	js := mustCtl(t, ep, "describe", "job", "flaky", "-o", "json")
	if !strings.Contains(js, `"workerRestarts"`) || !strings.Contains(js, `"lastNode": "node-b"`) {
		t.Errorf("describe -o json lacks the restarts:\n%s", js)
	}
}

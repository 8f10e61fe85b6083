package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Issue 24: a job whose workers fail inside hyperpodrun's restart budget
// restarts inside hyperpodrun, where no node agent's problem record sees
// it, and get jobs showed it Running. It now shows Restarting with the
// count while the last restart is recent: here a real rendezvous node of
// the job reports two failures (the records hyperpodrun writes: the
// failure reports and the restart count). A job that committed a
// checkpoint since its failure, or whose failure is old, shows Running;
// the restarting job shows Failed once hyperpodrun fails it.
func TestGetJobsShowsHyperpodrunsWorkerRestarts(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ep := strings.Join(srv.Endpoints, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	k := st.Keys
	put := func(key string, v any) {
		t.Helper()
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, key, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"flaky", "recovered", "old", "calm"} {
		// Admitted and running on node-a, as the coordinator writes it.
		submitPlaced(ctx, t, st, cli, name, "t", "node-a", "train.py", true)
	}

	// flaky: its hyperpodrun's rendezvous node sees its workers fail
	// twice, and restarts them each time.
	n, err := rendezvous.New(cli, rendezvous.Config{JobID: "flaky", NodeID: "node-a", Addr: "127.0.0.1", LocalWorldSize: 1, MinNodes: 1, MaxNodes: 1,
		LeaseTTL: 3 * time.Second, LastCallTimeout: 300 * time.Millisecond, AckTimeout: time.Second, JoinTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	r, err := n.Join(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := n.ReportFailure(ctx, r, fmt.Sprintf("worker 0 exited 1 (failure %d)", i+1), "[default0]:RuntimeError: boom"); err != nil {
			t.Fatal(err)
		}
		if r, err = n.Join(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if c, err := n.Restarts(ctx); err != nil || c != 2 {
		t.Fatalf("the rendezvous counted %d restart(s) (%v), want 2", c, err)
	}
	// recovered: it failed a minute ago and committed a checkpoint since;
	// old: it failed an hour ago.
	now := time.Now().UTC()
	for job, ago := range map[string]time.Duration{"recovered": time.Minute, "old": time.Hour} {
		if _, err := cli.Put(ctx, k.Restarts(job), "1"); err != nil {
			t.Fatal(err)
		}
		put(k.Rdzv(job).Failure(3), map[string]any{"node": "node-a", "detail": "worker 0 exited 1", "time": now.Add(-ago)})
	}
	put(k.Checkpoint("recovered"), map[string]any{"step": 40, "path": "/ckpt/40", "world_size": 1, "round": 4, "time": now})

	out := mustCtl(t, ep, "get", "jobs")
	for _, re := range []string{
		`(?m)^flaky\s+t\s+\d+\s+Restarting\s+1\s+1:1\s+Restarts:2\s`,
		`(?m)^recovered\s+t\s+\d+\s+Running\s+1\s+1:1\s+WithinQuota\s`,
		`(?m)^old\s+t\s+\d+\s+Running\s+1\s+1:1\s+WithinQuota\s`,
		`(?m)^calm\s+t\s+\d+\s+Running\s+1\s+1:1\s+WithinQuota\s`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("get jobs does not match %s:\n%s", re, out)
		}
	}
	wide := mustCtl(t, ep, "get", "jobs", "flaky", "-o", "wide")
	if !regexp.MustCompile(`(?m)^flaky\s.*Restarting.*hyperpodrun restarted the workers after failures 2 time\(s\) of maxRestarts 5, the last \d+s ago \(round \d+ on node-a\): worker 0 exited 1 \(failure 2\)$`).MatchString(wide) {
		t.Errorf("get jobs flaky -o wide does not say why:\n%s", wide)
	}
	if out := mustCtl(t, ep, "get", "jobs", "-l", "state=Restarting", "-o", "name"); strings.TrimSpace(out) != "job/flaky" {
		t.Errorf("get jobs -l state=Restarting: %q", out)
	}
	var rows []jobView
	if err := json.Unmarshal([]byte(mustCtl(t, ep, "get", "jobs", "-o", "json")), &rows); err != nil {
		t.Fatal(err)
	}
	for _, v := range rows {
		if v.Spec.Name == "flaky" && (v.WorkerRestarts == nil || v.WorkerRestarts.Count != 2 || v.WorkerRestarts.MaxRestarts != 5 || v.WorkerRestarts.LastTime.IsZero()) {
			t.Errorf("get jobs -o json: flaky's workerRestarts %+v", v.WorkerRestarts)
		}
	}
	if out := mustCtl(t, ep, "describe", "job", "flaky"); !regexp.MustCompile(`(?m)^State:\s+Restarting$`).MatchString(out) ||
		!strings.Contains(out, "Restarts:   2 of maxRestarts 5") {
		t.Errorf("describe job flaky:\n%s", out)
	}

	// hyperpodrun fails the job when its budget is spent: its outcome
	// shows, not Restarting.
	if err := st.RecordFinish(ctx, "flaky", fleet.Finish{Outcome: fleet.Failed, Node: "node-a", Message: "restart budget spent", Time: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if out := mustCtl(t, ep, "get", "jobs", "flaky"); !regexp.MustCompile(`(?m)^flaky\s+t\s+\d+\s+Failed\s`).MatchString(out) {
		t.Errorf("a failed job does not show Failed:\n%s", out)
	}
}

// The crash loop for real: hyperpodrun (built from this module) runs a
// 1-node job on etcd whose worker exits 1 twice and then trains; get jobs
// shows the job Restarting with the two restarts hyperpodrun counted, and
// -o wide the worker's failure.
func TestGetJobsShowsARealCrashLoopRestarting(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ep := strings.Join(srv.Endpoints, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "hyperpodrun")
	if b, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/hyperpodrun/hyperpodrun/cmd/hyperpodrun").CombinedOutput(); err != nil {
		t.Fatalf("go build hyperpodrun: %v\n%s", err, b)
	}
	worker := filepath.Join(dir, "worker.sh")
	script := `#!/bin/sh
n=$(cat "$0.attempts" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$0.attempts"
if [ $n -le 2 ]; then echo "attempt $n: boom" >&2; exit 1; fi
exec sleep 60
`
	if err := os.WriteFile(worker, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	st := fleet.New(cli, "")
	submitPlaced(ctx, t, st, cli, "looping", "t", "node-a", worker, false)
	cmd := exec.CommandContext(ctx, bin, "--nnodes", "1", "--nproc-per-node", "1", "--rdzv-backend", "etcd", "--rdzv-endpoint", srv.Endpoints[0],
		"--rdzv-id", "looping", "--max-restarts", "5", "--no-python", worker)
	cmd.Env = append(os.Environ(), "HYPERPODRUN_NODE_ID=node-a")
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("hyperpodrun:\n%s", logs.String())
		}
	}()
	row := regexp.MustCompile(`(?m)^looping\s+t\s+\d+\s+Restarting\s+1\s+1:1\s+Restarts:2\s`)
	waitFor(t, "get jobs to show looping Restarting after two restarts", func() (bool, string) {
		out, _, _ := ctl(t, ep, "get", "jobs")
		return row.MatchString(out), out
	})
	if wide := mustCtl(t, ep, "get", "jobs", "looping", "-o", "wide"); !strings.Contains(wide, "hyperpodrun restarted the workers after failures 2 time(s) of maxRestarts 5, the last") {
		t.Errorf("get jobs -o wide does not say why:\n%s", wide)
	}
}

// get jobs -w prints a job again when hyperpodrun's restarts make it
// Restarting (they are not under the prefixes the watch follows: it polls
// them), and again when its last restart grows old and it is Running.
func TestWatchedJobTurnsRestartingAndBack(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ep := strings.Join(srv.Endpoints, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	k := st.Keys
	submitPlaced(ctx, t, st, cli, "looping", "t", "node-a", "train.py", true)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var w syncBuffer
	done := watchCtl(wctx, ep, &w, "get", "jobs", "-w")
	running := regexp.MustCompile(`(?m)^looping\s+t\s+\d+\s+Running\s+1\s+1:1\s+WithinQuota\s`)
	testutil.Eventually(t, 15*time.Second, "the watch to print the job Running", func() (bool, string) {
		return running.MatchString(w.String()), w.String()
	})
	// Three restarts, the last one 8 s short of RestartingWindow ago.
	report, _ := json.Marshal(map[string]any{"node": "node-a", "detail": "worker 0 exited 1", "time": time.Now().UTC().Add(-fleet.RestartingWindow + 8*time.Second)})
	if _, err := cli.Put(ctx, k.Rdzv("looping").Failure(4), string(report)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, k.Restarts("looping"), "3"); err != nil {
		t.Fatal(err)
	}
	restarting := regexp.MustCompile(`(?m)^looping\s+t\s+\d+\s+Restarting\s+1\s+1:1\s+Restarts:3\s`)
	var at int
	testutil.Eventually(t, 2*restartsPoll+5*time.Second, "the watch to print looping Restarting", func() (bool, string) {
		loc := restarting.FindStringIndex(w.String())
		if loc != nil {
			at = loc[1]
		}
		return loc != nil, w.String()
	})
	testutil.Eventually(t, 8*time.Second+2*restartsPoll+5*time.Second, "the watch to print looping Running again once its restart is old", func() (bool, string) {
		return running.MatchString(w.String()[at:]), w.String()
	})
	stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not stop")
	}
}

// A team's user may not read jobs/ (the members' lease ids are there): its
// get jobs lists the job without the restarts and without a warning
// (Running: its desired record, with no status record, implies it); root
// sees it Restarting.
func TestTeamUserListsJobsWithoutRestarts(t *testing.T) {
	ep, cli := startFleet(t, 1)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	k := st.Keys
	submitPlaced(ctx, t, st, cli, "sweep", "research", "node-0", "train.py", false)
	report, _ := json.Marshal(map[string]any{"node": "node-0", "detail": "worker 0 exited 1", "time": time.Now().UTC()})
	for key, v := range map[string]string{k.Restarts("sweep"): "2", k.Rdzv("sweep").Failure(3): string(report)} {
		if _, err := cli.Put(ctx, key, v); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "pw")
	mustCtl(t, ep, "auth", "bootstrap", "--password-dir", dir)
	as := func(user string) []string {
		return []string{"--etcd-user", user, "--etcd-password-file", filepath.Join(dir, user+".password")}
	}
	out, errs, code := ctl(t, ep, append(as("hyperpod-team-research"), "get", "jobs")...)
	if code != 0 || errs != "" || !regexp.MustCompile(`(?m)^sweep\s+research\s+\d+\s+Running\s+1\s`).MatchString(out) {
		t.Errorf("research's get jobs: exit %d, stderr %q:\n%s", code, errs, out)
	}
	out, errs, code = ctl(t, ep, append(as("root"), "get", "jobs")...)
	if code != 0 || !regexp.MustCompile(`(?m)^sweep\s+research\s+\d+\s+Restarting\s+1\s+1:1\s+Restarts:2\s`).MatchString(out) {
		t.Errorf("root's get jobs: exit %d, stderr %q:\n%s", code, errs, out)
	}
}

// submitPlaced submits job (one node of one accelerator, maxRestarts 5,
// running script) for team and writes the coordinator's desired record
// placing it on node (which alone implies Running at 1 node:
// fleet.ImpliedStatus); running also writes the coordinator's status of
// it running within quota.
func submitPlaced(ctx context.Context, t *testing.T, st *fleet.Store, cli *clientv3.Client, job, team, node, script string, running bool) {
	t.Helper()
	if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: job, Team: team, PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
		Run: fleet.RunSpec{Script: script, MaxRestarts: 5}}); err != nil {
		t.Fatal(err)
	}
	records := map[string]any{
		st.Keys.Desired(job): fleet.Desired{Allocation: api.Allocation{Job: job, Team: team, Size: 1, Nodes: []string{node}, Since: time.Now().UTC()}, Generation: 1},
	}
	if running {
		records[st.Keys.Status(job)] = fleet.Status{Reason: api.Reason{Job: job, Team: team, Kind: api.KindRunning, Code: api.CodeWithinQuota, Message: "ok", ToSize: 1}}
	}
	for key, v := range records {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, key, string(b)); err != nil {
			t.Fatal(err)
		}
	}
}

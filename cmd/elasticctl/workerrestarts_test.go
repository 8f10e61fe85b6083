package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
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
		if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: name, Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
			Run: fleet.RunSpec{Script: "train.py", MaxRestarts: 5}}); err != nil {
			t.Fatal(err)
		}
		// Admitted and running on node-a, as the coordinator writes it.
		put(k.Desired(name), fleet.Desired{Allocation: api.Allocation{Job: name, Team: "t", Size: 1, Nodes: []string{"node-a"}, Since: time.Now().UTC()}, Generation: 1})
		put(k.Status(name), fleet.Status{Reason: api.Reason{Job: name, Team: "t", Kind: api.KindRunning, Code: api.CodeWithinQuota, Message: "ok", ToSize: 1}})
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

package jobrunner

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest/authfleet"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// A node's own etcd user may not read jobs/ (the members' lease ids are
// the jobs' secrets, issue 22), yet the runner must know a placed job's
// global restart count: it reads it as the job, with the credentials the
// coordinator put in the job's assignment on this node. Here the job's
// restart budget is already spent (9 restarts, maxRestarts 5): its first
// node failure fails it with that reason. Reading as the node, the count
// is refused and the job would be restarted instead.
func TestRunnerReadsAJobsKeysAsTheJob(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	af := authfleet.Start(t, etcdauth.Parties{Teams: []string{"t"}, Nodes: []string{"node-a"}})
	k, as, endpoint := af.Keys, af.As, af.Endpoint
	root := as(etcdauth.RootUser)
	rst := fleet.New(root, "")
	const maxRestarts = 5
	if err := rst.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
		Run: fleet.RunSpec{Script: "/bin/true", NoPython: true, MaxRestarts: maxRestarts}}); err != nil {
		t.Fatal(err)
	}
	creds, err := etcdauth.Mint(ctx, root, k, "j")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := root.Put(ctx, k.Restarts("j"), "9"); err != nil {
		t.Fatal(err)
	}
	d := fleet.Desired{Allocation: policy.Allocation{Job: "j", Size: 1, Nodes: []string{"node-a"}}, Generation: 1}
	dop, err := rst.PutDesiredOp(d)
	if err != nil {
		t.Fatal(err)
	}
	aop, err := rst.PutAssignmentRecordOp("node-a", fleet.Assignment{Job: "j", Generation: 1, Creds: creds})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := root.Txn(ctx).Then(dop, aop).Commit(); err != nil {
		t.Fatal(err)
	}

	out := sharedDir(t)
	hpr := filepath.Join(out, "hyperpodrun")
	os.WriteFile(hpr, []byte("#!/bin/sh\necho x >> "+out+"/runs\nexit 1\n"), 0o755)
	tmp, err := os.MkdirTemp("", "hpa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	nodeCli := as(etcdauth.NodeRole("node-a"))
	if _, _, err := fleet.New(nodeCli, "").Restarts(ctx, "j"); !fleet.IsPermissionDenied(err) {
		t.Fatalf("node-a's own user reads the job's restart count: %v; want permission denied", err)
	}
	r := New(Config{Hyperpodrun: hpr, Endpoints: []string{endpoint}, Output: io.Discard, AllowRootJobs: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		TempDir: tmp, CgroupParent: NoCgroup, BackoffBase: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		r.Run(rctx, nodeagent.Node{Name: "node-a", Prefix: "/hyperpodrun", Client: nodeCli})
		close(done)
	}()
	defer func() { stop(); <-done }()

	var fin fleet.Finish
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ok bool
		if fin, ok = finishOf(t, ctx, rst, "j"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the job never finished")
		}
	}
	if fin.Outcome != fleet.Failed || !strings.Contains(fin.Message, "the job's 9 restart(s) exceed maxRestarts 5") {
		t.Errorf("finish %+v: want Failed because the job's global budget (read as the job) is spent", fin)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "runs")); strings.Count(string(b), "\n") != 1 {
		t.Errorf("hyperpodrun ran %d times, want once", strings.Count(string(b), "\n"))
	}
}

// An agent killed with SIGKILL leaves its host-process runs' directories
// (each with a job's etcd password file) under --job-run-dir: its jobs die
// with it, nobody removes them. The next agent of that node does, at
// start, and leaves other nodes' runs and containers' runs (adopted, still
// running) alone.
func TestAgentRemovesTheRunsAKilledAgentLeft(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, cli := etcdtest.Start(t)
	base, err := os.MkdirTemp("", "hpa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	os.Chmod(base, 0o711)
	stale := filepath.Join(base, processRunPrefix("node-a")+"123")
	keep := []string{filepath.Join(base, processRunPrefix("node-b")+"1"), filepath.Join(base, containerRunPrefix("node-a")+"9")}
	for _, d := range append([]string{stale}, keep...) {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "etcd.password"), []byte("secret\n"), 0o600)
	}
	os.Symlink("/etc", filepath.Join(stale, "link"))
	r := New(Config{Hyperpodrun: "/bin/false", Endpoints: srv.Endpoints, Output: io.Discard, AllowRootJobs: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		TempDir: base, CgroupParent: NoCgroup})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(rctx, nodeagent.Node{Name: "node-a", Prefix: "/hyperpodrun", Client: cli}); close(done) }()
	defer func() { stop(); <-done }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Lstat(stale); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stale run directory %s is still there", stale)
		}
	}
	for _, d := range keep {
		if _, err := os.Stat(filepath.Join(d, "etcd.password")); err != nil {
			t.Errorf("%s was removed: %v", d, err)
		}
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Errorf("the link in the stale run was followed: %v", err)
	}
}

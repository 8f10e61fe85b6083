package podsup

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

func TestPlaced(t *testing.T) {
	run := &fleet.Desired{Allocation: api.Allocation{Job: "j", Size: 2, Nodes: []string{"a", "b"}}}
	stop := &fleet.Desired{Allocation: api.Allocation{Job: "j"}, Stop: &fleet.Stop{Kind: fleet.StopShutdown}}
	for _, tc := range []struct {
		d    *fleet.Desired
		node string
		want bool
	}{{nil, "a", true}, {run, "a", true}, {run, "c", false}, {stop, "a", false}} {
		if got := Placed(tc.d, tc.node); got != tc.want {
			t.Errorf("Placed(%+v, %s) = %v", tc.d, tc.node, got)
		}
	}
}

// child is a stand-in for hyperpodrun: SIGUSR2 makes it exit 0 (as a
// drained hyperpodrun does), SIGTERM exit 143; it writes a file once it
// has its handlers, and otherwise sleeps.
const child = `trap 'echo drained; exit 0' USR2; trap 'exit 143' TERM; touch "$1"; while :; do sleep 0.05; done`

func start(t *testing.T, cfg Config) (ready string, done chan int) {
	dir := t.TempDir()
	ready = filepath.Join(dir, "ready")
	cfg.Argv = []string{"/bin/sh", "-c", child, "sh", ready}
	done = make(chan int, 1)
	go func() {
		code, err := Run(context.Background(), cfg)
		if err != nil {
			t.Error(err)
		}
		done <- code
	}()
	waitFile(t, ready)
	return ready, done
}

func waitFile(t *testing.T, p string) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(p); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", p)
}

func put(t *testing.T, st *fleet.Store, d fleet.Desired) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	op, err := st.PutDesiredOp(d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Cli.Do(ctx, op); err != nil {
		t.Fatal(err)
	}
}

func wait(t *testing.T, done chan int, what string) int {
	select {
	case c := <-done:
		return c
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the supervisor did not return", what)
	}
	return -1
}

// A real etcd and a real child process: the child keeps running while
// the allocation lists its node, is drained (SIGUSR2) when a shrink leaves
// the node out, and its exit 0 is recorded as "drained".
func TestDrainWhenTheNodeLeavesTheAllocation(t *testing.T) {
	_, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	put(t, st, fleet.Desired{Allocation: api.Allocation{Job: "j", Size: 2, Nodes: []string{"a", "b"}}, Generation: 1})
	term := filepath.Join(t.TempDir(), "termination-log")
	_, done := start(t, Config{Etcd: cli, Job: "j", Node: "b", TerminationLog: term})
	// Still allocated (a grow keeps it): no drain.
	put(t, st, fleet.Desired{Allocation: api.Allocation{Job: "j", Size: 3, Nodes: []string{"a", "b", "c"}}, Generation: 2})
	select {
	case c := <-done:
		t.Fatalf("exited %d while its node is allocated", c)
	case <-time.After(500 * time.Millisecond):
	}
	put(t, st, fleet.Desired{Allocation: api.Allocation{Job: "j", Size: 2, Nodes: []string{"a", "c"}}, Generation: 3})
	if c := wait(t, done, "shrink"); c != 0 {
		t.Fatalf("exit %d after a drain, want 0", c)
	}
	if b, err := os.ReadFile(term); err != nil || string(b) != DrainedMessage {
		t.Fatalf("termination message %q (%v), want %q", b, err, DrainedMessage)
	}
}

// A stopped job (preempted, suspended, deleted) drains every pod.
func TestDrainWhenStopped(t *testing.T) {
	_, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	put(t, st, fleet.Desired{Allocation: api.Allocation{Job: "j", Size: 1, Nodes: []string{"a"}}, Generation: 3})
	term := filepath.Join(t.TempDir(), "termination-log")
	_, done := start(t, Config{Etcd: cli, Job: "j", Node: "a", TerminationLog: term})
	put(t, st, fleet.Desired{Allocation: api.Allocation{Job: "j"}, Generation: 4, Stop: &fleet.Stop{Kind: fleet.StopPreemption, Reason: "team a reclaimed"}})
	if c := wait(t, done, "stopped"); c != 0 {
		t.Fatalf("exit %d", c)
	}
	if b, err := os.ReadFile(term); err != nil || string(b) != DrainedMessage {
		t.Fatalf("termination message %q (%v), want %q", b, err, DrainedMessage)
	}
}

// A pod that starts when the record already stops the job, or no longer
// lists its node, does not start hyperpodrun at all: it exits 0 at once,
// drained. Started and signalled at once, the child could take the
// SIGUSR2 before it handles it (a shell dies of it, exit 140; hyperpodrun
// would ignore it and never drain).
func TestNotStartedWhenAlreadyStoppedOrMoved(t *testing.T) {
	_, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	for _, d := range []fleet.Desired{
		{Allocation: api.Allocation{Job: "j"}, Generation: 4, Stop: &fleet.Stop{Kind: fleet.StopPreemption, Reason: "team a reclaimed"}},
		{Allocation: api.Allocation{Job: "j", Size: 1, Nodes: []string{"b"}}, Generation: 5},
	} {
		put(t, st, d)
		dir := t.TempDir()
		ran, term := filepath.Join(dir, "ran"), filepath.Join(dir, "termination-log")
		code, err := Run(context.Background(), Config{Etcd: cli, Job: "j", Node: "a", TerminationLog: term,
			Argv: []string{"/bin/sh", "-c", child, "sh", ran}})
		if err != nil || code != 0 {
			t.Fatalf("generation %d: code %d err %v, want 0", d.Generation, code, err)
		}
		if _, err := os.Stat(ran); err == nil {
			t.Errorf("generation %d: hyperpodrun was started for a node the job is not on", d.Generation)
		}
		if b, err := os.ReadFile(term); err != nil || string(b) != DrainedMessage {
			t.Errorf("generation %d: termination message %q (%v), want %q", d.Generation, b, err, DrainedMessage)
		}
	}
}

// Not drained: the child's own exit status comes back, and no
// "drained" message is written (the controller reads exit 0 without it as
// the job's success).
func TestExitStatusPassesThrough(t *testing.T) {
	_, cli := etcdtest.Start(t)
	term := filepath.Join(t.TempDir(), "termination-log")
	code, err := Run(context.Background(), Config{Etcd: cli, Job: "j", Node: "a", TerminationLog: term, Argv: []string{"/bin/sh", "-c", "exit 3"}})
	if err != nil || code != 3 {
		t.Fatalf("code %d err %v", code, err)
	}
	code, _ = Run(context.Background(), Config{Etcd: cli, Job: "j", Node: "a", TerminationLog: term, Argv: []string{"/bin/sh", "-c", "exit 0"}})
	if _, err := os.Stat(term); code != 0 || err == nil {
		t.Fatalf("code %d, termination log written: %v", code, err)
	}
	if _, err := Run(context.Background(), Config{Etcd: cli, Argv: []string{"/nonexistent/hyperpodrun"}}); err == nil || !strings.Contains(err.Error(), "start") {
		t.Fatalf("missing program: %v", err)
	}
}

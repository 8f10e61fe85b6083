package jobrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

var (
	buildOnce sync.Once
	builtHPR  string
	buildErr  error
)

// hyperpodrun builds cmd/hyperpodrun once for the package's tests.
func hyperpodrun(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "jobrunner-test-")
		if err != nil {
			buildErr = err
			return
		}
		os.Chmod(dir, 0o755) // the job user of TestJobRunsAsItsUser runs it
		builtHPR = filepath.Join(dir, "hyperpodrun")
		if out, err := exec.Command("go", "build", "-o", builtHPR, "../../../cmd/hyperpodrun").CombinedOutput(); err != nil {
			buildErr = err
			builtHPR = string(out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build hyperpodrun: %v\n%s", buildErr, builtHPR)
	}
	return builtHPR
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtHPR != "" && buildErr == nil {
		os.RemoveAll(filepath.Dir(builtHPR))
	}
	os.Exit(code)
}

// fixture is one node agent's runner on node-a with one job "j", placed
// on node-a, whose worker is a shell script.
type fixture struct {
	t    *testing.T
	ctx  context.Context
	dir  string // the worker's $OUT
	tmp  string // the runner's TempDir
	st   *fleet.Store
	cli  *clientv3.Client
	r    *Runner
	out  *syncBuf
	logs *syncBuf
}

// newFixture starts the runner with cgroupParent (NoCgroup for the
// fallback) and a job running worker, with maxRestarts.
func newFixture(t *testing.T, worker string, maxRestarts int, cgroupParent string) *fixture {
	return newFixtureOn(t, worker, maxRestarts, cgroupParent, nil)
}

// newFixtureOn is newFixture with the restart backoff on clk (nil: the
// real clock).
func newFixtureOn(t *testing.T, worker string, maxRestarts int, cgroupParent string, clk *clocktesting.FakeClock) *fixture {
	var backoffClock clock.WithDelayedExecution
	if clk != nil {
		backoffClock = clk
	}
	hpr := hyperpodrun(t)
	f := &fixture{t: t, dir: t.TempDir(), out: &syncBuf{}, logs: &syncBuf{}}
	// Short: the control socket's path must fit in 107 bytes.
	tmp, err := os.MkdirTemp("", "hpa")
	if err != nil {
		t.Fatal(err)
	}
	f.tmp = tmp
	t.Cleanup(func() { os.RemoveAll(tmp) })
	w := filepath.Join(f.dir, "w.sh")
	os.WriteFile(w, []byte(worker), 0o755)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	f.ctx = ctx
	srv, cli := etcdtest.Start(t)
	f.cli = cli
	f.st = fleet.New(cli, "")
	if err := f.st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
		Run: fleet.RunSpec{Script: w, NoPython: true, MaxRestarts: maxRestarts, Env: map[string]string{"OUT": f.dir}, GracefulTimeoutSeconds: 5}}); err != nil {
		t.Fatal(err)
	}
	f.r = New(Config{Hyperpodrun: hpr, Endpoints: srv.Endpoints, RdzvConf: "lease_ttl=2", Output: f.out, AllowRootJobs: true,
		Logger: slog.New(slog.NewTextHandler(f.logs, nil)), TempDir: tmp, CgroupParent: cgroupParent,
		BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second, Clock: backoffClock})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		f.r.Run(rctx, nodeagent.Node{Name: "node-a", Prefix: "/hyperpodrun", Client: cli})
		close(done)
	}()
	t.Cleanup(func() { stop(); <-done })
	if err := f.st.Place(ctx, fleet.Desired{Allocation: policy.Allocation{Job: "j", Size: 1, Nodes: []string{"node-a"}}, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	return f
}

// waitFor polls cond until it holds, failing the test after 45 s with the
// output and the runner's log.
func (f *fixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	testutil.Eventually(f.t, 45*time.Second, what, func() (bool, string) {
		if cond() {
			return true, ""
		}
		return false, fmt.Sprintf("\noutput:\n%s\nrunner log:\n%s", f.out.String(), f.logs.String())
	})
}

// runs counts the worker's starts (lines of $OUT/runs).
func (f *fixture) runs() int {
	b, _ := os.ReadFile(filepath.Join(f.dir, "runs"))
	return strings.Count(string(b), "\n")
}

// hyperpodrunPID is the running hyperpodrun's pid, 0 if none runs.
func (f *fixture) hyperpodrunPID() int {
	f.r.mu.Lock()
	defer f.r.mu.Unlock()
	if p := f.r.jobs["j"]; p != nil {
		return p.cmd.Process.Pid
	}
	return 0
}

// finish is the job's finish record, nil if none.
func (f *fixture) finish() *fleet.Finish {
	fin, ok := finishOf(f.t, f.ctx, f.st, "j")
	if !ok {
		return nil
	}
	return &fin
}

// finishOf is a job's finish: the coordinator's record, else a node
// agent's report of it (no coordinator runs in these tests).
func finishOf(t *testing.T, ctx context.Context, st *fleet.Store, job string) (fleet.Finish, bool) {
	t.Helper()
	fin, _, err := st.Finished(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if x, ok := fin[job]; ok {
		return x, true
	}
	var rep fleet.Finish
	if ok := nodeReport(t, ctx, st, fleet.ReportFinished, job, &rep); ok {
		return rep, true
	}
	return fleet.Finish{}, false
}

// problemOf is a node's problem record of a job: the coordinator's copy,
// else the node agent's report of it; ok is false when there is none (or
// the report says it is cleared).
func problemOf(t *testing.T, ctx context.Context, st *fleet.Store, job, node string) (fleet.Problem, bool) {
	t.Helper()
	ps, _, err := st.Problems(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Node == node {
			return p, true
		}
	}
	var p fleet.Problem
	if ok := nodeReport(t, ctx, st, fleet.ReportProblem, job, &p); ok && !p.Cleared && p.Node == node {
		return p, true
	}
	return fleet.Problem{}, false
}

// nodeReport decodes any node's report of kind about job into v.
func nodeReport(t *testing.T, ctx context.Context, st *fleet.Store, kind, job string, v any) bool {
	t.Helper()
	r, err := st.Cli.Get(ctx, st.Keys.ReportsPrefix(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range r.Kvs {
		if _, k, j, ok := st.Keys.ReportOwner(string(kv.Key)); ok && k == kind && j == job {
			return json.Unmarshal(kv.Value, v) == nil
		}
	}
	return false
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	p, ok := readProc(pid)
	return ok && !p.zombie
}

// A worker that counts its starts and runs until killed.
const loopWorker = `#!/bin/sh
echo "$$" >> "$OUT/runs"
while :; do sleep 0.05; done
`

// SIGTERM to a node's hyperpodrun is a node failure, not the job's: the
// runner restarts it, the worker runs again and the job is not Failed.
func TestSIGTERMToHyperpodrunRestartsIt(t *testing.T) {
	f := newFixture(t, loopWorker, 1, "")
	f.waitFor("the worker", func() bool { return f.runs() == 1 })
	pid := f.hyperpodrunPID()
	if pid == 0 {
		t.Fatal("no hyperpodrun runs")
	}
	syscall.Kill(pid, syscall.SIGTERM)
	f.waitFor("the worker to run again", func() bool { return f.runs() == 2 })
	if p := f.hyperpodrunPID(); p == pid || p == 0 {
		t.Errorf("hyperpodrun pid %d after the restart, want a new one (was %d)", p, pid)
	}
	if fin := f.finish(); fin != nil {
		t.Errorf("a node's SIGTERMed hyperpodrun ended the job: %+v", *fin)
	}
	if !strings.Contains(f.logs.String(), "killed by terminated") && !strings.Contains(f.logs.String(), "exited with status") {
		t.Errorf("the runner did not log why it restarted hyperpodrun:\n%s", f.logs.String())
	}
}

// A worker that daemonizes a grandchild (new session, new process group,
// holding the worker's stdout) and runs until killed.
const daemonWorker = `#!/bin/sh
echo "$$" >> "$OUT/runs"
n=$(wc -l < "$OUT/runs")
setsid sh -c 'echo $$ > "$OUT/daemon.tmp.'$n'"; mv "$OUT/daemon.tmp.'$n'" "$OUT/daemon.'$n'"; exec sleep 1000' &
while :; do sleep 0.05; done
`

// SIGKILL of a node's hyperpodrun: the runner restarts it, and nothing of
// the killed run is left: not its daemonized grandchild (setsid), not its
// control directory. Both with cgroups and with the subreaper fallback.
func TestSIGKILLOfHyperpodrunRestartsItAndLeavesNothing(t *testing.T) {
	for _, mode := range []struct{ name, parent string }{{"cgroup", ""}, {"subreaper", NoCgroup}} {
		t.Run(mode.name, func(t *testing.T) {
			f := newFixture(t, daemonWorker, 1, mode.parent)
			if mode.parent == "" && f.r.box.cgroupBase == "" {
				t.Skip("no writable cgroup v2 here")
			}
			daemon := func(n int) int {
				b, err := os.ReadFile(filepath.Join(f.dir, "daemon."+strconv.Itoa(n)))
				if err != nil {
					return 0
				}
				pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				return pid
			}
			f.waitFor("the worker's daemonized grandchild", func() bool { return daemon(1) != 0 })
			d1 := daemon(1)
			if p, _ := readProc(d1); p.sid != d1 {
				t.Fatalf("the grandchild did not start a session of its own: %+v", p)
			}
			pid := f.hyperpodrunPID()
			var runDirs []string
			f.waitFor("hyperpodrun's control directory", func() bool {
				runDirs, _ = filepath.Glob(filepath.Join(f.tmp, "*", "hyperpodrun-ctl-*"))
				return len(runDirs) == 1
			})
			syscall.Kill(pid, syscall.SIGKILL)
			f.waitFor("the worker to run again", func() bool { return f.runs() == 2 && daemon(2) != 0 })
			if alive(d1) {
				t.Errorf("the killed run's daemonized grandchild %d is still alive", d1)
			}
			if _, err := os.Stat(runDirs[0]); err == nil {
				t.Errorf("the killed run's control directory %s is left", runDirs[0])
			}
			if dirs, _ := filepath.Glob(filepath.Join(f.tmp, "*")); len(dirs) != 1 {
				t.Errorf("run directories %v, want the running one only", dirs)
			}
			if fin := f.finish(); fin != nil {
				t.Errorf("a node's SIGKILLed hyperpodrun ended the job: %+v", *fin)
			}
			// The runner stops (an agent crash): the second run's daemon
			// dies too, and its directory goes.
			d2 := daemon(2)
			f.r.killAll()
			if alive(d2) {
				t.Errorf("the daemonized grandchild %d outlived the runner's kill", d2)
			}
			if dirs, _ := filepath.Glob(filepath.Join(f.tmp, "*")); len(dirs) != 0 {
				t.Errorf("run directories left after the runner stopped: %v", dirs)
			}
		})
	}
}

// Once the runner has stopped (an agent crash, killAll) or drained the
// node, no run starts, even though its loop may still reconcile a job
// that is placed here (it checked before it let r.mu go): a run started
// then would outlive the runner, or the drain, and so would its directory.
func TestNoRunStartsAfterTheRunnerStopsOrDrains(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(t *testing.T, f *fixture)
	}{
		{"killAll", func(_ *testing.T, f *fixture) { f.r.killAll() }},
		{"Drain", func(t *testing.T, f *fixture) {
			if err := f.r.Drain(f.ctx); err != nil {
				t.Fatalf("drain: %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, loopWorker, 1, NoCgroup)
			f.waitFor("the worker", func() bool { return f.runs() == 1 })
			tc.stop(t, f)
			if err := f.r.start(f.ctx, "j"); err != nil {
				t.Fatalf("start after the runner stopped: %v", err)
			}
			f.r.mu.Lock()
			_, running := f.r.jobs["j"]
			f.r.mu.Unlock()
			if running {
				t.Errorf("a run of the job started after %s", tc.name)
			}
			if dirs, _ := filepath.Glob(filepath.Join(f.tmp, "*.p.*")); len(dirs) != 0 {
				t.Errorf("run directories %v after %s, want none", dirs, tc.name)
			}
		})
	}
}

// A job fails only when its global restart budget is spent: the same
// signal that is a node failure while restarts <= maxRestarts marks the
// job Failed once the count exceeds it.
func TestSpentRestartBudgetFailsTheJob(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	f := newFixtureOn(t, loopWorker, 1, "", clk)
	setRestarts := func(n int64) {
		t.Helper()
		ctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
		defer cancel()
		if _, err := f.cli.Put(ctx, f.st.Keys.Restarts("j"), fleet.FormatCount(n)); err != nil {
			t.Fatal(err)
		}
	}
	setRestarts(1) // at the budget, not over it
	f.waitFor("the worker", func() bool { return f.runs() == 1 })
	syscall.Kill(f.hyperpodrunPID(), syscall.SIGKILL)
	f.waitFor("the worker to run again", stepping(clk, time.Second, func() bool { return f.runs() == 2 }))
	if fin := f.finish(); fin != nil {
		t.Fatalf("failed with restarts == maxRestarts: %+v", *fin)
	}
	setRestarts(2)
	syscall.Kill(f.hyperpodrunPID(), syscall.SIGKILL)
	f.waitFor("the job to be Failed", func() bool { fin := f.finish(); return fin != nil })
	fin := f.finish()
	if fin.Outcome != fleet.Failed || !strings.Contains(fin.Message, "2 restart(s) exceed maxRestarts 1") {
		t.Errorf("finish record %+v, want Failed for the spent budget", *fin)
	}
	// Past any backoff (and the hold on a failed run): nothing restarts it.
	started := startedRuns(f.logs.String())
	clk.Step(25 * time.Hour)
	reconciledNow(t, f.r)
	if n := f.runs(); n != 2 || f.hyperpodrunPID() != 0 || startedRuns(f.logs.String()) != started {
		t.Errorf("a Failed job was restarted: %d runs, hyperpodrun %d, %d run(s) started after it failed\n%s", n, f.hyperpodrunPID(), startedRuns(f.logs.String())-started, f.logs.String())
	}
}

// The restart backoff doubles from its base up to its cap.
func TestBackoffDoubles(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{
		{1, time.Second},
		{2, 2 * time.Second},
		{3, 4 * time.Second},
		{4, 8 * time.Second},
		{5, 16 * time.Second},
		{6, 30 * time.Second},
		{7, 30 * time.Second},
		{1000, 30 * time.Second},
	} {
		if got := Backoff(tc.n, time.Second, 30*time.Second); got != tc.want {
			t.Errorf("Backoff(%d, 1s, 30s) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

// A job ends only when every node's part of it is done. The first node
// whose ranks finish used to mark the whole job Succeeded, and the other
// nodes were drained mid-training (the chaos soak found it). Two runners
// (node-a, node-b) run a 2-node job; node-a's worker ends at once, node-b's
// when the test says: the job is Succeeded only then, and node-a's
// hyperpodrun is not started again meanwhile.
func TestJobSucceedsOnlyWhenEveryNodeFinished(t *testing.T) {
	hpr := hyperpodrun(t)
	dir := t.TempDir()
	w := filepath.Join(dir, "w.sh")
	os.WriteFile(w, []byte(`#!/bin/sh
echo x >> "$OUT/runs.$HYPERPODRUN_NODE_ID"
if [ "$HYPERPODRUN_NODE_ID" = node-b ]; then while [ ! -f "$OUT/finish" ]; do sleep 0.02; done; fi
`), 0o755)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 2, MaxNodes: 2},
		Run: fleet.RunSpec{Script: w, NoPython: true, Env: map[string]string{"OUT": dir}}}); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuf{}
	for _, node := range []string{"node-a", "node-b"} {
		tmp, err := os.MkdirTemp("", "hpa")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(tmp) })
		r := New(Config{Hyperpodrun: hpr, Endpoints: srv.Endpoints, RdzvConf: "lease_ttl=2,last_call_timeout=0.2", Output: &syncBuf{}, AllowRootJobs: true,
			Logger: slog.New(slog.NewTextHandler(logs, nil)), TempDir: tmp, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second})
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { r.Run(rctx, nodeagent.Node{Name: node, Prefix: "/hyperpodrun", Client: cli}); close(done) }()
		t.Cleanup(func() { stop(); <-done })
	}
	if err := st.Place(ctx, fleet.Desired{Allocation: policy.Allocation{Job: "j", Size: 2, Nodes: []string{"node-a", "node-b"}}, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	runs := func(node string) int {
		b, _ := os.ReadFile(filepath.Join(dir, "runs."+node))
		return strings.Count(string(b), "\n")
	}
	finished := func() (fleet.Finish, bool) { return finishOf(t, ctx, st, "j") }
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s\n%s", what, logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitUntil("node-a's part to be done", func() bool { return strings.Contains(logs.String(), "the job goes on on other nodes") })
	if fin, ok := finished(); ok {
		t.Fatalf("the job was recorded %s while node-b still trains", fin.Outcome)
	}
	os.WriteFile(filepath.Join(dir, "finish"), nil, 0o644)
	waitUntil("the job's finish record", func() bool { fin, ok := finished(); return ok && fin.Outcome == fleet.Succeeded })
	if a, b := runs("node-a"), runs("node-b"); a != 1 || b != 1 {
		t.Errorf("workers ran %d time(s) on node-a and %d on node-b, want once each", a, b)
	}
}

// A hyperpodrun that exits 1 before it does anything (it cannot make its
// log directory, say) never joins its rendezvous, so the job's global
// restart count never moves: it was restarted forever and the job looked
// Running. Now each failure is a problem record that says the job is
// restarting, how many times and how the last run ended, and once the
// failures in a row pass maxRestarts the job is Failed with that reason.
func TestCrashLoopIsVisibleAndFailsTheJob(t *testing.T) {
	out := sharedDir(t)
	hpr := filepath.Join(out, "hyperpodrun")
	os.WriteFile(hpr, []byte("#!/bin/sh\necho x >> \"$OUT/runs\"\necho \"hyperpodrun: create log dir /logs/j: permission denied\" >&2\nexit 1\n"), 0o755)
	tmp, err := os.MkdirTemp("", "hpa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	const maxRestarts = 2
	if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
		Run: fleet.RunSpec{Script: "/bin/true", NoPython: true, MaxRestarts: maxRestarts, Env: map[string]string{"OUT": out}}}); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuf{}
	// The backoff passes only when the test steps the clock: the record
	// is seen while the job restarts.
	clk := clocktesting.NewFakeClock(time.Now())
	r := New(Config{Hyperpodrun: hpr, Endpoints: srv.Endpoints, Output: &syncBuf{}, AllowRootJobs: true, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		TempDir: tmp, CgroupParent: NoCgroup, BackoffBase: 700 * time.Millisecond, BackoffMax: time.Second, Clock: clk})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(rctx, nodeagent.Node{Name: "node-a", Prefix: "/hyperpodrun", Client: cli}); close(done) }()
	defer func() { stop(); <-done }()
	if err := st.Place(ctx, fleet.Desired{Allocation: policy.Allocation{Job: "j", Size: 1, Nodes: []string{"node-a"}}, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	runs := func() int {
		b, _ := os.ReadFile(filepath.Join(out, "runs"))
		return strings.Count(string(b), "\n")
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		testutil.Eventually(t, 45*time.Second, what, func() (bool, string) { return cond(), "\n" + logs.String() })
	}
	var p fleet.Problem
	waitFor("the job's restarting record", func() bool {
		var ok bool
		p, ok = problemOf(t, ctx, st, "j", "node-a")
		return ok && p.Restarts >= 1
	})
	if !strings.Contains(p.Message, "restarting") || !strings.Contains(p.LastError, "exited with status 1: hyperpodrun: create log dir /logs/j: permission denied") {
		t.Errorf("problem record %+v: want restarting, its count and the last error", p)
	}
	if _, ok := finishOf(t, ctx, st, "j"); ok && p.Restarts <= maxRestarts {
		t.Errorf("the job finished after %d failure(s), maxRestarts %d", p.Restarts, maxRestarts)
	}
	var fin fleet.Finish
	waitFor("the job to be Failed", stepping(clk, time.Second, func() bool {
		var ok bool
		fin, ok = finishOf(t, ctx, st, "j")
		return ok
	}))
	if fin.Outcome != fleet.Failed || !strings.Contains(fin.Message, "failed 3 time(s) in a row on node node-a") || !strings.Contains(fin.Message, "maxRestarts 2") ||
		!strings.Contains(fin.Message, "permission denied") {
		t.Errorf("finish record %+v: want Failed, naming the failures in a row, maxRestarts and the last error", fin)
	}
	if n := runs(); n != maxRestarts+1 {
		t.Errorf("hyperpodrun ran %d time(s), want maxRestarts+1 = %d", n, maxRestarts+1)
	}
	// Past any backoff (and the hold on a failed run): nothing restarts it.
	started := startedRuns(logs.String())
	clk.Step(25 * time.Hour)
	reconciledNow(t, r)
	if n := runs(); n != maxRestarts+1 || startedRuns(logs.String()) != started {
		t.Errorf("a Failed job was restarted: %d runs, %d started after it failed", n, startedRuns(logs.String())-started)
	}
	if p, ok := problemOf(t, ctx, st, "j", "node-a"); ok {
		t.Errorf("a Failed job still shows restarting: %+v", p)
	}
}

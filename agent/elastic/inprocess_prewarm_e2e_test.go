package elastic_test

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// prewarmTotal is the steps of the grow tests: 20 s or more of training at
// 0.05 s a step, most of it after the grow.
const prewarmTotal = 400

// askedRE is train_elastic.py's line of a prewarmed worker asking for its
// first assignment, with its pid and the time (Unix seconds) it asked.
var askedRE = regexp.MustCompile(`\[train_elastic prewarmed pid (\d+)\] torch imported; asking for the first assignment at ([0-9.]+)`)

// Issue 14's grow in process, prewarmed: real DDP (gloo) on 2 nodes, a
// third node added under --inprocess-resize. The joining node starts its
// worker before it registers: the worker imports torch and asks for its
// first assignment, and only then does the node register (so the survivors
// stop only once it is ready). The survivors are not restarted, the
// prewarmed worker is the one that trains at world size 3 (assigned, not
// restarted), every optimizer step runs exactly once with the loss of an
// uninterrupted run, and every worker is gone after the job ends.
func TestInProcessGrowPrewarmsTheJoiningNode(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with PyTorch")
	}
	py := torchPython(t)
	// Long enough that the job is still training when the third node has
	// started Python and torch, even on a loaded machine (several seconds).
	const total = prewarmTotal
	ref := referenceLosses(t, py, total)
	srv, _ := startEtcd(t)
	c := newCluster(t, []string{"PYTHON_EXEC=" + py}, inprocessArgs(srv.Endpoints[0], "inwarm", t.TempDir(), total)...)
	c.start("a")
	c.start("b")
	t0 := time.Now()
	c.waitStep(120*time.Second, "training at world size 2", t0, func(s stepLine) bool { return s.World == 2 && s.Step >= 8 })
	before := map[string][]int{"a": workerPIDs(c.PID("a")), "b": workerPIDs(c.PID("b"))}
	c.start("c")
	c.waitStep(90*time.Second, "training at world size 3", t0, func(s stepLine) bool { return s.World == 3 })
	workersC := workerPIDs(c.PID("c"))
	for _, n := range []string{"a", "b"} {
		if now := workerPIDs(c.PID(n)); len(now) != 1 || len(before[n]) != 1 || now[0] != before[n][0] {
			t.Errorf("node %s has workers %v after the grow, had %v: a survivor was restarted", n, now, before[n])
		}
	}
	// The joining node's worker asked before the node registered.
	var logC string
	for name, l := range c.Logs() {
		if strings.SplitN(name, "#", 2)[0] == "c" {
			logC += l
		}
	}
	m := askedRE.FindStringSubmatch(logC)
	if m == nil {
		t.Fatal("node c's worker did not log asking for its first assignment: it was not prewarmed")
	}
	askedPID, _ := strconv.Atoi(m[1])
	askedUnix, _ := strconv.ParseFloat(m[2], 64)
	asked := time.Unix(0, int64(askedUnix*1e9))
	registering, ok := logTime(logC, `msg="registering with the job's rendezvous"`)
	if !ok {
		t.Fatal("node c did not log its registration")
	}
	// slog writes milliseconds: compare at that precision.
	if asked.Truncate(time.Millisecond).After(registering) {
		t.Errorf("node c's worker asked for its assignment at %s, after the node began registering at %s", asked.Format(time.RFC3339Nano), registering.Format(time.RFC3339Nano))
	}
	if !strings.Contains(logC, "prewarmed_workers=true") {
		t.Error("node c registered without its prewarmed workers")
	}
	t.Logf("node c: worker %d asked at %s, %s before the node registered", askedPID, asked.Format("15:04:05.000"), registering.Sub(asked).Round(time.Millisecond))
	if len(workersC) != 1 || workersC[0] != askedPID {
		t.Errorf("node c trains with workers %v; want the prewarmed worker %d (assigned, not restarted)", workersC, askedPID)
	}
	for _, n := range []string{"a", "b", "c"} {
		if code := c.wait(n, 120*time.Second); code != 0 {
			t.Errorf("node %s exited %d after training finished, want 0", n, code)
		}
	}
	waitGone(t, append(append(before["a"], before["b"]...), workersC...), "workers after the job ended")
	steps := c.allSteps()
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].At.Before(steps[j].At) })
	checkExactlyOnce(t, steps, total, ref)
	logs := c.logText()
	for msg, want := range map[string]int{
		`msg="assigning the prewarmed workers their first round"`: 1, // node c
		`msg="reassigning workers in process"`:                    2, // the survivors
		`msg="starting workers"`:                                  2, // a and b, in the first round
		`msg="prewarming workers`:                                 1, // not in the fresh job's first round
	} {
		if n := strings.Count(logs, msg); n != want {
			t.Errorf("%s logged %d times, want %d", msg, n, want)
		}
	}
	for _, bad := range []string{"escalating", "falling back to a restart", "registering anyway", "without prewarm"} {
		if strings.Contains(logs, bad) {
			t.Errorf("a node logged %q", bad)
		}
	}
	if !strings.Contains(logs, "received the state of step") {
		t.Error("the prewarmed worker did not get the state from a surviving rank")
	}
	if d, ok := downtime(steps, 2, 3); ok {
		t.Logf("in-process grow 2 -> 3, prewarmed: survivors' last step at 2 to first at 3: %s", d.Round(time.Millisecond))
	} else {
		t.Error("no change 2 -> 3 between consecutive steps")
	}
}

// growPrewarmRun runs real DDP on 2 nodes under --inprocess-resize, adds a
// third and waits until training at world size 3 progressed; then every
// node finishes. It checks what must hold whatever became of the prewarm:
// the survivors kept their workers, every optimizer step ran exactly once
// with the uninterrupted run's loss, every node exited 0 and no worker is
// left. It returns node c's log and all the logs.
func growPrewarmRun(t *testing.T, job string, extra []string, train ...string) (string, string) {
	t.Helper()
	py := torchPython(t)
	const total = prewarmTotal
	ref := referenceLosses(t, py, total)
	srv, _ := startEtcd(t)
	args := inprocessArgs(srv.Endpoints[0], job, t.TempDir(), total, train...)
	c := newCluster(t, []string{"PYTHON_EXEC=" + py}, append(extra, args...)...)
	c.start("a")
	c.start("b")
	t0 := time.Now()
	c.waitStep(120*time.Second, "training at world size 2", t0, func(s stepLine) bool { return s.World == 2 && s.Step >= 8 })
	before := map[string][]int{"a": workerPIDs(c.PID("a")), "b": workerPIDs(c.PID("b"))}
	c.start("c")
	c.waitStep(90*time.Second, "training at world size 3", t0, func(s stepLine) bool { return s.World == 3 })
	workersC := workerPIDs(c.PID("c"))
	for _, n := range []string{"a", "b"} {
		if now := workerPIDs(c.PID(n)); len(now) != 1 || len(before[n]) != 1 || now[0] != before[n][0] {
			t.Errorf("node %s has workers %v after the grow, had %v: a survivor was restarted", n, now, before[n])
		}
	}
	for _, n := range []string{"a", "b", "c"} {
		if code := c.wait(n, 120*time.Second); code != 0 {
			t.Errorf("node %s exited %d after training finished, want 0", n, code)
		}
	}
	waitGone(t, append(append(before["a"], before["b"]...), workersC...), "workers after the job ended")
	steps := c.allSteps()
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].At.Before(steps[j].At) })
	checkExactlyOnce(t, steps, total, ref)
	var logC string
	for name, l := range c.Logs() {
		if strings.SplitN(name, "#", 2)[0] == "c" {
			logC += l
		}
	}
	return logC, c.logText()
}

// A prewarmed worker that exits before asking for its assignment (code
// that reads RANK without hyperpodrun_elastic) makes its node give the
// prewarm up: it registers without it and starts its workers after the
// round, as on the restart path; training goes on at world size 3.
func TestInProcessPrewarmGivenUpWhenAWorkerExitsBeforeAsking(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with PyTorch")
	}
	logC, logs := growPrewarmRun(t, "inwarmfail", nil, "--fail-if-prewarmed")
	for _, want := range []string{"RANK is not set; exiting (--fail-if-prewarmed)", "exited before asking for its assignment",
		`msg="registering with the job's rendezvous"`, "prewarmed_workers=false", `msg="starting workers"`} {
		if !strings.Contains(logC, want) {
			t.Errorf("node c did not log %q", want)
		}
	}
	if strings.Contains(logs, "assigning the prewarmed workers their first round") {
		t.Error("prewarmed workers were assigned although the prewarm was given up")
	}
}

// A prewarm that takes longer than --inprocess-prewarm-timeout: the node
// registers anyway, keeping its workers; when the round forms they are
// assigned if they all asked by then, else started afresh. Either way no
// step is lost or repeated and no worker is left.
func TestInProcessPrewarmTimeoutRegistersAnyway(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with PyTorch")
	}
	// Python and torch take over a second to start: 0.2 s always passes.
	logC, _ := growPrewarmRun(t, "inwarmslow", []string{"--inprocess-prewarm-timeout", "0.2"})
	if !strings.Contains(logC, "registering anyway") {
		t.Error("node c did not log registering anyway after the prewarm timeout")
	}
	assigned := strings.Contains(logC, "assigning the prewarmed workers their first round")
	restarted := strings.Contains(logC, "not every prewarmed worker asked for its assignment by the time the round formed")
	if assigned == restarted {
		t.Errorf("node c: prewarmed workers assigned=%v, restarted=%v; want exactly one", assigned, restarted)
	}
	t.Logf("prewarmed workers assigned when the round formed: %v", assigned)
}

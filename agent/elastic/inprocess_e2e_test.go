package elastic_test

import (
	"context"
	"math"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

var stepRE = regexp.MustCompile(`^step=(\d+) world_size=(\d+) loss=([0-9.eE+-]+)$`)

// referenceLosses runs train_elastic.py alone, uninterrupted (one process,
// world size 1, the same global batch), and returns its loss per step.
func referenceLosses(t *testing.T, py string, steps int) map[int]float64 {
	t.Helper()
	cmd := exec.Command(py, repoPath("examples/pytorch/train_elastic.py"), "--steps", itoa(steps), "--ckpt-dir", t.TempDir())
	cmd.Env = append(os.Environ(), "PYTHONPATH="+repoPath("checkpoint/python"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference run: %v", err)
	}
	losses := map[int]float64{}
	for _, line := range strings.Split(string(out), "\n") {
		if m := stepRE.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			n, _ := strconv.Atoi(m[1])
			losses[n], _ = strconv.ParseFloat(m[3], 64)
		}
	}
	if len(losses) != steps {
		t.Fatalf("reference run logged %d steps, want %d:\n%s", len(losses), steps, out)
	}
	return losses
}

// checkExactlyOnce fails unless steps (in time order) are 1..total, each
// once, with the loss of the uninterrupted run.
func checkExactlyOnce(t *testing.T, steps []stepLine, total int, ref map[int]float64) {
	t.Helper()
	want := 1
	for _, s := range steps {
		if s.Step != want {
			t.Fatalf("step %d logged where step %d was expected (world size %d): a step was lost or repeated", s.Step, want, s.World)
		}
		if r := ref[s.Step]; math.Abs(s.Loss-r) > 1e-5+1e-4*r {
			t.Errorf("step %d (world size %d): loss %.6f, the uninterrupted run's %.6f", s.Step, s.World, s.Loss, r)
		}
		want++
	}
	if want-1 != total {
		t.Errorf("ran %d optimizer steps, want %d", want-1, total)
	}
}

func inprocessArgs(endpoint, job, ckptDir string, total int, extra ...string) []string {
	args := []string{"--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
		"--rdzv-endpoint", endpoint, "--rdzv-id", job, "--rdzv-conf", "last_call_timeout=1",
		"--graceful-timeout", "15", "--shutdown-timeout", "3", "--local-addr", "127.0.0.1", "--inprocess-resize",
		repoPath("examples/pytorch/train_elastic.py"), "--steps", itoa(total), "--ckpt-dir", ckptDir,
		"--ckpt-every", "5", "--step-time", "0.05"}
	return append(args, extra...)
}

// downtime is the time from the last step at world size from to the first
// at world size to (steps in time order).
func downtime(steps []stepLine, from, to int) (time.Duration, bool) {
	for i := 1; i < len(steps); i++ {
		if steps[i-1].World == from && steps[i].World == to {
			return steps[i].At.Sub(steps[i-1].At), true
		}
	}
	return 0, false
}

// Issue 14: real DDP (gloo) on 3 nodes resized 3 -> 2 -> 3 with
// --inprocess-resize. The workers of the nodes that stay are never
// restarted: they re-form the process group in process; the node dropped
// by the shrink exits its workers (0) and waits as a spare; when it is
// taken back its new workers get the state from a surviving rank. Every
// optimizer step runs exactly once, with the loss of an uninterrupted run
// at the same global batch.
func TestInProcessResizeKeepsWorkersAndLosesNoStep(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with PyTorch")
	}
	py := torchPython(t)
	const total = 70
	ref := referenceLosses(t, py, total)
	srv, cli := startEtcd(t)
	c := newCluster(t, []string{"PYTHON_EXEC=" + py}, inprocessArgs(srv.Endpoints[0], "inproc", t.TempDir(), total)...)
	for _, n := range []string{"a", "b", "c"} {
		c.start(n)
	}
	t0 := time.Now()
	c.waitStep(120*time.Second, "training at world size 3", t0, func(s stepLine) bool { return s.World == 3 && s.Step >= 8 })
	before := map[string][]int{}
	for _, n := range []string{"a", "b", "c"} {
		before[n] = workerPIDs(c.PID(n))
	}
	target := func(n int) {
		if err := fleet.New(cli, "").SetTarget(context.Background(), "inproc", n); err != nil {
			t.Fatal(err)
		}
	}
	target(2)
	c.waitStep(60*time.Second, "training at world size 2", t0, func(s stepLine) bool { return s.World == 2 })
	top := 0
	for _, s := range c.allSteps() {
		top = max(top, s.Step)
	}
	c.waitStep(60*time.Second, "progress at world size 2", t0, func(s stepLine) bool { return s.World == 2 && s.Step >= top+5 })
	// The nodes that stayed kept their worker processes; the dropped
	// node's worker left.
	leaver := ""
	for name, l := range c.Logs() {
		if strings.Contains(l, "this node leaves the job after step") {
			leaver = strings.SplitN(name, "#", 2)[0]
		}
	}
	if leaver == "" {
		t.Fatal("no node's worker logged leaving the job at the shrink")
	}
	waitGone(t, before[leaver], "the dropped node's worker")
	for _, n := range []string{"a", "b", "c"} {
		if n == leaver {
			continue
		}
		if now := workerPIDs(c.PID(n)); len(now) != 1 || len(before[n]) != 1 || now[0] != before[n][0] {
			t.Errorf("node %s has workers %v after 3 -> 2, had %v: not kept in process", n, now, before[n])
		}
	}
	target(3)
	c.waitStep(90*time.Second, "training at world size 3 again", t0, func(s stepLine) bool { return s.World == 3 && s.Step > top })
	for _, n := range []string{"a", "b", "c"} {
		if code := c.wait(n, 120*time.Second); code != 0 {
			t.Errorf("node %s exited %d after training finished, want 0", n, code)
		}
	}
	steps := c.allSteps()
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].At.Before(steps[j].At) })
	checkExactlyOnce(t, steps, total, ref)
	logs := c.logText()
	if n := strings.Count(logs, `msg="reassigning workers in process"`); n != 4 {
		t.Errorf("workers reassigned in process %d times, want 4 (2 survivors x 2 changes)", n)
	}
	if n := strings.Count(logs, `msg="starting workers"`); n != 4 {
		t.Errorf("workers started %d times, want 4 (3 at first, then the node taken back)", n)
	}
	for _, bad := range []string{"escalating", "falling back to a restart"} {
		if strings.Contains(logs, bad) {
			t.Errorf("a node logged %q", bad)
		}
	}
	if !strings.Contains(logs, "received the state of step") {
		t.Error("the node taken back did not get the state from a surviving rank")
	}
	for _, ch := range [][2]int{{3, 2}, {2, 3}} {
		if d, ok := downtime(steps, ch[0], ch[1]); ok {
			t.Logf("in-process %d -> %d: last step at %d to first at %d: %s", ch[0], ch[1], ch[0], ch[1], d.Round(time.Millisecond))
		} else {
			t.Errorf("no change %d -> %d between consecutive steps", ch[0], ch[1])
		}
	}
}

// Issue 14, unplanned: a node SIGKILLed mid-step under --inprocess-resize.
// The survivors' gloo collective breaks at once; they leave the process
// group, their agents report it, and the next round (without the dead
// node) re-forms the group in process. Both survivors hold the same step,
// so training resumes from memory: every step exactly once, with the
// uninterrupted run's loss, and no worker restarted.
func TestInProcessSurvivesNodeSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with PyTorch")
	}
	py := torchPython(t)
	const total = 60
	ref := referenceLosses(t, py, total)
	srv, cli := startEtcd(t)
	// A survivor blocked on a peer that hangs instead of failing leaves the
	// collective after --dist-timeout, well within the graceful timeout.
	c := newCluster(t, []string{"PYTHON_EXEC=" + py}, inprocessArgs(srv.Endpoints[0], "inkill", t.TempDir(), total, "--dist-timeout", "8")...)
	for _, n := range []string{"a", "b", "c"} {
		c.start(n)
	}
	t0 := time.Now()
	c.waitStep(120*time.Second, "training at world size 3", t0, func(s stepLine) bool { return s.World == 3 && s.Step >= 10 })
	before := map[string][]int{"a": workerPIDs(c.PID("a")), "b": workerPIDs(c.PID("b"))}
	workersC := workerPIDs(c.PID("c"))
	killed := time.Now()
	c.kill("c")
	s2 := c.waitStep(60*time.Second, "training at world size 2 after the kill", killed, func(s stepLine) bool { return s.World == 2 })
	t.Logf("node SIGKILLed -> step at world size 2 after %s (in process)", s2.At.Sub(killed).Round(time.Millisecond))
	waitGone(t, workersC, "workers of the SIGKILLed node (Pdeathsig)")
	// The survivors' worker processes are the ones from before the kill.
	for _, n := range []string{"a", "b"} {
		if now := workerPIDs(c.PID(n)); len(now) != 1 || len(before[n]) != 1 || now[0] != before[n][0] {
			t.Errorf("node %s has workers %v after the kill, had %v: not kept in process", n, now, before[n])
		}
	}
	for _, n := range []string{"a", "b"} {
		if code := c.wait(n, 120*time.Second); code != 0 {
			t.Errorf("node %s exited %d after training finished, want 0", n, code)
		}
	}
	steps := c.allSteps()
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].At.Before(steps[j].At) })
	checkExactlyOnce(t, steps, total, ref)
	logs := c.logText()
	if n := strings.Count(logs, `msg="reassigning workers in process"`); n != 2 {
		t.Errorf("workers reassigned in process %d times, want 2 (the survivors)", n)
	}
	if n := strings.Count(logs, `msg="starting workers"`); n != 3 {
		t.Errorf("workers started %d times, want 3: a survivor's workers were restarted", n)
	}
	if n := getInt(t, cli, "/hyperpodrun/jobs/inkill/restarts"); n != 0 {
		t.Errorf("the lost node counted as %d restart(s); want 0", n)
	}
}

// Issue 14's fallback: under --inprocess-resize, the worker of rank 1 does
// not call reconfigure() on the shrink (code that does not know it: it
// checkpoints and exits 0, as without in-process resize). Its node falls
// back to restarting its workers; the new worker receives the state from a
// surviving rank, and no step is lost or repeated.
func TestInProcessResizeFallsBackForWorkerIgnoringReconfigure(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with PyTorch")
	}
	py := torchPython(t)
	const total = 50
	ref := referenceLosses(t, py, total)
	srv, cli := startEtcd(t)
	c := newCluster(t, []string{"PYTHON_EXEC=" + py}, inprocessArgs(srv.Endpoints[0], "inlegacy", t.TempDir(), total, "--no-reconfigure-rank", "1")...)
	for _, n := range []string{"a", "b", "c"} {
		c.start(n)
	}
	t0 := time.Now()
	c.waitStep(120*time.Second, "training at world size 3", t0, func(s stepLine) bool { return s.World == 3 && s.Step >= 8 })
	if err := fleet.New(cli, "").SetTarget(context.Background(), "inlegacy", 2); err != nil {
		t.Fatal(err)
	}
	c.waitStep(90*time.Second, "training at world size 2", t0, func(s stepLine) bool { return s.World == 2 })
	// The node dropped by the shrink waits as a spare until the job is over
	// (and then exits as spares do); the other two finish training.
	codes := map[string]int{}
	for _, n := range c.Running() {
		codes[n] = c.wait(n, 120*time.Second)
	}
	succeeded := 0
	for name, l := range c.Logs() {
		if strings.Contains(l, `msg="workers succeeded"`) {
			succeeded++
			if n := strings.SplitN(name, "#", 2)[0]; codes[n] != 0 {
				t.Errorf("node %s exited %d after training finished, want 0", n, codes[n])
			}
		}
	}
	if succeeded != 2 {
		t.Errorf("%d nodes finished training, want 2", succeeded)
	}
	steps := c.allSteps()
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].At.Before(steps[j].At) })
	checkExactlyOnce(t, steps, total, ref)
	logs := c.logText()
	if !strings.Contains(logs, "falling back to a restart") {
		t.Error("no agent logged falling back to a restart")
	}
	if strings.Contains(logs, "escalating") {
		t.Error("a node escalated: the worker that did not reconfigure had checkpointed and exited 0")
	}
	if !strings.Contains(logs, "received the state of step") {
		t.Error("the restarted worker did not receive the state from a surviving rank")
	}
}

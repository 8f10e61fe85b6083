package elastic_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/testcluster"
)

// hangTimeout is the tests' --hang-timeout.
const hangTimeout = 5 * time.Second

// runHangJob runs testdata/hang_worker.py (collective) on the named nodes
// (nproc workers each) under --hang-timeout 5: the worker of global rank
// hangRank sleeps before its all_reduce at step 12 of the first attempt. It checks what a
// user would notice: the hang is found within the hang timeout (counted
// from the last step), every node's log names it, the Python stacks in the
// log directory show the sleeping frame, the job resumes from its
// checkpoint (one restart) and finishes.
func runHangJob(t *testing.T, job string, nodes []string, nproc string, hangRank string) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end with PyTorch")
	}
	h := startHangJob(t, job, nodes, nproc, []string{"--hang-timeout", "5"},
		"hang_worker.py", "collective", hangRank, "12", "30")
	c := h.c
	t0 := time.Now()
	for _, name := range nodes {
		c.start(name)
	}
	hangAt := c.waitStep(120*time.Second, "step 12 (the last before the hang)", t0, func(s stepLine) bool { return s.Step == 12 })
	for _, name := range nodes {
		if code := c.wait(name, 120*time.Second); code != 0 {
			t.Fatalf("node %s exited %d, want 0: the job did not recover from the hang", name, code)
		}
	}
	var detected time.Time
	for _, l := range c.Lines() {
		if strings.Contains(l.Text, "workers hung: no heartbeat within --hang-timeout") {
			detected = l.At
			break
		}
	}
	if detected.IsZero() {
		t.Fatal("no node logged the hang")
	}
	// The hung rank's last heartbeat is at most an interval (0.5 s) before
	// step 12's line; detection is then within the timeout plus a poll,
	// with slack for a loaded machine.
	if took := detected.Sub(hangAt.At); took > hangTimeout+3*time.Second || took < hangTimeout-time.Second {
		t.Errorf("hang detected %.1fs after the last step; want about --hang-timeout (%s)", took.Seconds(), hangTimeout)
	} else {
		t.Logf("hang detected %.1fs after the last step (--hang-timeout %s)", took.Seconds(), hangTimeout)
	}
	if dumps, named := stackDumpsNaming(h.logDir, "stacks_rank", "stuck_before_all_reduce"); !named {
		t.Errorf("no stack dump under the log directory names the sleeping frame stuck_before_all_reduce; dumps: %v", dumps)
	}
	if !strings.Contains(c.logText(), "stacks=") || !strings.Contains(c.logText(), filepath.Join(h.logDir)) {
		t.Errorf("the hang's log line does not say where the stacks are")
	}
	h.checkFinished(30, 1, "after one hang")
}

// TestHungWorkerInACollectiveIsDetectedDumpedAndRecovered: two nodes of
// real DDP (gloo); node b's rank sleeps before its all_reduce, node a's
// waits in it. Without hang detection the job would wait for gloo's
// 10-minute timeout (the worker's).
func TestHungWorkerInACollectiveIsDetectedDumpedAndRecovered(t *testing.T) {
	runHangJob(t, "hang2", []string{"a", "b"}, "1", "1")
}

// TestHungWorkerOnAOneNodeJob: one node, two ranks, one of them hung.
func TestHungWorkerOnAOneNodeJob(t *testing.T) {
	runHangJob(t, "hang1", []string{"a"}, "2", "1")
}

// TestHungWorkerUnderStandalone: hyperpodrun --standalone (no etcd), two
// ranks, one hung: found, dumped, and the local workers restarted from the
// last checkpoint.
func TestHungWorkerUnderStandalone(t *testing.T) {
	runHangJob(t, "", []string{"a"}, "2", "1")
}

// hangStartupTimeout is the start-up tests' --hang-startup-timeout.
const hangStartupTimeout = 20 * time.Second

// runStartupHangJob runs testdata/hang_worker.py (startup) on the named
// nodes (nproc workers each) under --hang-startup-timeout 20 (a worker
// imports torch in it on a loaded machine) and a --hang-timeout of 10
// minutes: in the first attempt every worker calls the helper and rank 1
// fails at step 7 (a peer failure); in the restarted
// attempt rank 0 hangs before its first heartbeat and before
// init_process_group, so no worker of that attempt sends one (the soak's
// worker SIGSTOPped right after a restart). What a user notices: a node
// logs the start-up hang within the start-up timeout of its restarted
// workers' start, the Python stacks in the log directory show the hung
// frame, and the job resumes from its checkpoint and finishes.
func runStartupHangJob(t *testing.T, job string, nodes []string, nproc string) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end with PyTorch")
	}
	h := startHangJob(t, job, nodes, nproc, []string{"--hang-timeout", "600", "--hang-startup-timeout", "20"},
		"hang_worker.py", "startup", "1", "7", "0", "20")
	c := h.c
	for _, name := range nodes {
		c.start(name)
	}
	for _, name := range nodes {
		if code := c.wait(name, 150*time.Second); code != 0 {
			t.Fatalf("node %s exited %d, want 0: the job did not recover from the hang at start-up", name, code)
		}
	}
	// The detecting node's restarted workers started at its last
	// "starting workers" line before the hang's.
	started := map[string]time.Time{}
	var detected testcluster.Line
	for _, l := range c.Lines() {
		if strings.Contains(l.Text, `msg="starting workers"`) {
			started[l.Node] = l.At
		}
		if strings.Contains(l.Text, "workers hung: no heartbeat within --hang-startup-timeout") {
			detected = l
			break
		}
	}
	if detected.At.IsZero() {
		t.Fatal("no node logged the hang at start-up")
	}
	if took := detected.At.Sub(started[detected.Node]); took > hangStartupTimeout+3*time.Second || took < hangStartupTimeout {
		t.Errorf("start-up hang found %.1fs after the restarted workers started; want about --hang-startup-timeout (%s)", took.Seconds(), hangStartupTimeout)
	} else {
		t.Logf("start-up hang found %.1fs after the restarted workers started (--hang-startup-timeout %s)", took.Seconds(), hangStartupTimeout)
	}
	if !strings.Contains(detected.Text, "--hang-startup-timeout") || !strings.Contains(detected.Text, "rank ") {
		t.Errorf("the hang's log line does not name the rank and the flag: %s", detected.Text)
	}
	if dumps, named := stackDumpsNaming(h.logDir, "stacks_rank0_", "stuck_before_first_heartbeat"); !named {
		t.Errorf("no stack dump of rank 0 under the log directory names the hung frame stuck_before_first_heartbeat; dumps: %v", dumps)
	}
	h.checkFinished(20, 2, "after a failure and a hang at start-up")
}

// TestWorkerHungAtStartupAfterARestartIsDetectedDumpedAndRecovered: two
// nodes of real DDP (gloo); whichever node holds rank 1 fails in
// the first round, and rank 0 hangs before its first heartbeat of the next:
// without --hang-startup-timeout the job would wait for
// init_process_group's 10-minute timeout.
func TestWorkerHungAtStartupAfterARestartIsDetectedDumpedAndRecovered(t *testing.T) {
	runStartupHangJob(t, "hangstart2", []string{"a", "b"}, "1")
}

// TestWorkerHungAtStartupUnderStandalone: hyperpodrun --standalone (no
// etcd), two ranks: rank 1 fails, then rank 0 hangs before its first
// heartbeat of the restarted attempt; found, dumped, restarted.
func TestWorkerHungAtStartupUnderStandalone(t *testing.T) {
	runStartupHangJob(t, "", []string{"a"}, "2")
}

// hangJob is a hang test's job: its nodes' cluster, its --log-dir and a
// reader of its restart count.
type hangJob struct {
	t        *testing.T
	c        *cluster
	logDir   string
	restarts func() int
}

// startHangJob sets up (it does not start the nodes) a job of the named
// nodes, nproc workers each, under --max-restarts 3, --shutdown-timeout 3,
// the given hang flags and a fresh --log-dir, running the testdata worker
// script with workerArgs and a fresh checkpoint directory as its last
// argument. job "" is --standalone (no etcd; the restarts are counted in
// the log), any other is an etcd rendezvous of that id.
func startHangJob(t *testing.T, job string, nodes []string, nproc string, hangFlags []string, script string, workerArgs ...string) *hangJob {
	t.Helper()
	py := torchPython(t)
	h := &hangJob{t: t, logDir: t.TempDir()}
	ckpt := t.TempDir()
	common := append([]string{"--nproc-per-node", nproc, "--max-restarts", "3", "--shutdown-timeout", "3"}, hangFlags...)
	common = append(common, "--log-dir", h.logDir)
	worker := append(append([]string{repoPath("agent/elastic/testdata/" + script)}, workerArgs...), ckpt)
	var args []string
	if job == "" { // --standalone: no etcd, the restarts are in the log
		args = append(append([]string{"--standalone"}, common...), worker...)
	} else {
		srv, cli := startEtcd(t)
		nn := strconv.Itoa(len(nodes))
		args = append(append([]string{"--nnodes", nn + ":" + nn, "--rdzv-backend", "etcd",
			"--rdzv-endpoint", srv.Endpoints[0], "--rdzv-id", job, "--rdzv-conf", "last_call_timeout=1",
			"--local-addr", "127.0.0.1"}, common...), worker...)
		h.restarts = func() int { return getInt(t, cli, "/hyperpodrun/jobs/"+job+"/restarts") }
	}
	h.c = newCluster(t, []string{"PYTHON_EXEC=" + py}, args...)
	if h.restarts == nil {
		h.restarts = func() int { return strings.Count(h.c.logText(), `msg="starting workers"`) - 1 }
	}
	return h
}

// stackDumpsNaming lists the stack dumps under logDir whose names start
// with prefix, and whether any of them shows the Python frame fn.
func stackDumpsNaming(logDir, prefix, fn string) (dumps []string, named bool) {
	filepath.WalkDir(logDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), prefix) {
			b, _ := os.ReadFile(p)
			dumps = append(dumps, p)
			named = named || strings.Contains(string(b), "in "+fn)
		}
		return nil
	})
	return dumps, named
}

// checkFinished checks that the job's last step is lastStep and that it
// restarted wantRestarts times (why says after what, for the message).
func (h *hangJob) checkFinished(lastStep, wantRestarts int, why string) {
	h.t.Helper()
	last := 0
	for _, s := range h.c.allSteps() {
		last = max(last, s.Step)
	}
	if last != lastStep {
		h.t.Errorf("the job ended at step %d, want %d", last, lastStep)
	}
	if got := h.restarts(); got != wantRestarts {
		h.t.Errorf("job restarts = %d %s, want %d", got, why, wantRestarts)
	}
}

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

// runHangJob runs testdata/hang_worker.py on the named nodes (nproc workers
// each) under --hang-timeout 5: the worker of global rank hangRank sleeps
// before its all_reduce at step 12 of the first attempt. It checks what a
// user would notice: the hang is found within the hang timeout (counted
// from the last step), every node's log names it, the Python stacks in the
// log directory show the sleeping frame, the job resumes from its
// checkpoint (one restart) and finishes.
func runHangJob(t *testing.T, job string, nodes []string, nproc string, hangRank string) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end with PyTorch")
	}
	py := torchPython(t)
	logDir, ckpt := t.TempDir(), t.TempDir()
	common := []string{"--nproc-per-node", nproc, "--max-restarts", "3", "--shutdown-timeout", "3",
		"--hang-timeout", "5", "--log-dir", logDir}
	worker := []string{repoPath("agent/elastic/testdata/hang_worker.py"), hangRank, "12", "30", ckpt}
	var restarts func() int
	var args []string
	if job == "" { // --standalone: no etcd, the restarts are in the log
		args = append(append([]string{"--standalone"}, common...), worker...)
	} else {
		srv, cli := startEtcd(t)
		nn := strconv.Itoa(len(nodes))
		args = append(append([]string{"--nnodes", nn + ":" + nn, "--rdzv-backend", "etcd",
			"--rdzv-endpoint", srv.Endpoints[0], "--rdzv-id", job, "--rdzv-conf", "last_call_timeout=1",
			"--local-addr", "127.0.0.1"}, common...), worker...)
		restarts = func() int { return getInt(t, cli, "/hyperpodrun/jobs/"+job+"/restarts") }
	}
	c := newCluster(t, []string{"PYTHON_EXEC=" + py}, args...)
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
	var dumps []string
	named := false
	filepath.WalkDir(logDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), "stacks_rank") {
			b, _ := os.ReadFile(p)
			dumps = append(dumps, p)
			named = named || strings.Contains(string(b), "in stuck_before_all_reduce")
		}
		return nil
	})
	if !named {
		t.Errorf("no stack dump under the log directory names the sleeping frame stuck_before_all_reduce; dumps: %v", dumps)
	}
	if !strings.Contains(c.logText(), "stacks=") || !strings.Contains(c.logText(), filepath.Join(logDir)) {
		t.Errorf("the hang's log line does not say where the stacks are")
	}
	last := 0
	for _, s := range c.allSteps() {
		last = max(last, s.Step)
	}
	if last != 30 {
		t.Errorf("the job ended at step %d, want 30", last)
	}
	if restarts == nil {
		restarts = func() int { return strings.Count(c.logText(), `msg="starting workers"`) - 1 }
	}
	if got := restarts(); got != 1 {
		t.Errorf("job restarts = %d after one hang, want 1", got)
	}
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

// runStartupHangJob runs testdata/startup_hang_worker.py on the named
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
	py := torchPython(t)
	logDir, ckpt := t.TempDir(), t.TempDir()
	common := []string{"--nproc-per-node", nproc, "--max-restarts", "3", "--shutdown-timeout", "3",
		"--hang-timeout", "600", "--hang-startup-timeout", "20", "--log-dir", logDir}
	worker := []string{repoPath("agent/elastic/testdata/startup_hang_worker.py"), "1", "7", "0", "20", ckpt}
	var restarts func() int
	var args []string
	if job == "" {
		args = append(append([]string{"--standalone"}, common...), worker...)
	} else {
		srv, cli := startEtcd(t)
		nn := strconv.Itoa(len(nodes))
		args = append(append([]string{"--nnodes", nn + ":" + nn, "--rdzv-backend", "etcd",
			"--rdzv-endpoint", srv.Endpoints[0], "--rdzv-id", job, "--rdzv-conf", "last_call_timeout=1",
			"--local-addr", "127.0.0.1"}, common...), worker...)
		restarts = func() int { return getInt(t, cli, "/hyperpodrun/jobs/"+job+"/restarts") }
	}
	c := newCluster(t, []string{"PYTHON_EXEC=" + py}, args...)
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
	var dumps []string
	named := false
	filepath.WalkDir(logDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), "stacks_rank0_") {
			b, _ := os.ReadFile(p)
			dumps = append(dumps, p)
			named = named || strings.Contains(string(b), "in stuck_before_first_heartbeat")
		}
		return nil
	})
	if !named {
		t.Errorf("no stack dump of rank 0 under the log directory names the hung frame stuck_before_first_heartbeat; dumps: %v", dumps)
	}
	last := 0
	for _, s := range c.allSteps() {
		last = max(last, s.Step)
	}
	if last != 20 {
		t.Errorf("the job ended at step %d, want 20", last)
	}
	if restarts == nil {
		restarts = func() int { return strings.Count(c.logText(), `msg="starting workers"`) - 1 }
	}
	if got := restarts(); got != 2 {
		t.Errorf("job restarts = %d after a failure and a hang at start-up, want 2", got)
	}
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

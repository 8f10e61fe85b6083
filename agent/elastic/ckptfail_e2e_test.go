package elastic_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestFailedCheckpointOfAPlannedChangeIsNotSilent: two nodes of real DDP
// (gloo); the checkpoint disk is full (every save fails with ENOSPC) when
// node b is drained. The planned change cannot commit its step: the agent
// says so (which rank, which step, why, and the steps lost from the last
// committed checkpoint), and the crash loop that follows (every periodic
// save fails) names the full disk in each failure and ends the job once
// its restart budget is spent.
func TestFailedCheckpointOfAPlannedChangeIsNotSilent(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with PyTorch")
	}
	py := torchPython(t)
	srv, cli := startEtcd(t)
	ckpt := t.TempDir()
	c := newCluster(t, []string{"PYTHON_EXEC=" + py}, "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
		"--rdzv-endpoint", srv.Endpoints[0], "--rdzv-id", "ckptfull", "--rdzv-conf", "last_call_timeout=1",
		"--graceful-timeout", "20", "--shutdown-timeout", "3", "--max-restarts", "1", "--local-addr", "127.0.0.1",
		repoPath("agent/elastic/testdata/ckpt_worker.py"), "1000", ckpt)
	c.start("a")
	c.start("b")
	t0 := time.Now()
	c.waitStep(90*time.Second, "training at world size 2 past the first checkpoint", t0, func(s stepLine) bool { return s.World == 2 && s.Step >= 12 })
	if err := os.WriteFile(filepath.Join(ckpt, "FULL"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(c.PID("b"), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	if code := c.wait("b", 60*time.Second); code != 0 {
		t.Errorf("drained node exited %d, want 0", code)
	}
	if code := c.wait("a", 120*time.Second); code != 1 {
		t.Errorf("node a exited %d, want 1: the job's restarts are spent by the failing checkpoints", code)
	}
	logs := c.logText()
	lost := regexp.MustCompile(`the planned change lost steps: its checkpoint failed.*rank \d could not save the checkpoint of step (\d+) \(OSError: \[Errno 28\] No space left on device\); the job resumes from step (\d+), the last committed checkpoint: (\d+) steps lost`)
	if m := lost.FindStringSubmatch(logs); m == nil {
		t.Errorf("no agent said that the planned change lost steps, which and why:\n%s", grepLines(logs, "checkpoint"))
	} else {
		t.Logf("planned change: checkpoint of step %s failed, resumed from %s (%s steps lost)", m[1], m[2], m[3])
	}
	if !strings.Contains(logs, "reported worker failure") || !regexp.MustCompile(`rank 0 exitcode 1: rank 0 could not save the checkpoint of step \d+ \(OSError: \[Errno 28\]`).MatchString(logs) {
		t.Errorf("the failures of the crash loop do not name the failed checkpoint:\n%s", grepLines(logs, "failure"))
	}
	if !strings.Contains(logs, "exceed --max-restarts 1") {
		t.Errorf("the job did not fail on its restart budget:\n%s", grepLines(logs, "restart"))
	}
	if n := getInt(t, cli, "/hyperpodrun/jobs/ckptfull/restarts"); n != 2 {
		t.Errorf("job restarts = %d, want 2 (the budget of 1, then the failure that ends the job)", n)
	}
}

// grepLines returns the lines of text containing s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

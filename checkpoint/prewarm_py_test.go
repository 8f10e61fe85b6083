package checkpoint

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
)

// prewarmedPython starts python3 running code as a worker started ahead of
// its round (HYPERPODRUN_PREWARM=1, no RANK, the prewarm token), in its own
// process group, admitted as prewarmed on ch.
func prewarmedPython(t *testing.T, ch *control.Channel, code string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	abs, _ := filepath.Abs("python")
	cmd := exec.Command(py, "-c", code)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "PYTHONPATH=" + abs, "HYPERPODRUN_PREWARM=1", "HYPERPODRUN_INPROCESS=1", "LOCAL_RANK=0"}
	for k, v := range ch.PrewarmEnv() {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch.AdmitPrewarmed(cmd.Process.Pid)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, &out
}

func waitParkedPID(t *testing.T, ch *control.Channel, pid int) int {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		p, changed := ch.Parked()
		if r, ok := p[pid]; ok {
			return r
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("process %d never asked for its first assignment (parked: %v)", pid, p)
		}
	}
}

func waitExit(t *testing.T, cmd *exec.Cmd, out *bytes.Buffer) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("worker: %v\n%s", err, out)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("worker did not exit\n%s", out)
	}
}

// Issue 14's prewarm, from the worker's side (hyperpodrun_elastic): code
// that reads the environment and never calls wait_for_assignment() waits,
// at its first read of RANK, for the first assignment, parked with no rank;
// it then sees the round's variables, and is no longer prewarmed. Told to
// leave instead, it exits 0 without running on.
func TestPythonPrewarmedWorkerWaitsAtFirstReadOfItsRank(t *testing.T) {
	ch := newTestChannel(t)
	ch.SetRound(0)
	code := `import os, sys
import hyperpodrun_elastic as he
print("ahead", he.prewarmed(), "RANK" in dict(os.environ), flush=True)
rank = os.environ["RANK"]
print("assigned", rank, os.getenv("WORLD_SIZE"), "HYPERPODRUN_PREWARM" in os.environ, he.prewarmed(), he.wait_for_assignment().rank, flush=True)
`
	cmd, out := prewarmedPython(t, ch, code)
	pid := cmd.Process.Pid
	if r := waitParkedPID(t, ch, pid); r != -1 {
		t.Fatalf("parked with rank %d, want -1 (none)", r)
	}
	ch.SetRound(3)
	ch.Admit(3, pid, 5)
	if n := ch.Release(map[int]control.Assignment{pid: {Round: 3, Env: map[string]string{"RANK": "5", "WORLD_SIZE": "6", control.EnvControlToken: ch.Token(), control.EnvRound: "3"}}}); n != 1 {
		t.Fatalf("Release answered %d", n)
	}
	waitExit(t, cmd, out)
	if got := out.String(); !strings.Contains(got, "ahead True False\n") || !strings.Contains(got, "assigned 5 6 False False 5\n") {
		t.Errorf("worker printed:\n%s\nwant it ahead with no RANK, then rank 5 of 6, no longer prewarmed", got)
	}

	// Told to leave: exits 0 at the read, without running on.
	ch.SetRound(0)
	cmd, out = prewarmedPython(t, ch, `import os, hyperpodrun_elastic
print("rank", os.environ.get("RANK"), flush=True)
`)
	waitParkedPID(t, ch, cmd.Process.Pid)
	ch.Release(map[int]control.Assignment{cmd.Process.Pid: {Leave: true, Reason: "hyperpodrun is leaving the job"}})
	waitExit(t, cmd, out)
	if strings.Contains(out.String(), "rank") {
		t.Errorf("a worker told to leave ran on:\n%s", out)
	}
}

// Outside a prewarm the package changes nothing: RANK is read as given.
func TestPythonNotPrewarmedReadsItsRankAsGiven(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	abs, _ := filepath.Abs("python")
	cmd := exec.Command(py, "-c", `import os, hyperpodrun_elastic as he; print(os.environ["RANK"], he.prewarmed(), he.wait_for_assignment(), type(os.environ).__name__)`)
	cmd.Env = []string{"PYTHONPATH=" + abs, "RANK=" + strconv.Itoa(4), "HYPERPODRUN_PREWARM=1", "HYPERPODRUN_CONTROL_SOCKET=/nonexistent"}
	got, err := cmd.CombinedOutput()
	if err != nil || string(got) != "4 False None _Environ\n" {
		t.Errorf("got %q (%v), want RANK 4, not prewarmed", got, err)
	}
}

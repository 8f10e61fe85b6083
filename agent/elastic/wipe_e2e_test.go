package elastic_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/syncbuf"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// TestEtcdWipedUnderAJobStopsItInsteadOfRestartingFromZero: etcd is
// restarted with its data directory wiped while a two-node job trains
// (checkpoints committed). The agents, fenced by the lost leases, would
// rejoin an empty rendezvous and start the workers again from step 0,
// beside a control plane that no longer knows the job; instead each finds
// the job's records gone, starts nothing, says so and exits 1.
func TestEtcdWipedUnderAJobStopsItInsteadOfRestartingFromZero(t *testing.T) {
	bin := "/usr/bin/etcd"
	if _, err := os.Stat(bin); err != nil {
		testutil.SkipOrFail(t, fmt.Sprintf("no etcd binary (%s): apt-get install etcd-server", bin))
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is required")
	}
	etcd := etcdtest.StartRestartable(t, bin)
	out := t.TempDir()
	logs := map[string]*syncbuf.Buffer{}
	done := map[string]chan error{}
	for _, name := range []string{"a", "b"} {
		cmd := exec.Command(hprBinary, "--nnodes", "2:2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
			"--rdzv-endpoint", etcd.URL, "--rdzv-id", "wiped", "--rdzv-conf", "lease_ttl=3,last_call_timeout=0.5",
			"--max-restarts", "3", "--shutdown-timeout", "1", "--local-addr", "127.0.0.1",
			repoPath("agent/elastic/testdata/count_worker.py"))
		cmd.Env = append(os.Environ(), "PYTHON_EXEC="+py, "OUT="+out, "NODE="+name, "HYPERPODRUN_NODE_ID="+name)
		b := &syncbuf.Buffer{}
		cmd.Stdout, cmd.Stderr = b, b
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ch := make(chan error, 1)
		go func() { ch <- cmd.Wait() }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			if t.Failed() {
				t.Logf("---- node %s ----\n%s", name, b.String())
			}
		})
		logs[name], done[name] = b, ch
	}
	steps := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(out, "steps."+name))
		return string(b)
	}
	testutil.Eventually(t, 60*time.Second, "both nodes past a few committed checkpoints", func() (bool, string) {
		return strings.Contains(steps("a"), "step 32\n") && strings.Contains(steps("b"), "step 32\n"), steps("a") + steps("b")
	})
	wiped := time.Now()
	etcd.Wipe()
	for _, name := range []string{"a", "b"} {
		select {
		case err := <-done[name]:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Errorf("node %s ended with %v after the wipe, want exit status 1", name, err)
			}
		case <-time.After(45 * time.Second):
			t.Fatalf("node %s still runs 45 s after the wipe (steps: %d starts)", name, strings.Count(steps(name), "start "))
		}
		t.Logf("node %s exited %.1fs after the wipe", name, time.Since(wiped).Seconds())
	}
	for _, name := range []string{"a", "b"} {
		if n := strings.Count(steps(name), "start "); n != 1 {
			t.Errorf("node %s started its workers %d times; want once (nothing after the wipe)", name, n)
		}
		if l := logs[name].String(); !strings.Contains(l, "etcd lost this job's records") || !strings.Contains(l, "resubmit the job") {
			t.Errorf("node %s does not say that etcd lost the job's records and that the job must be resubmitted", name)
		}
	}
}

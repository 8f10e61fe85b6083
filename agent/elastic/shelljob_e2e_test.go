package elastic_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/syncbuf"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// startRestartableEtcd starts Debian's etcd (3.4, as issue 24's fleet ran) as
// a process the test can kill and start again; it skips without the
// binary, and fails under $CI.
func startRestartableEtcd(t *testing.T) *etcdtest.Binary {
	t.Helper()
	bin, ok := etcdtest.DebianEtcd()
	if !ok {
		testutil.SkipOrFail(t, "no etcd binary: apt-get install etcd-server")
	}
	return etcdtest.StartRestartable(t, bin)
}

// shellJob is a job of hyperpodrun nodes running a --no-python shell
// worker: each start of a node's workers is one line "start
// world=$WORLD_SIZE" in out/starts.<node>; the worker then writes a line
// "step world=$WORLD_SIZE" to out/steps.<node> every 50 ms until killed.
type shellJob struct {
	out   string
	names []string
	procs map[string]*exec.Cmd
}

// startShellJob starts the named nodes of job (--nnodes 1:3,
// --max-restarts 0, --shutdown-timeout 1) against endpoint with the
// given --rdzv-conf; env is added to each node's environment. The nodes
// are killed (after a SIGCONT, should the test have stopped one) when
// the test ends, and their logs printed if it failed.
func startShellJob(t *testing.T, endpoint, job, rdzvConf string, names []string, env ...string) *shellJob {
	t.Helper()
	j := &shellJob{out: t.TempDir(), names: names, procs: map[string]*exec.Cmd{}}
	worker := filepath.Join(j.out, "w.sh")
	if err := os.WriteFile(worker, []byte(`#!/bin/sh
echo "start world=$WORLD_SIZE" >> "$OUT/starts.$NODE"
while :; do echo "step world=$WORLD_SIZE" >> "$OUT/steps.$NODE"; sleep 0.05; done
`), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		cmd := exec.Command(hprBinary, "--nnodes", "1:3", "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint,
			"--rdzv-id", job, "--rdzv-conf", rdzvConf, "--max-restarts", "0",
			"--shutdown-timeout", "1", "--local-addr", "127.0.0.1", "--no-python", worker)
		cmd.Env = append(append(os.Environ(), "OUT="+j.out, "NODE="+name, "HYPERPODRUN_NODE_ID="+name), env...)
		b := &syncbuf.Buffer{}
		cmd.Stdout, cmd.Stderr = b, b
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		j.procs[name] = cmd
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGCONT)
			cmd.Process.Kill()
			<-done
			if t.Failed() {
				t.Logf("---- node %s ----\n%s", name, b.String())
			}
		})
	}
	return j
}

// starts is the world sizes ("world=N") of the node's worker starts, in
// order.
func (j *shellJob) starts(name string) []string {
	b, _ := os.ReadFile(filepath.Join(j.out, "starts."+name))
	return strings.Fields(strings.ReplaceAll(string(b), "start ", ""))
}

// all is every node's starts, for messages.
func (j *shellJob) all() string {
	var s []string
	for _, n := range j.names {
		s = append(s, n+": "+strings.Join(j.starts(n), " "))
	}
	return strings.Join(s, "; ")
}

// stepsAt reports whether the node's worker's last step was at world=N
// (world is "world=N").
func (j *shellJob) stepsAt(name, world string) bool {
	b, _ := os.ReadFile(filepath.Join(j.out, "steps."+name))
	return strings.HasSuffix(string(b), "step "+world+"\n")
}

package elastic_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// debianEtcd is a real etcd server process (Debian's etcd-server) that a
// test can SIGKILL and start again on the same data directory and ports.
type debianEtcd struct {
	t           *testing.T
	dir, client string
	peer        string
	cmd         *exec.Cmd
	exited      chan struct{}
	log         *os.File
	bin         string
}

func freePort(t *testing.T) int {
	t.Helper()
	return testutil.FreePort(t)
}

func startDebianEtcd(t *testing.T) *debianEtcd {
	t.Helper()
	bin := "/usr/bin/etcd"
	if p := os.Getenv("HYPERPODRUN_ETCD_BINARY"); p != "" {
		bin = p
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("Debian's etcd-server is not installed (%s): apt-get install etcd-server", bin)
	}
	dir := t.TempDir()
	e := &debianEtcd{t: t, dir: dir, bin: bin,
		client: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		peer:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}
	var err error
	if e.log, err = os.Create(filepath.Join(dir, "etcd.log")); err != nil {
		t.Fatal(err)
	}
	e.start("new")
	t.Cleanup(func() {
		e.kill()
		e.log.Close()
	})
	return e
}

func (e *debianEtcd) start(state string) {
	e.t.Helper()
	e.cmd = exec.Command(e.bin,
		"--name", "outage", "--data-dir", filepath.Join(e.dir, "data"),
		"--listen-client-urls", e.client, "--advertise-client-urls", e.client,
		"--listen-peer-urls", e.peer, "--initial-advertise-peer-urls", e.peer,
		"--initial-cluster", "outage="+e.peer, "--initial-cluster-state", state,
		"--logger", "zap", "--log-level", "warn")
	e.cmd.Stdout, e.cmd.Stderr = e.log, e.log
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := e.cmd.Start(); err != nil {
		e.t.Fatalf("start %s: %v", e.bin, err)
	}
	e.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(e.cmd, e.exited)
}

// kill SIGKILLs the server and waits for it to be gone.
func (e *debianEtcd) kill() {
	e.cmd.Process.Kill()
	<-e.exited
}

// An etcd outage never ends a job: etcd is SIGKILLed while a two-node job
// trains and started again 65 s later on the same data. The workers are
// fenced while it is down (their agents cannot prove their leases), the
// agents rejoin with fresh leases, and the job trains on to its end: both
// hyperpodruns exit 0. Before, the rejoin failed with "node id already
// registered" or "requested lease not found" and the job was lost.
func TestEtcdRestartNeverEndsAJob(t *testing.T) {
	// Past DESIGN's 60 s: a registration that gave up after a minute
	// lost the job. HYPERPODRUN_TEST_OUTAGE sets another length.
	outage := 65 * time.Second
	if v := os.Getenv("HYPERPODRUN_TEST_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("HYPERPODRUN_TEST_OUTAGE=%q: %v", v, err)
		}
		outage = d
	}
	etcd := startDebianEtcd(t)
	out := t.TempDir()
	// Each worker counts 200 steps of 50 ms into a file, resuming from the
	// file's count: the job ends once both have written their 200th step.
	worker := filepath.Join(out, "w.sh")
	os.WriteFile(worker, []byte(`#!/bin/sh
f="$OUT/steps.$NODE"
n=$(wc -l < "$f" 2>/dev/null || echo 0)
while [ "$n" -lt 200 ]; do n=$((n+1)); echo "$n world=$WORLD_SIZE" >> "$f"; sleep 0.05; done
`), 0o755)
	type node struct {
		cmd    *exec.Cmd
		stderr bytes.Buffer
		done   chan error
	}
	nodes := map[string]*node{}
	for _, name := range []string{"a", "b"} {
		n := &node{done: make(chan error, 1)}
		n.cmd = exec.Command(hprBinary, "--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.client,
			"--rdzv-id", "outage", "--rdzv-conf", "lease_ttl=3,last_call_timeout=0.5", "--max-restarts", "0",
			"--shutdown-timeout", "1", "--no-python", worker)
		n.cmd.Env = append(os.Environ(), "OUT="+out, "NODE="+name, "HYPERPODRUN_NODE_ID="+name)
		n.cmd.Stderr = &n.stderr
		n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := n.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { n.done <- n.cmd.Wait() }()
		t.Cleanup(func() { syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL); <-n.done; n.done <- nil })
		nodes[name] = n
	}
	steps := func(name string) int {
		b, _ := os.ReadFile(filepath.Join(out, "steps."+name))
		return bytes.Count(b, []byte("\n"))
	}
	deadline := time.Now().Add(30 * time.Second)
	for steps("a") < 3 || steps("b") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the job never trained on both nodes\na: %s\nb: %s", nodes["a"].stderr.String(), nodes["b"].stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	etcd.kill()
	time.Sleep(outage) // the outage itself, not a wait for a result
	etcd.start("existing")
	for name, n := range nodes {
		select {
		case err := <-n.done:
			if err != nil {
				t.Errorf("node %s: hyperpodrun ended with %v after the etcd restart (steps %d)\n%s", name, err, steps(name), n.stderr.String())
			}
		case <-time.After(90*time.Second + outage):
			t.Fatalf("node %s did not finish within 90 s of the etcd restart (steps %d)\n%s", name, steps(name), n.stderr.String())
		}
		n.done <- nil
	}
	for _, name := range []string{"a", "b"} {
		if s := steps(name); s < 200 {
			t.Errorf("node %s trained %d of 200 steps", name, s)
		}
	}
}

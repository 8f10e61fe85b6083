package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/testcluster"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// torchrunAnchors measures torchrun itself on the same two scenarios: its
// etcd rendezvous (torch's, etcd v2 API) on Debian's etcd 3.4 with
// --enable-v2 and python3-etcd, the same training script and node count.
func torchrunAnchors(py, script string) (recovery, scaleUp float64, err error) {
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		return 0, 0, fmt.Errorf("no etcd binary (apt-get install etcd-server): %w", err)
	}
	if err := exec.Command(py, "-c", "import etcd").Run(); err != nil {
		return 0, 0, fmt.Errorf("no python-etcd for torch's etcd rendezvous (apt-get install python3-etcd)")
	}
	_, file, _, _ := runtime.Caller(0)
	shim := filepath.Join(filepath.Dir(file), "..", "torchrun", "torchrun_py311.py")
	dir, err := os.MkdirTemp("", "torchrun-anchor-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	cport, pport := freePort(), freePort()
	ep := "127.0.0.1:" + strconv.Itoa(cport)
	etcd := exec.Command(etcdBin, "--data-dir", filepath.Join(dir, "etcd"), "--enable-v2",
		"--listen-client-urls", "http://"+ep, "--advertise-client-urls", "http://"+ep,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(pport), "--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(pport),
		"--initial-cluster", "default=http://127.0.0.1:"+strconv.Itoa(pport))
	etcd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := etcd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() { etcd.Process.Kill(); etcd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + ep + "/v2/keys/")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("etcd v2 API not up: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	nodes := func(job string) *testcluster.Cluster {
		current = testcluster.New(py, nil, shim, "--nnodes", "2:3", "--nproc_per_node", "1", "--rdzv_backend", "etcd",
			"--rdzv_endpoint", ep, "--rdzv_id", job, "--max_restarts", "100", "--tee", "3",
			script, "--steps", "100000", "--ckpt-dir", filepath.Join(dir, job), "--ckpt-every", "5", "--step-time", "0.05")
		return current
	}
	// Recovery: one of three nodes SIGKILLed (torchrun and its workers).
	c := nodes("rec")
	startAll(c, "a", "b", "c")
	if _, err := c.WaitStep(180*time.Second, time.Time{}, func(s testcluster.Step) bool { return s.World == 3 && s.Step >= 8 }); err != nil {
		c.KillAll()
		return 0, 0, fmt.Errorf("torchrun never trained at world size 3: %w", err)
	}
	killed := time.Now()
	c.Kill("c")
	s, err := c.WaitStep(180*time.Second, killed, func(s testcluster.Step) bool { return s.World == 2 })
	c.KillAll()
	if err != nil {
		return 0, 0, fmt.Errorf("torchrun never trained at world size 2 after the kill: %w", err)
	}
	recovery = s.At.Sub(killed).Seconds()
	// Scale-up: a third node joins two.
	c = nodes("up")
	startAll(c, "a", "b")
	if _, err := c.WaitStep(180*time.Second, time.Time{}, func(s testcluster.Step) bool { return s.World == 2 && s.Step >= 8 }); err != nil {
		c.KillAll()
		return recovery, 0, fmt.Errorf("torchrun never trained at world size 2: %w", err)
	}
	started := time.Now()
	startAll(c, "c")
	s, err = c.WaitStep(180*time.Second, started, func(s testcluster.Step) bool { return s.World == 3 })
	c.KillAll()
	if err != nil {
		return recovery, 0, fmt.Errorf("torchrun never trained at world size 3: %w", err)
	}
	return recovery, s.At.Sub(started).Seconds(), nil
}

// freePort is a free loopback port; 0 when none could be had (what is
// started on it then fails and says so).
func freePort() int {
	p, _ := testutil.FreePortErr()
	return p
}

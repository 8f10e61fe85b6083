package agent_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/tcpproxy"
)

// TestPartitionedNodeStopsItsWorkersBeforeItsRankIsReused: node b reaches
// etcd through a proxy that the test cuts. b's agent cannot prove its lease
// alive and must kill its workers before the lease can expire, so before a
// new round can give its rank to anyone: its workers' last heartbeat comes
// before node a starts the next round's workers.
func TestPartitionedNodeStopsItsWorkersBeforeItsRankIsReused(t *testing.T) {
	srv, _ := startEtcd(t)
	proxy, err := tcpproxy.New(strings.TrimPrefix(srv.Endpoints[0], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	out := t.TempDir()
	worker := filepath.Join(out, "w.sh")
	os.WriteFile(worker, []byte("#!/bin/sh\nwhile true; do date +%s%N >> \"$OUT/hb.$NODE.$RANK\"; sleep 0.01; done\n"), 0o755)

	var mu sync.Mutex
	var roundTwoStart time.Time
	startNode := func(name, endpoint string) *exec.Cmd {
		cmd := exec.Command(hprBinary, "--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint,
			"--rdzv-id", "fence", "--rdzv-conf", "lease_ttl=3,last_call_timeout=0.5", "--shutdown-timeout", "1",
			"--no-python", worker)
		cmd.Env = append(os.Environ(), "OUT="+out, "NODE="+name)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stderr, _ := cmd.StderrPipe()
		cmd.Stdout = nil
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
		re := regexp.MustCompile(`msg="starting workers" round=(\d+)`)
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if m := re.FindStringSubmatch(sc.Text()); m != nil && name == "a" && m[1] != "1" {
					mu.Lock()
					if roundTwoStart.IsZero() {
						roundTwoStart = time.Now()
					}
					mu.Unlock()
				}
			}
		}()
		return cmd
	}
	startNode("a", srv.Endpoints[0])
	b := startNode("b", "http://"+proxy.Addr())
	waitFile := func(name string) {
		deadline := time.Now().Add(30 * time.Second)
		for {
			if m, _ := filepath.Glob(filepath.Join(out, name)); len(m) > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s", name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFile("hb.a.*")
	waitFile("hb.b.*")
	cut := time.Now()
	proxy.Cut()
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		started := roundTwoStart
		mu.Unlock()
		if !started.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("node a never formed a new round without the partitioned node")
		}
		time.Sleep(10 * time.Millisecond)
	}
	files, _ := filepath.Glob(filepath.Join(out, "hb.b.*"))
	last := int64(0)
	for _, f := range files {
		data, _ := os.ReadFile(f)
		lines := strings.Fields(string(data))
		if n, err := strconv.ParseInt(lines[len(lines)-1], 10, 64); err == nil && n > last {
			last = n
		}
	}
	lastBeat := time.Unix(0, last)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("cut at 0; b's workers' last heartbeat %+.2fs; a's next round started %+.2fs", lastBeat.Sub(cut).Seconds(), roundTwoStart.Sub(cut).Seconds())
	if !lastBeat.Before(roundTwoStart) {
		t.Errorf("partitioned node's workers still ran (%s) after its rank could be reused (%s)", lastBeat.Format(time.StampMilli), roundTwoStart.Format(time.StampMilli))
	}
	_ = b
}

// TestPartitionedNodeFencesDuringAPlannedChange: fencing also holds while
// an agent waits --graceful-timeout for its workers to checkpoint. The
// workers ignore the elastic signal and the graceful timeout is a minute;
// node b is cut from etcd after it announced the change. Its workers must
// be killed once its lease is lost (TTL 3 s), not when the minute is up.
func TestPartitionedNodeFencesDuringAPlannedChange(t *testing.T) {
	srv, cli := startEtcd(t)
	proxy, err := tcpproxy.New(strings.TrimPrefix(srv.Endpoints[0], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	out := t.TempDir()
	worker := filepath.Join(out, "w.sh")
	os.WriteFile(worker, []byte("#!/bin/sh\ntrap '' USR1\nwhile true; do date +%s%N > \"$OUT/hb.$NODE.tmp\"; mv \"$OUT/hb.$NODE.tmp\" \"$OUT/hb.$NODE\"; sleep 0.01; done\n"), 0o755)
	announced := make(chan struct{})
	var once sync.Once
	startNode := func(name, endpoint string) {
		cmd := exec.Command(hprBinary, "--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", endpoint,
			"--rdzv-id", "fence-planned", "--rdzv-conf", "lease_ttl=3,last_call_timeout=0.5", "--graceful-timeout", "60",
			"--shutdown-timeout", "1", "--no-python", worker)
		cmd.Env = append(os.Environ(), "OUT="+out, "NODE="+name)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stderr, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if name == "b" && strings.Contains(sc.Text(), "announcing a planned change") {
					once.Do(func() { close(announced) })
				}
			}
		}()
	}
	lastBeat := func(name string) time.Time {
		data, err := os.ReadFile(filepath.Join(out, "hb."+name))
		if err != nil {
			return time.Time{}
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		return time.Unix(0, n)
	}
	startNode("a", srv.Endpoints[0])
	startNode("b", "http://"+proxy.Addr())
	deadline := time.Now().Add(30 * time.Second)
	for lastBeat("a").IsZero() || lastBeat("b").IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("workers never started on both nodes")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := fleet.New(cli, "").SetTarget(t.Context(), "fence-planned", 1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-announced:
	case <-time.After(30 * time.Second):
		t.Fatal("node b never announced the planned change")
	}
	cut := time.Now()
	proxy.Cut()
	// b's workers ignore the signal: only fencing stops them before the
	// graceful minute. Wait until their heartbeat has been still for a
	// second, up to 20 s after the cut.
	deadline = cut.Add(20 * time.Second)
	for time.Since(lastBeat("b")) < time.Second {
		if time.Now().After(deadline) {
			t.Fatalf("partitioned node's workers still ran %s after the cut (lease TTL 3s, graceful timeout 60s)", time.Since(cut).Round(time.Second))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("b's workers' last heartbeat %+.2fs after the cut", lastBeat("b").Sub(cut).Seconds())
	if took := lastBeat("b").Sub(cut); took > 6*time.Second {
		t.Errorf("b's workers ran %s after the cut; they must stop once the 3s lease is lost", took)
	}
}

package elastic_test

import (
	"bufio"
	"fmt"
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

// workerProc is one live worker process group seen in /proc.
type workerProc struct {
	pgid      int
	node      string
	rank      string
	worldSize string
}

// liveWorkers scans /proc for the live (non-zombie) processes whose
// environment holds marker and a RANK, one entry per process group (a
// worker's children share its group and environment).
func liveWorkers(marker string) []workerProc {
	ents, _ := os.ReadDir("/proc")
	seen := map[int]bool{}
	var out []workerProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(stat)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		pgid, _ := strconv.Atoi(f[2])
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		vars := map[string]string{}
		for _, kv := range strings.Split(string(env), "\x00") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				vars[k] = v
			}
		}
		if vars["FENCE_MARKER"] != marker || vars["RANK"] == "" || seen[pgid] {
			continue
		}
		_ = pid
		seen[pgid] = true
		out = append(out, workerProc{pgid: pgid, node: vars["NODE"], rank: vars["RANK"], worldSize: vars["WORLD_SIZE"]})
	}
	return out
}

// TestStoppedNodesWorkersDieBeforeTheirRanksAreReused: a hyperpodrun that
// is SIGSTOPped cannot notice that its lease is lost, nor kill its workers.
// Its watchdog must: the workers of the stopped node (which hold RANK 0 and
// 1) are SIGKILLed before its lease can expire, so at no moment do two live
// workers hold the same RANK, though the other node starts a new round with
// RANK 0 and 1. After SIGCONT the stopped node sees its lease gone, rejoins,
// and the job trains on both nodes again.
func TestStoppedNodesWorkersDieBeforeTheirRanksAreReused(t *testing.T) {
	srv, _ := startEtcd(t)
	out := t.TempDir()
	worker := filepath.Join(out, "w.sh")
	os.WriteFile(worker, []byte("#!/bin/sh\nwhile true; do sleep 0.05; done\n"), 0o755)
	marker := filepath.Base(out)
	cmds := map[string]*exec.Cmd{}
	logs := map[string]*strings.Builder{}
	var logMu sync.Mutex
	for _, name := range []string{"a", "b"} {
		cmd := exec.Command(hprBinary, "--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", srv.Endpoints[0],
			"--rdzv-id", "fence-stop", "--rdzv-conf", "lease_ttl=3,last_call_timeout=0.5", "--shutdown-timeout", "1", "--graceful-timeout", "2",
			"--no-python", worker)
		cmd.Env = append(os.Environ(), "FENCE_MARKER="+marker, "NODE="+name)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stderr, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		lb := &strings.Builder{}
		logMu.Lock()
		logs[name] = lb
		logMu.Unlock()
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				logMu.Lock()
				lb.WriteString(sc.Text() + "\n")
				logMu.Unlock()
			}
			cmd.Wait()
			close(exited)
		}()
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGCONT)
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		})
		cmds[name] = cmd
	}
	t.Cleanup(func() {
		if t.Failed() {
			logMu.Lock()
			defer logMu.Unlock()
			for name, l := range logs {
				t.Logf("---- node %s ----\n%s", name, l.String())
			}
		}
	})
	waitUntil := func(timeout time.Duration, what string, cond func([]workerProc) bool) []workerProc {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			ws := liveWorkers(marker)
			if cond(ws) {
				return ws
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s; live workers: %+v", what, timeout, ws)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	full := func(ws []workerProc) bool {
		nodes := map[string]int{}
		for _, w := range ws {
			if w.worldSize != "4" {
				return false
			}
			nodes[w.node]++
		}
		return len(ws) == 4 && nodes["a"] == 2 && nodes["b"] == 2
	}
	ws := waitUntil(60*time.Second, "both nodes' workers (world size 4)", full)
	victim := ""
	for _, w := range ws {
		if w.rank == "0" {
			victim = w.node
		}
	}
	survivor := map[string]string{"a": "b", "b": "a"}[victim]

	// Watch for two live workers with the same RANK for the rest of the test.
	var violation string
	var vmu sync.Mutex
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			byRank := map[string][]workerProc{}
			for _, w := range liveWorkers(marker) {
				byRank[w.rank] = append(byRank[w.rank], w)
			}
			for rank, holders := range byRank {
				if len(holders) > 1 {
					vmu.Lock()
					if violation == "" {
						violation = fmt.Sprintf("at %s two live workers hold RANK %s: %+v", time.Now().Format("15:04:05.000"), rank, holders)
					}
					vmu.Unlock()
				}
			}
			select {
			case <-stopWatch:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	defer func() { close(stopWatch); <-watched }()

	stopped := time.Now()
	if err := syscall.Kill(cmds[victim].Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Logf("node %s (RANK 0 and 1) stopped", victim)
	// The survivor runs a round of its own: RANK 0 and 1 again.
	waitUntil(30*time.Second, "the survivor's round without the stopped node", func(ws []workerProc) bool {
		n := 0
		for _, w := range ws {
			if w.node == survivor && w.worldSize == "2" {
				n++
			}
		}
		return n == 2
	})
	reused := time.Since(stopped)
	// By then the stopped node's workers must be gone, though it is still
	// stopped.
	ws = liveWorkers(marker)
	for _, w := range ws {
		if w.node == victim {
			t.Errorf("%s after the stop, with node %s still stopped and its ranks reused, its worker (RANK %s, process group %d) is alive", reused.Round(time.Millisecond), victim, w.rank, w.pgid)
		}
	}
	if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmds[victim].Process.Pid)); !strings.Contains(string(st), ") T ") {
		t.Errorf("node %s's hyperpodrun is no longer stopped: %s", victim, st)
	}
	t.Logf("the survivor's round started %s after the stop", reused.Round(time.Millisecond))
	if err := syscall.Kill(cmds[victim].Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The job trains on, on both nodes.
	waitUntil(60*time.Second, "both nodes training again after SIGCONT", full)
	vmu.Lock()
	if violation != "" {
		t.Error(violation)
	}
	vmu.Unlock()
	logMu.Lock()
	vlog := logs[victim].String()
	logMu.Unlock()
	if !strings.Contains(vlog, "hyperpodrun watchdog: killed the workers' process groups") {
		t.Errorf("node %s's log does not say its watchdog fenced its workers", victim)
	}
}

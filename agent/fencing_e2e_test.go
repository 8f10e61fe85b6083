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

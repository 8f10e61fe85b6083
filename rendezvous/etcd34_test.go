package rendezvous

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// debianEtcd is Debian's etcd-server binary (3.4 in bookworm); CI installs
// it. HYPERPODRUN_ETCD_BINARY overrides the path.
func debianEtcd() string {
	if p := os.Getenv("HYPERPODRUN_ETCD_BINARY"); p != "" {
		return p
	}
	return "/usr/bin/etcd"
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startEtcdBinary runs an etcd binary on free loopback ports in a temp dir
// and returns a client URL; the process is stopped at cleanup.
func startEtcdBinary(t *testing.T, bin string) string {
	t.Helper()
	dir := t.TempDir()
	client := fmt.Sprintf("http://127.0.0.1:%d", freeLoopbackPort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freeLoopbackPort(t))
	cmd := exec.Command(bin,
		"--name", "rdzvtest", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "rdzvtest="+peer, "--initial-cluster-state", "new",
		"--logger", "zap", "--log-level", "error",
	)
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
	})
	return client
}

// The rendezvous works against Debian's etcd 3.4 (a real external server
// and an older API level than the embedded 3.7).
func TestDebianEtcd34(t *testing.T) {
	t.Parallel()
	bin := debianEtcd()
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("etcd binary %s not installed (Debian package etcd-server; CI installs it): %v", bin, err)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Skipf("%s --version: %v", bin, err)
	}
	t.Logf("%s", strings.SplitN(string(out), "\n", 2)[0])
	url := startEtcdBinary(t, bin)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cli *clientv3.Client
	waitFor(t, 15*time.Second, "etcd "+url+" to answer", func() bool {
		c, err := NewClient([]string{strings.TrimPrefix(url, "http://")}, ClientOptions{DialTimeout: time.Second})
		if err != nil {
			return false
		}
		cli = c
		return true
	})
	defer cli.Close()
	h := newHarness(t)
	var nodes []*Node
	for _, id := range []string{"a", "b", "c"} {
		nodes = append(nodes, h.node(h.cfg(id, 2, 3), cli))
	}
	rs := mustJoinAll(t, ctx, nodes...)
	if rs[0].NumNodes != 3 {
		t.Fatalf("round: %+v", rs[0])
	}
	if _, err := nodes[0].ReportFailure(ctx, rs[0], "boom"); err != nil {
		t.Fatalf("report: %v", err)
	}
	rs = mustJoinAll(t, ctx, nodes...)
	if n, err := nodes[1].Restarts(ctx); err != nil || n != 1 {
		t.Fatalf("restarts after a failed round: %d %v", n, err)
	}
	if err := nodes[2].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	ch := nextAll(t, ctx, nodes[:2], rs[:2])
	if ch[0].Reason != MemberLost {
		t.Fatalf("change: %+v", ch[0])
	}
	rs = mustJoinAll(t, ctx, nodes[:2]...)
	if rs[0].NumNodes != 2 {
		t.Fatalf("round after leave: %+v", rs[0])
	}
}

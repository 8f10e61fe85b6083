package etcdtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// DebianEtcd is Debian's etcd-server binary (3.4 in bookworm), which CI
// installs; HYPERPODRUN_ETCD_BINARY overrides the path. ok is false when
// it is not there.
func DebianEtcd() (path string, ok bool) {
	path = "/usr/bin/etcd"
	if p := os.Getenv("HYPERPODRUN_ETCD_BINARY"); p != "" {
		path = p
	}
	_, err := os.Stat(path)
	return path, err == nil
}

// StartBinary runs the etcd binary bin on free loopback ports with its data
// in a temp dir, waits until it answers, and returns its client URL. The
// process is stopped when the test ends.
func StartBinary(t testing.TB, bin string) string {
	t.Helper()
	dir := t.TempDir()
	client := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))
	cmd := exec.Command(bin,
		"--name", "etcdtest", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "etcdtest="+peer, "--initial-cluster-state", "new",
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
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		sctx, scancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Status(sctx, client)
		scancel()
		if err == nil {
			return client
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s did not answer at %s within 30s: %v (log: %s)", bin, client, err, filepath.Join(dir, "etcd.log"))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

package etcdtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// Binary is an etcd binary run by a test that the test can kill, wipe and
// start again on the same ports (fault tests: etcd restarted with its data
// directory wiped, or restored from a snapshot).
type Binary struct {
	t      testing.TB
	bin    string
	dir    string
	URL    string // the client URL
	peer   string
	mu     sync.Mutex
	cmd    *exec.Cmd
	waited chan struct{}
}

// StartRestartable runs bin as StartBinary does and returns its handle;
// the process is stopped when the test ends.
func StartRestartable(t testing.TB, bin string) *Binary {
	t.Helper()
	b := &Binary{t: t, bin: bin, dir: t.TempDir(),
		URL:  fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t)),
		peer: fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))}
	t.Cleanup(func() { b.Kill() })
	b.Start()
	return b
}

// DataDir is the member's data directory.
func (b *Binary) DataDir() string { return filepath.Join(b.dir, "data") }

// Start starts the member (again) and waits until it answers.
func (b *Binary) Start() {
	b.t.Helper()
	cmd := exec.Command(b.bin,
		"--name", "etcdtest", "--data-dir", b.DataDir(),
		"--listen-client-urls", b.URL, "--advertise-client-urls", b.URL,
		"--listen-peer-urls", b.peer, "--initial-advertise-peer-urls", b.peer,
		"--initial-cluster", "etcdtest="+b.peer, "--initial-cluster-state", "new",
		"--logger", "zap", "--log-level", "error",
	)
	logf, err := os.OpenFile(filepath.Join(b.dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		b.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		b.t.Fatalf("start %s: %v", b.bin, err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(waited) }()
	b.mu.Lock()
	b.cmd, b.waited = cmd, waited
	b.mu.Unlock()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{b.URL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.t.Fatal(err)
	}
	defer cli.Close()
	testutil.Eventually(b.t, 30*time.Second, "etcd to answer at "+b.URL, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cli.Status(ctx, b.URL)
		return err == nil, fmt.Sprintf("%v (log: %s)", err, filepath.Join(b.dir, "etcd.log"))
	})
}

// Kill SIGKILLs the member and waits for it to exit (no-op when it is
// not running).
func (b *Binary) Kill() {
	b.mu.Lock()
	cmd, waited := b.cmd, b.waited
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-waited
}

// Wipe kills the member, removes its data directory and starts it again
// on the same ports: an empty etcd whose cluster and member ids are the
// same as before (they derive from the configuration), its revision back
// at 1.
func (b *Binary) Wipe() {
	b.t.Helper()
	b.Kill()
	if err := os.RemoveAll(b.DataDir()); err != nil {
		b.t.Fatal(err)
	}
	b.Start()
}

// SaveData copies the data directory of the stopped member (Kill first)
// and returns the copy: restoring it later (RestoreData) is a restore of
// an older snapshot, with the same cluster id and the revision of then.
func (b *Binary) SaveData() string {
	b.t.Helper()
	dst := filepath.Join(b.t.TempDir(), "data")
	if out, err := exec.Command("cp", "-a", b.DataDir(), dst).CombinedOutput(); err != nil {
		b.t.Fatalf("copy etcd's data: %v: %s", err, out)
	}
	return dst
}

// RestoreData kills the member, replaces its data directory with a copy
// SaveData made and starts it again.
func (b *Binary) RestoreData(saved string) {
	b.t.Helper()
	b.Kill()
	if err := os.RemoveAll(b.DataDir()); err != nil {
		b.t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", saved, b.DataDir()).CombinedOutput(); err != nil {
		b.t.Fatalf("restore etcd's data: %v: %s", err, out)
	}
	b.Start()
}

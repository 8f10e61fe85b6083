package checkpoint

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
)

// helperEnv makes the test binary run a helper (a worker that gets killed)
// instead of the tests.
const helperEnv = "HYPERPODRUN_CHECKPOINT_TEST_HELPER"

var (
	etcdOnce sync.Once
	etcdSrv  *etcdembed.Server
	etcdErr  error
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	code := m.Run()
	if etcdSrv != nil {
		etcdSrv.Close()
	}
	os.Exit(code)
}

// etcdClient returns a client of the package's shared embedded etcd.
func etcdClient(t *testing.T) *clientv3.Client {
	t.Helper()
	etcdOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		etcdSrv, etcdErr = etcdembed.Start(ctx, etcdembed.Options{UnsafeNoFsync: true})
	})
	if etcdErr != nil {
		t.Fatalf("start etcd: %v", etcdErr)
	}
	cli, err := etcdSrv.Client()
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

var jobSeq atomic.Int64

// uniqueJob gives every test run its own job (tests share one etcd, also
// across -count repetitions).
func uniqueJob(name string) string {
	return fmt.Sprintf("%s-%d", name, jobSeq.Add(1))
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newTestChannel is a control channel in a fresh directory, closed at the
// end of the test.
func newTestChannel(t *testing.T, opts ...control.Option) *control.Channel {
	t.Helper()
	ch, err := control.NewChannel(filepath.Join(t.TempDir(), "ctl"), opts...)
	if err != nil {
		t.Fatalf("NewChannel: %v", err)
	}
	t.Cleanup(func() { ch.Close() })
	return ch
}

// lineWaiter reads lines from r and lets tests wait for one that matches.
type lineWaiter struct {
	lines chan string
}

func newLineWaiter(r io.Reader) *lineWaiter {
	w := &lineWaiter{lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		close(w.lines)
	}()
	return w
}

// waitFor returns the first line for which match is true, failing the test
// at the deadline or when the stream ends.
func (w *lineWaiter) waitFor(t *testing.T, d time.Duration, what string, match func(string) bool) string {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-w.lines:
			if !ok {
				t.Fatalf("output ended before %s", what)
			}
			if match(l) {
				return l
			}
		case <-timer.C:
			t.Fatalf("no %s within %s", what, d)
		}
	}
}

// runHelper runs the test binary's helper modes (see crash tests).
func runHelper(mode string) int {
	var err error
	switch mode {
	case "crash-writer":
		err = helperCrashWriter()
	case "loop-writer":
		err = helperLoopWriter()
	default:
		err = fmt.Errorf("unknown helper mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 1
	}
	return 0
}

// startHelper re-executes the test binary in a helper mode.
func startHelper(t *testing.T, mode string, env ...string) (*exec.Cmd, *lineWaiter) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + mode}, env...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, newLineWaiter(out)
}

package elastic_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/testcluster"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

var hprBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agent-e2e-")
	if err != nil {
		panic(err)
	}
	hprBinary = filepath.Join(dir, "hyperpodrun")
	if out, err := exec.Command("go", "build", "-o", hprBinary, "../../cmd/hyperpodrun").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build hyperpodrun: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func repoPath(rel string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", rel)
}

// torchPython returns Debian's python with torch, or skips (fails in CI).
func torchPython(t *testing.T) string {
	t.Helper()
	if py := testcluster.TorchPython(); py != "" {
		return py
	}
	testutil.SkipOrFail(t, "PyTorch not installed (apt-get install python3-torch)")
	return ""
}

func startEtcd(t *testing.T) (*etcdembed.Server, *clientv3.Client) { return etcdtest.Start(t) }

type stepLine = testcluster.Step

// cluster wraps testcluster.Cluster for tests: errors fail the test, and
// the nodes' logs are printed when it failed.
type cluster struct {
	*testcluster.Cluster
	t *testing.T
}

func newCluster(t *testing.T, env []string, args ...string) *cluster {
	c := &cluster{testcluster.New(hprBinary, env, args...), t}
	t.Cleanup(func() {
		c.KillAll()
		if t.Failed() {
			for name, l := range c.Logs() {
				t.Logf("---- node %s ----\n%s", name, l)
			}
		}
	})
	return c
}

func (c *cluster) start(name string) {
	c.t.Helper()
	if err := c.Start(name); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) kill(name string) { c.Kill(name) }

func (c *cluster) wait(name string, timeout time.Duration) int {
	c.t.Helper()
	code, err := c.Wait(name, timeout)
	if err != nil {
		c.t.Fatal(err)
	}
	return code
}

func (c *cluster) waitStep(timeout time.Duration, what string, since time.Time, cond func(stepLine) bool) stepLine {
	c.t.Helper()
	s, err := c.WaitStep(timeout, since, cond)
	if err != nil {
		c.t.Fatalf("waiting for %s: %v", what, err)
	}
	return s
}

func (c *cluster) allSteps() []stepLine { return c.Steps() }

func (c *cluster) logText() string {
	var b strings.Builder
	for _, l := range c.Logs() {
		b.WriteString(l)
	}
	return b.String()
}

func getInt(t *testing.T, cli *clientv3.Client, key string) int {
	t.Helper()
	r, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return 0
	}
	n, err := strconv.Atoi(string(r.Kvs[0].Value))
	if err != nil {
		t.Fatalf("%s=%q: %v", key, r.Kvs[0].Value, err)
	}
	return n
}

// waitGone waits until none of pids is a live (non-zombie) process.
func waitGone(t *testing.T, pids []int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var live []int
		for _, p := range pids {
			if testcluster.Alive(p) {
				live = append(live, p)
			}
		}
		if len(live) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still alive: %v", what, live)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

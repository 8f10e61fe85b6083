package elastic_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// Issue 14 with two workers per node: both local ranks of the node that
// stays park and are reassigned together (2 -> 1 -> 2 nodes, world size
// 4 -> 2 -> 4), every step once with the uninterrupted run's loss.
func TestInProcessResizeWithTwoWorkersPerNode(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with PyTorch")
	}
	py := torchPython(t)
	const total = 40
	ref := referenceLosses(t, py, total)
	srv, cli := startEtcd(t)
	c := newCluster(t, []string{"PYTHON_EXEC=" + py}, "--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "etcd",
		"--rdzv-endpoint", srv.Endpoints[0], "--rdzv-id", "np2", "--rdzv-conf", "last_call_timeout=1",
		"--graceful-timeout", "15", "--shutdown-timeout", "3", "--local-addr", "127.0.0.1", "--inprocess-resize",
		repoPath("examples/pytorch/train_elastic.py"), "--steps", itoa(total), "--ckpt-dir", t.TempDir(),
		"--ckpt-every", "5", "--step-time", "0.05")
	c.start("a")
	c.start("b")
	c.waitStep(120*time.Second, "ws4", time.Time{}, func(s stepLine) bool { return s.World == 4 && s.Step >= 6 })
	if err := fleet.New(cli, "").SetTarget(context.Background(), "np2", 1); err != nil {
		t.Fatal(err)
	}
	c.waitStep(60*time.Second, "ws2", time.Time{}, func(s stepLine) bool { return s.World == 2 && s.Step >= 14 })
	if err := fleet.New(cli, "").SetTarget(context.Background(), "np2", 2); err != nil {
		t.Fatal(err)
	}
	c.waitStep(60*time.Second, "ws4 again", time.Time{}, func(s stepLine) bool { return s.World == 4 && s.Step > 14 })
	for _, n := range []string{"a", "b"} {
		if code := c.wait(n, 120*time.Second); code != 0 {
			t.Errorf("node %s exited %d, want 0", n, code)
		}
	}
	steps := c.allSteps()
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].At.Before(steps[j].At) })
	checkExactlyOnce(t, steps, total, ref)
	logs := c.logText()
	// The node that stays is reassigned twice; the other starts its two
	// workers again when it is taken back.
	if n := strings.Count(logs, `msg="reassigning workers in process"`); n != 2 {
		t.Errorf("reassigned in process %d times, want 2", n)
	}
	if n := strings.Count(logs, `msg="starting workers"`); n != 3 {
		t.Errorf("workers started %d times, want 3", n)
	}
	if strings.Contains(logs, "falling back to a restart") {
		t.Error("a node fell back to a restart")
	}
}

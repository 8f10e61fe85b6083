package elastic_test

import (
	"strings"
	"testing"
	"time"
)

// Issue 14's agent store: the node holding group rank 0 serves the round's
// TCPStore (package c10dstore) before any worker starts, and real DDP
// (torch 1.13, gloo) trains on it with TORCHELASTIC_USE_AGENT_STORE=True;
// --no-agent-store keeps torchrun's way (rank 0's worker hosts it).
func TestDDPTrainsOnTheAgentHostedStore(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with PyTorch")
	}
	py := torchPython(t)
	for _, tc := range []struct {
		name  string
		extra []string
		store bool
	}{{"agent store", nil, true}, {"no agent store", []string{"--no-agent-store"}, false}} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _ := startEtcd(t)
			const total = 12
			args := append([]string{"--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
				"--rdzv-endpoint", srv.Endpoints[0], "--rdzv-id", "store", "--rdzv-conf", "last_call_timeout=1",
				"--local-addr", "127.0.0.1"}, tc.extra...)
			args = append(args, repoPath("examples/pytorch/train_elastic.py"), "--steps", itoa(total), "--ckpt-dir", t.TempDir(),
				"--ckpt-every", "5", "--step-time", "0.05")
			c := newCluster(t, []string{"PYTHON_EXEC=" + py}, args...)
			c.start("a")
			c.start("b")
			for _, n := range []string{"a", "b"} {
				if code := c.wait(n, 120*time.Second); code != 0 {
					t.Fatalf("node %s exited %d", n, code)
				}
			}
			if steps := c.allSteps(); len(steps) != total {
				t.Errorf("%d step lines, want %d", len(steps), total)
			}
			served := strings.Count(c.logText(), `msg="serving the round's TCPStore for its workers"`)
			if tc.store && served != 1 {
				t.Errorf("the rank-0 node served the store %d times, want once (only rank 0's node serves it)", served)
			}
			if tc.store {
				// Up before any worker of any node starts: no worker waits
				// on torch's 1 s connect-retry grid.
				up, ok := logTime(c.logText(), `msg="serving the round's TCPStore for its workers"`)
				for name, l := range c.Logs() {
					started, sok := logTime(l, `msg="starting workers"`)
					if ok && sok && started.Before(up) {
						t.Errorf("node %s started its workers at %s, before the store was up at %s", name, started.Format(time.RFC3339Nano), up.Format(time.RFC3339Nano))
					}
				}
			}
			if !tc.store && served != 0 {
				t.Errorf("--no-agent-store: a node still served the store")
			}
		})
	}
}

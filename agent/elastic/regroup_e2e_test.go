package elastic_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/syncbuf"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// TestEtcdOutageResumesAtFullSizeWithOneRestart (issue 24): etcd is
// SIGKILLed for 10 s under a 3-node job (--nnodes 1:3). Every agent is
// fenced (its lease cannot be proven) and registers again once etcd is
// back. The round's members re-form it together: each node starts its
// workers exactly once more, at 3 nodes. Before, the first node back formed
// a 1-node round that the others then grew to 3: every node restarted
// twice, one of them at 1 node.
func TestEtcdOutageResumesAtFullSizeWithOneRestart(t *testing.T) {
	bin, ok := etcdtest.DebianEtcd()
	if !ok {
		if os.Getenv("CI") != "" {
			t.Fatal("etcd is required in CI: apt-get install etcd-server")
		}
		t.Skip("no etcd binary: apt-get install etcd-server")
	}
	etcd := etcdtest.StartRestartable(t, bin)
	out := t.TempDir()
	// Each start of a node's workers is one line in starts.<node>; the
	// worker then steps until the test ends.
	worker := filepath.Join(out, "w.sh")
	if err := os.WriteFile(worker, []byte(`#!/bin/sh
echo "start world=$WORLD_SIZE" >> "$OUT/starts.$NODE"
while :; do echo "step world=$WORLD_SIZE" >> "$OUT/steps.$NODE"; sleep 0.05; done
`), 0o755); err != nil {
		t.Fatal(err)
	}
	names := []string{"a", "b", "c"}
	for _, name := range names {
		cmd := exec.Command(hprBinary, "--nnodes", "1:3", "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.URL,
			"--rdzv-id", "regroup", "--rdzv-conf", "lease_ttl=3,last_call_timeout=0.5", "--max-restarts", "0",
			"--shutdown-timeout", "1", "--local-addr", "127.0.0.1", "--no-python", worker)
		cmd.Env = append(os.Environ(), "OUT="+out, "NODE="+name, "HYPERPODRUN_NODE_ID="+name)
		b := &syncbuf.Buffer{}
		cmd.Stdout, cmd.Stderr = b, b
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-done
			if t.Failed() {
				t.Logf("---- node %s ----\n%s", name, b.String())
			}
		})
	}
	starts := func(name string) []string {
		b, _ := os.ReadFile(filepath.Join(out, "starts."+name))
		return strings.Fields(strings.ReplaceAll(string(b), "start ", ""))
	}
	all := func() string {
		var s []string
		for _, n := range names {
			s = append(s, n+": "+strings.Join(starts(n), " "))
		}
		return strings.Join(s, "; ")
	}
	// Every node runs the workers of a 3-node round (a node that started
	// a moment late may have joined a smaller round first: only the starts
	// after the outage count).
	testutil.Eventually(t, 60*time.Second, "the job trains on 3 nodes", func() (bool, string) {
		for _, n := range names {
			s := starts(n)
			if len(s) == 0 || s[len(s)-1] != "world=3" {
				return false, all()
			}
		}
		return true, all()
	})
	before := map[string]int{}
	for _, n := range names {
		before[n] = len(starts(n))
	}
	etcd.Kill()
	time.Sleep(10 * time.Second) // the outage itself, not a wait for a result
	etcd.Start()
	testutil.Eventually(t, 60*time.Second, "every node restarted its workers after the outage", func() (bool, string) {
		for _, n := range names {
			if len(starts(n)) <= before[n] {
				return false, all()
			}
		}
		return true, all()
	})
	// A second restart would follow within a last call and a lease or two
	// of the first; the nodes' logs (on failure) show the rounds.
	testutil.Eventually(t, 20*time.Second, "the job trains at 3 nodes after the outage", func() (bool, string) {
		for _, n := range names {
			b, _ := os.ReadFile(filepath.Join(out, "steps."+n))
			if !strings.HasSuffix(string(b), "step world=3\n") {
				return false, all()
			}
		}
		return true, all()
	})
	for _, n := range names {
		if after := starts(n)[before[n]:]; len(after) != 1 || after[0] != "world=3" {
			t.Errorf("node %s started its workers %d time(s) after the outage (%v), want once at world=3 (all starts: %s)", n, len(after), after, all())
		}
	}
}

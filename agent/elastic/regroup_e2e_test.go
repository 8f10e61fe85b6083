package elastic_test

import (
	"testing"
	"time"

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
	etcd := startRestartableEtcd(t)
	names := []string{"a", "b", "c"}
	j := startShellJob(t, etcd.URL, "regroup", "lease_ttl=3,last_call_timeout=0.5", names)
	starts, all := j.starts, j.all
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
			if !j.stepsAt(n, "world=3") {
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

package nodeagent_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// stoppable is a Workloads that runs one pretend job and records
// StopAll's calls.
type stoppable struct {
	mu    sync.Mutex
	stops []string
}

func (s *stoppable) Run(ctx context.Context, _ nodeagent.Node) error { <-ctx.Done(); return nil }
func (s *stoppable) Drain(context.Context) error                     { return nil }
func (s *stoppable) StopAll(_ context.Context, why string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stops = append(s.stops, why)
	return []string{"j"}, nil
}

func (s *stoppable) calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.stops)
}

// etcd restored from an older copy of its data (a snapshot restore: the
// same cluster id, the same epoch, an older revision) makes the agent
// stop the node's jobs, count it and say so in the node's record; a plain
// etcd restart and a lost lease do not.
func TestRestoreOfAnOlderSnapshotStopsTheNodesJobs(t *testing.T) {
	bin, ok := etcdtest.DebianEtcd()
	if !ok {
		t.Skip("Debian's etcd binary is not installed (apt-get install etcd-server)")
	}
	etcd := etcdtest.StartRestartable(t, bin)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.URL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := &stoppable{}
	r := start(t, cli, nodeagent.Config{NodeName: "w1", Prefix: prefix, Workloads: w, Listen: "127.0.0.1:0",
		Discover: nodeagent.DiscoverWith(devices.Options{DisableNVML: true, DisableNeuron: true, Host: host})})
	key := fleet.NewKeys(prefix).Node("w1")
	lease := func() clientv3.LeaseID {
		gctx, gcancel := context.WithTimeout(ctx, 2*time.Second)
		defer gcancel()
		g, err := cli.Get(gctx, key)
		if err != nil || len(g.Kvs) == 0 {
			return 0
		}
		return clientv3.LeaseID(g.Kvs[0].Lease)
	}
	testutil.Eventually(t, 30*time.Second, "the node to register", func() (bool, string) { return lease() != 0, "" })

	// A plain restart keeps the data: no loss.
	etcd.Kill()
	saved := etcd.SaveData()
	etcd.Start()
	for i := range 100 {
		if _, err := cli.Put(ctx, fmt.Sprintf("/other/%d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	// A lost lease: the agent registers again, at the higher revision.
	first := lease()
	if _, err := cli.Revoke(ctx, first); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the node to register again", func() (bool, string) {
		l := lease()
		return l != 0 && l != first, ""
	})
	if c := w.calls(); len(c) != 0 {
		t.Fatalf("a restart and a lost lease stopped the node's jobs: %q", c)
	}

	// The older copy back: the revision went backwards.
	etcd.RestoreData(saved)
	testutil.Eventually(t, 30*time.Second, "the agent to stop the node's jobs", func() (bool, string) {
		return len(w.calls()) == 1, fmt.Sprintf("StopAll calls: %q", w.calls())
	})
	if why := w.calls()[0]; !strings.Contains(why, "etcd lost its data") || !strings.Contains(why, "revision went backwards") {
		t.Errorf("StopAll told %q, want the revision rule", why)
	}
	testutil.Eventually(t, 30*time.Second, "the node's record to say etcd lost its data", func() (bool, string) {
		gctx, gcancel := context.WithTimeout(ctx, 2*time.Second)
		defer gcancel()
		g, err := cli.Get(gctx, key)
		if err != nil || len(g.Kvs) == 0 {
			return false, fmt.Sprint(err)
		}
		inv, err := devices.ParseInventory("w1", g.Kvs[0].Value)
		if err != nil {
			return false, err.Error()
		}
		return slices.ContainsFunc(inv.Reasons, func(s string) bool {
			return strings.Contains(s, "etcd lost its data") && strings.Contains(s, "jobs stopped on this node: j")
		}), fmt.Sprintf("reasons %q", inv.Reasons)
	})
	_, body := get(t, "http://"+r.agent.Addr()+"/metrics")
	if !regexp.MustCompile(`(?m)^hyperpod_agent_etcd_data_loss_total\{[^}]*\} 1$`).MatchString(body) {
		t.Errorf("metrics lack hyperpod_agent_etcd_data_loss_total 1")
	}
	if c := w.calls(); len(c) != 1 {
		t.Errorf("StopAll called %d times, want once", len(c))
	}
}

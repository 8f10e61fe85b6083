package nodeagent_test

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// aliveOf reads a node's alive key (nil when it is not there).
func aliveOf(t *testing.T, cli *clientv3.Client, node string) *mvccpb.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := cli.Get(ctx, fleet.NewKeys(prefix).Alive(node))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) == 0 {
		return nil
	}
	return r.Kvs[0]
}

// Issue 22: the agent writes its alive key under a second lease whose id
// is random (not the record's, and not near any id etcd hands out), and
// its record declares it. Losing that lease re-registers the node under
// fresh leases; draining removes both keys at once.
func TestAgentKeepsAnAliveKeyUnderASecretLease(t *testing.T) {
	cli := startEtcd(t)
	w := watchNodes(t, cli)
	r := start(t, cli, nodeagent.Config{NodeName: "n1", Prefix: prefix,
		Discover: nodeagent.DiscoverWith(devices.Options{DisableNVML: true, DisableNeuron: true, Host: host})})
	w.waitFor(t, 10*time.Second, "registered", func() bool { return w.lastInventory(t, "n1") != nil })
	registered := time.Now()
	if inv := w.lastInventory(t, "n1"); inv.Liveness != devices.LivenessAliveKey {
		t.Fatalf("the record does not declare its alive key: liveness %q", inv.Liveness)
	}
	alive := aliveOf(t, cli, "n1")
	if alive == nil || alive.Lease == 0 {
		t.Fatalf("no alive key under a lease: %v", alive)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mine, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	evs := w.forNode("n1")
	record := evs[len(evs)-1].Kv.Lease
	for _, known := range []int64{record, int64(mine.ID)} {
		if d := alive.Lease - known; d > -1e6 && d < 1e6 {
			t.Errorf("the alive key's lease %x is within 1e6 of lease %x", alive.Lease, known)
		}
	}
	// The agent keeps the secret lease alive past its TTL.
	w.waitFor(t, 4*ttl, "the alive key outlives its TTL", func() bool {
		if a := aliveOf(t, cli, "n1"); a == nil || a.Lease != alive.Lease {
			t.Fatalf("the alive key went or changed while the agent ran: %v", a)
		}
		return time.Since(registered) > 2*ttl
	})

	// The alive lease lost: the node registers again, both keys under new leases.
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(alive.Lease)); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, 10*time.Second, "re-registered after losing the alive lease", func() bool {
		a := aliveOf(t, cli, "n1")
		evs := w.forNode("n1")
		last := evs[len(evs)-1]
		return a != nil && a.Lease != alive.Lease && last.Type == mvccpb.PUT && last.Kv.Lease != record
	})

	// Draining removes both.
	if err := r.agent.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if a := aliveOf(t, cli, "n1"); a != nil {
		t.Errorf("the alive key outlived the drain: %v", a)
	}
	if evs := w.forNode("n1"); evs[len(evs)-1].Type != mvccpb.DELETE {
		w.waitFor(t, 5*time.Second, "record deleted by the drain", func() bool {
			evs := w.forNode("n1")
			return evs[len(evs)-1].Type == mvccpb.DELETE
		})
	}
}

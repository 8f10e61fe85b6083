package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest/authfleet"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// Issue 22: a third party's keepalives do not keep a killed node's
// capacity. Real etcd (Debian's, auth on), real node agents with their
// own etcd users, the real coordinator. A team user, which reads node
// records and so their lease ids, keeps node-a's record lease alive after
// node-a's agent is killed; within the lease TTL (and a margin) the
// coordinator takes node-a from the job, and node-a's record is gone for
// every reader. The team user cannot read node-a's alive key, and its own
// lease ids do not predict that key's lease id.
func TestAThirdPartysKeepalivesDoNotKeepAKilledNodesCapacity(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	af := authfleet.Start(t, etcdauth.Parties{Teams: []string{"a"}, Nodes: []string{"node-a", "node-b"}})
	k, as := af.Keys, af.As
	root, team := as(etcdauth.RootUser), as(etcdauth.TeamRole("a"))
	if err := fleet.New(root, "").PutTeam(ctx, policy.Team{Name: "a", Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 32}}}); err != nil {
		t.Fatal(err)
	}

	// Two nodes, each with its own agent and etcd user.
	const ttl = 2 * time.Second
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	startAgent := func(node string) (stop func()) {
		inv := devices.Inventory{Node: node, Flavor: "trainium2", VCPUs: 8, MemoryBytes: 1 << 34}
		for d := range 16 {
			inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNeuron, Index: d, Flavor: "trainium2", Healthy: true})
		}
		a, err := nodeagent.New(as(etcdauth.NodeRole(node)), nodeagent.Config{NodeName: node, LeaseTTL: ttl, RefreshInterval: time.Hour, Logger: log,
			Discover: func(context.Context) (*devices.Inventory, error) { return inv.Clone(), nil }})
		if err != nil {
			t.Fatal(err)
		}
		actx, acancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { a.Run(actx); close(done) }()
		stop = func() { acancel(); <-done }
		t.Cleanup(stop)
		return stop
	}
	killA := startAgent("node-a")
	startAgent("node-b")

	c := New(as(etcdauth.CoordinatorUser), Config{Identity: "c", Resync: 100 * time.Millisecond, Logger: log, Engine: policy.Config{MinStablePeriod: -1}})
	cctx, ccancel := context.WithCancel(ctx)
	cdone := make(chan struct{})
	go func() { c.Run(cctx); close(cdone) }()
	defer func() { ccancel(); <-cdone }()
	if err := fleet.New(team, "").SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 2, Elastic: true}}); err != nil {
		t.Fatal(err)
	}
	nodesOf := func() []string {
		d, err := fleet.New(root, "").Desired(ctx, "j")
		if err != nil || d == nil {
			return nil
		}
		n := slices.Clone(d.Nodes)
		slices.Sort(n)
		return n
	}
	waitFor(t, 20*time.Second, "j placed on node-a and node-b", func() bool { return slices.Equal(nodesOf(), []string{"node-a", "node-b"}) })

	// What the team user sees of node-a: its record and that record's
	// lease id, not its alive key.
	r, err := team.Get(ctx, k.Node("node-a"))
	if err != nil || len(r.Kvs) != 1 || r.Kvs[0].Lease == 0 {
		t.Fatalf("node-a's record as the team reads it: %v, %v", r, err)
	}
	recordLease := clientv3.LeaseID(r.Kvs[0].Lease)
	var inv devices.Inventory
	if err := json.Unmarshal(r.Kvs[0].Value, &inv); err != nil || inv.Liveness != devices.LivenessAliveKey {
		t.Fatalf("node-a's record does not declare its alive key: %s (%v)", r.Kvs[0].Value, err)
	}
	if _, err := team.Get(ctx, k.Alive("node-a")); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("the team user read node-a's alive key: %v", err)
	}
	if _, err := as(etcdauth.NodeRole("node-b")).Get(ctx, k.Alive("node-a")); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("node-b's agent read node-a's alive key: %v", err)
	}
	ar, err := root.Get(ctx, k.Alive("node-a"))
	if err != nil || len(ar.Kvs) != 1 || ar.Kvs[0].Lease == 0 {
		t.Fatalf("node-a's alive key: %v, %v", ar, err)
	}
	secret := ar.Kvs[0].Lease
	own, err := team.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	for _, guess := range []int64{int64(own.ID), int64(recordLease)} {
		if d := secret - guess; d > -1e6 && d < 1e6 {
			t.Errorf("the alive key's lease %x is within 1e6 of lease %x, which the team user knows", secret, guess)
		}
	}

	// The attack: the team user keeps node-a's record lease alive, and
	// node-a's agent dies without draining.
	kaCtx, kaCancel := context.WithCancel(ctx)
	defer kaCancel()
	ka, err := team.KeepAlive(kaCtx, recordLease)
	if err != nil {
		t.Fatalf("the team user cannot keep node-a's record lease alive (the attack needs it): %v", err)
	}
	answered := make(chan time.Time, 1024)
	go func() {
		for resp := range ka {
			if resp.TTL > 0 {
				select {
				case answered <- time.Now():
				default:
				}
			}
		}
		close(answered)
	}()
	killA()
	killed := time.Now()
	took := waitFor(t, ttl+8*time.Second, "node-a taken from j", func() bool { return slices.Equal(nodesOf(), []string{"node-b"}) })
	t.Logf("node-a left j %s after its agent was killed (lease TTL %s)", took, ttl)
	nodes, _, err := fleet.New(team, "").Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Node == "node-a" {
			t.Errorf("the team still sees node-a's record (%s) after it was taken from j", n.State)
		}
	}
	// The attack ran: etcd extended node-a's record lease for the team
	// user after the agent was gone.
	kaCancel()
	var last time.Time
	for at := range answered {
		last = at
	}
	if !last.After(killed.Add(ttl / 4)) {
		t.Errorf("no keepalive of node-a's record lease was answered after its agent was killed: the test did not attack")
	}
}

package kubernetes_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// bridgeTTL is the node bridge's lease TTL (nodes.go).
const bridgeTTL = 15 * time.Second

// bridged is one bridged Node's keys as etcd holds them.
type bridged struct {
	recordLease, aliveLease int64
	liveness                string
}

// bridgedNodes reads the records and alive keys of n1..n4.
func bridgedNodes(ctx context.Context, st *fleet.Store) (map[string]bridged, error) {
	out := map[string]bridged{}
	for i := 1; i <= 4; i++ {
		node := fmt.Sprintf("n%d", i)
		r, err := st.Cli.Txn(ctx).Then(clientv3.OpGet(st.Keys.Node(node)), clientv3.OpGet(st.Keys.Alive(node))).Commit()
		if err != nil {
			return nil, err
		}
		var b bridged
		if kvs := r.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			var inv devices.Inventory
			if err := json.Unmarshal(kvs[0].Value, &inv); err != nil {
				return nil, err
			}
			b.recordLease, b.liveness = kvs[0].Lease, inv.Liveness
		}
		if kvs := r.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
			b.aliveLease = kvs[0].Lease
		}
		out[node] = b
	}
	return out, nil
}

// withSecretLiveness reports whether every one of n1..n4 has a record that
// declares its alive key and an alive key under a lease other than the
// record's.
func withSecretLiveness(nodes map[string]bridged) bool {
	for _, b := range nodes {
		if b.recordLease == 0 || b.liveness != devices.LivenessAliveKey || b.aliveLease == 0 || b.aliveLease == b.recordLease {
			return false
		}
	}
	return len(nodes) == 4
}

// teamUser connects to the fleet's etcd as team research's own user (its
// password reset by root for the test): a third party with no business
// with nodes.
func teamUser(t *testing.T, e *env) *clientv3.Client {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	user := etcdauth.TeamRole("research")
	if _, err := e.st.Cli.UserChangePassword(ctx, user, "team-pw"); err != nil {
		t.Fatalf("set %s's password: %v", user, err)
	}
	cli, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: e.st.Cli.Endpoints(), User: user, Password: "team-pw"})
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// keepAlive sends keepalives for lease as cli until the test ends (or the
// lease is revoked); answered says when etcd last extended the lease for
// cli.
func keepAlive(t *testing.T, cli *clientv3.Client, lease int64) (answered func() time.Time) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := cli.KeepAliveOnce(ctx, clientv3.LeaseID(lease)); err != nil {
		cancel()
		t.Fatalf("the third party cannot keep lease %x alive (the attack needs it): %v", lease, err)
	}
	ka, err := cli.KeepAlive(ctx, clientv3.LeaseID(lease))
	if err != nil {
		cancel()
		t.Fatalf("keep lease %x alive: %v", lease, err)
	}
	var last atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for r := range ka {
			if r.TTL > 0 {
				last.Store(time.Now().UnixNano())
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() time.Time { return time.Unix(0, last.Load()) }
}

// startDebianEnv is startEnv with etcd auth on Debian's etcd: the
// embedded etcd refuses a keepalive to a user who may not write the
// lease's keys, Debian's (3.4, what CI and bookworm run) checks nothing,
// and these tests are about a third party's keepalives.
func startDebianEnv(t *testing.T, o envOptions) *env {
	if _, ok := etcdtest.DebianEtcd(); !ok {
		t.Skip("Debian's etcd is not installed (apt-get install etcd-server): the embedded etcd refuses the third party's keepalives these tests need")
	}
	o.EtcdAuth, o.DebianEtcd = true, true
	return startEnv(t, o)
}

// A bridged Node is as hard to keep alive as an agent's: its record
// declares an alive key, which lives under a secret lease of the
// controller's. When the controller is killed, a team user that keeps the
// records' (readable) lease alive does not keep the Nodes in the fleet:
// their alive keys expire within the TTL, and the coordinator deletes the
// records and revokes the very lease the team keeps alive.
func TestBridgedNodesLivenessCannotBeFaked(t *testing.T) {
	e := startDebianEnv(t, envOptions{})
	var nodes map[string]bridged
	waitFor(t, 30*time.Second, "n1..n4 bridged, each record declaring an alive key under a lease of its own", func() (bool, string) {
		var err error
		nodes, err = bridgedNodes(e.ctx, e.st)
		return err == nil && withSecretLiveness(nodes), fmt.Sprintf("%+v %v", nodes, err)
	})
	team := teamUser(t, e)
	ctx := ctxT(t, 10*time.Second)
	if _, err := team.Get(ctx, e.st.Keys.Alive("n1")); !fleet.IsPermissionDenied(err) {
		t.Errorf("a team user read alive/n1: %v", err)
	}
	r, err := team.Get(ctx, e.st.Keys.Node("n1"))
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("a team user cannot read nodes/n1 (every reader may): %+v %v", r, err)
	}
	recordLease := r.Kvs[0].Lease
	answered := keepAlive(t, team, recordLease)

	e.cancels[0]() // the controller stops, as if killed: nothing revokes its leases
	killed := time.Now()
	waitFor(t, bridgeTTL+15*time.Second, "the killed controller's Nodes gone from the fleet, their record lease kept alive by a team user", func() (bool, string) {
		inv, _, err := e.st.Nodes(e.ctx)
		return err == nil && len(inv) == 0, fmt.Sprintf("%d nodes %v", len(inv), err)
	})
	left := time.Since(killed)
	t.Logf("the Nodes left the fleet %v after the controller was killed (TTL %v)", left, bridgeTTL)
	if left > bridgeTTL+10*time.Second {
		t.Errorf("the Nodes left the fleet %v after the controller died (TTL %v)", left, bridgeTTL)
	}
	// The attack ran: etcd extended the records' lease for the team user
	// after the controller was gone, past the moment it would have
	// expired on its own (the records went before, by the coordinator's
	// hand: it revokes the lease of a record whose alive key is gone).
	if a := answered(); !a.After(killed) {
		t.Errorf("no keepalive of the records' lease was answered after the controller was killed (last %v before): the test did not attack", killed.Sub(a))
	}
	ctx = ctxT(t, 10*time.Second)
	ttl, err := e.st.Cli.TimeToLive(ctx, clientv3.LeaseID(recordLease))
	if err != nil || ttl.TTL != -1 {
		t.Errorf("the records' lease, kept alive by the team user, was not revoked: %+v %v", ttl, err)
	}
	alive, err := e.st.Cli.Get(ctx, e.st.Keys.AlivePrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || alive.Count != 0 {
		t.Errorf("alive keys left: %+v %v", alive, err)
	}
}

// A new leader takes the bridged Nodes over: records left under the old
// controller's lease (kept alive by a team user) are rewritten under the
// new controller's two leases, and no Node leaves the fleet meanwhile,
// not even once the old controller's alive keys would have expired.
func TestNewLeaderTakesOverBridgedNodes(t *testing.T) {
	e := startDebianEnv(t, envOptions{LeaderElection: true})
	leader := e.oneLeader()
	var old map[string]bridged
	waitFor(t, 30*time.Second, "n1..n4 bridged by the leader with alive keys", func() (bool, string) {
		var err error
		old, err = bridgedNodes(e.ctx, e.st)
		return err == nil && withSecretLiveness(old), fmt.Sprintf("%+v %v", old, err)
	})
	oldLease := old["n1"].recordLease
	answered := keepAlive(t, teamUser(t, e), oldLease)

	// Every deletion of a node record from here on.
	ctx := ctxT(t, 2*time.Minute)
	cur, err := e.st.Cli.Get(ctx, e.st.Keys.NodesPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var deleted []string
	var watched atomic.Int64
	wch := e.st.Cli.Watch(ctx, e.st.Keys.NodesPrefix(), clientv3.WithPrefix(), clientv3.WithRev(cur.Header.Revision+1))
	go func() {
		for wr := range wch {
			watched.Store(wr.Header.Revision)
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					mu.Lock()
					deleted = append(deleted, string(ev.Kv.Key))
					mu.Unlock()
				}
			}
		}
	}()

	e.cancels[leader]()
	waitFor(t, 30*time.Second, "the new leader's records and alive keys for n1..n4", func() (bool, string) {
		now, err := bridgedNodes(e.ctx, e.st)
		if err != nil || !withSecretLiveness(now) {
			return false, fmt.Sprintf("%+v %v", now, err)
		}
		for n, b := range now {
			if b.recordLease == oldLease || b.aliveLease == old[n].aliveLease {
				return false, fmt.Sprintf("%s still under the old controller's leases: %+v", n, b)
			}
		}
		return e.ctls[1-leader].Leading(), fmt.Sprintf("%+v", now)
	})
	// The old controller's alive lease expires within its TTL: its keys
	// are the new leader's now, so no Node goes with it.
	waitFor(t, bridgeTTL+15*time.Second, "the old controller's alive lease expired", func() (bool, string) {
		ttl, err := e.st.Cli.TimeToLive(ctx, clientv3.LeaseID(old["n1"].aliveLease))
		return err == nil && ttl.TTL == -1, fmt.Sprintf("%+v %v", ttl, err)
	})
	// Let the watch catch up to etcd's revision after the expiry before
	// reading what it saw.
	after, err := e.st.Cli.Get(ctx, e.st.Keys.NodesPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the watch past the expiry", func() (bool, string) {
		if watched.Load() >= after.Header.Revision {
			return true, ""
		}
		_ = e.st.Cli.RequestProgress(ctx)
		return false, fmt.Sprintf("watched revision %d, etcd's %d", watched.Load(), after.Header.Revision)
	})
	if a := answered(); a.IsZero() {
		t.Errorf("no keepalive of the old controller's lease was answered: the test did not attack")
	}
	nodes, _, err := e.st.Nodes(ctx)
	if err != nil || len(nodes) != 4 {
		t.Errorf("after the leader change: %d nodes %v", len(nodes), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(deleted) > 0 {
		t.Errorf("node records deleted during the leader change: %s", strings.Join(deleted, " "))
	}
}

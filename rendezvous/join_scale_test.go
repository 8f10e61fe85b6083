package rendezvous

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Registering is one write besides the lease grant: the member record and
// the election queue entry go in one transaction (issue 27: a 10,000-node
// join is bound by etcd writes per node).
func TestRegistrationIsOneWrite(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nodes := h.register(ctx, h.cfg("a", 2, 2), h.cfg("b", 2, 2))
	for _, n := range nodes {
		m, err := h.cli.Get(ctx, n.k.Member(n.ID()))
		if err != nil || len(m.Kvs) != 1 {
			t.Fatalf("member key of %s: %v %v", n.ID(), m, err)
		}
		n.mu.Lock()
		qk := n.queueKey
		n.mu.Unlock()
		q, err := h.cli.Get(ctx, qk)
		if err != nil || len(q.Kvs) != 1 || string(q.Kvs[0].Value) != n.ID() {
			t.Fatalf("queue entry %q of %s: %v %v", qk, n.ID(), q, err)
		}
		if mr, qr := m.Kvs[0].CreateRevision, q.Kvs[0].CreateRevision; mr != qr {
			t.Errorf("node %s: member key written at revision %d, queue entry at %d: two writes, want one transaction", n.ID(), mr, qr)
		}
	}
	// The older node (a) is the closer: both join one round.
	mustJoinAll(t, ctx, nodes...)
}

// Queue entries named by the same revision (nodes whose leases were
// granted at once) sort by the rest of their name (grant time, node id):
// each node's predecessor is the next entry after its own, and the last
// one's is the next older revision's.
func TestPredecessorSameRevision(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := h.node(h.cfg("x", 1, 1))
	entry := func(rev int64, id string) string { return n.k.QueueKey(rev) + "/" + id }
	for _, e := range []struct {
		rev int64
		id  string
	}{{10, "a"}, {10, "b"}, {10, "c"}, {5, "z"}} {
		h.put(ctx, entry(e.rev, e.id), e.id)
	}
	for _, c := range []struct {
		rev      int64
		id, want string
	}{
		{10, "a", entry(10, "b")},
		{10, "b", entry(10, "c")},
		{10, "c", entry(5, "z")},
		{12, "d", entry(10, "a")},
		{5, "z", ""},
	} {
		p, err := n.predecessor(ctx, entry(c.rev, c.id), c.rev, predResult{})
		if err != nil {
			t.Fatal(err)
		}
		if p.key != c.want || !p.done {
			t.Errorf("predecessor of %s at %d: got %q (done %v), want %q", c.id, c.rev, p.key, p.done, c.want)
		}
	}
	// The registration's own lookup (the first window, in its
	// transaction) agrees.
	from, to, _ := n.window(entry(10, "c"), 10, firstWindow)
	g, err := h.cli.Get(ctx, from, clientv3.WithRange(to), clientv3.WithLimit(1), clientv3.WithKeysOnly())
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Key) != entry(5, "z") {
		t.Fatalf("first window after c: %v %v", g, err)
	}
}

// A round's members arrive at its ready barrier and mark themselves
// running all at once; an etcd with thousands of proposals not yet applied
// answers some of those writes "too many requests" (20,000 nodes in
// bench/rdzvscale). The barrier and the marker ride that out within their
// timeout instead of failing the node's round.
func TestBarrierAndMarkerRideOutTooManyRequests(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Every second write (a Put, a Txn that writes) is refused as an
	// overloaded etcd refuses it, before it reaches the real etcd; reads
	// are not raft proposals and never refused so.
	var writes, refused atomic.Int64
	overloaded := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if (strings.HasSuffix(method, "/Put") || writesTxn(req)) && writes.Add(1)%2 == 1 {
			refused.Add(1)
			return status.Error(codes.ResourceExhausted, "etcdserver: too many requests")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(overloaded)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	lease, err := h.cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	defer h.cli.Revoke(context.WithoutCancel(ctx), lease.ID)
	b := NewBarrier(cli, "", h.job, 1, 1, "a", 0)
	if err := b.Arrive(ctx); err != nil {
		t.Fatalf("arrive at the barrier of an overloaded etcd: %v", err)
	}
	if err := b.Wait(ctx); err != nil {
		t.Fatalf("pass the barrier of an overloaded etcd: %v", err)
	}
	m := NewRunningMarker(cli, "", h.job, "a", lease.ID, 0)
	if err := m.Mark(ctx, 1); err != nil {
		t.Fatalf("mark running on an overloaded etcd: %v", err)
	}
	if n, err := RunningNodes(ctx, h.cli, "", h.job, 0); err != nil || n != 1 {
		t.Fatalf("running nodes after the mark: %d %v, want 1", n, err)
	}
	if refused.Load() < 3 {
		t.Fatalf("only %d writes were refused; the test did not overload anything", refused.Load())
	}
}

// writesTxn says whether req is a transaction that may write.
func writesTxn(req any) bool {
	tr, ok := req.(*pb.TxnRequest)
	if !ok {
		return false
	}
	for _, op := range append(tr.Success, tr.Failure...) {
		if op.GetRequestPut() != nil || op.GetRequestDeleteRange() != nil {
			return true
		}
	}
	return false
}

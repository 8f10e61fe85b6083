package rendezvous

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
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

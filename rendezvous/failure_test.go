package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/tcpproxy"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"go.uber.org/zap"
)

// Fencing: a node partitioned from etcd (its client goes through a proxy
// that is cut) sees LeaseLost before the others form a round that reuses
// its rank, and within its TTL.
func TestFencingPartitionedNode(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	proxy, err := tcpproxy.New(strings.TrimPrefix(etcd.Endpoints[0], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	pcli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + proxy.Addr()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer pcli.Close()

	a := h.node(h.cfg("a", 2, 3))
	if err := a.register(ctx); err != nil {
		t.Fatal(err)
	}
	p := h.node(h.cfg("p", 2, 3), pcli) // joins second: rank 1
	if err := p.register(ctx); err != nil {
		t.Fatal(err)
	}
	b := h.node(h.cfg("b", 2, 3))
	rs := mustJoinAll(t, ctx, a, p, b)
	if rankOf(rs, "p") != 1 {
		t.Fatalf("partitioned node should hold rank 1: %+v", rs)
	}
	ttl := 2 * time.Second

	cut := time.Now()
	proxy.Cut()
	lostc := make(chan time.Time, 1)
	go func() {
		select {
		case <-p.LeaseLost():
			lostc <- time.Now()
		case <-ctx.Done():
		}
	}()
	// The others notice the expired lease and re-form; b takes rank 1.
	ch := nextAll(t, ctx, []*Node{a, b}, []*Round{rs[0], rs[2]})
	if ch[0].Reason != MemberLost {
		t.Fatalf("change: %+v", ch[0])
	}
	rs2 := mustJoinAll(t, ctx, a, b)
	reused := time.Now()
	if rankOf(rs2, "b") != 1 {
		t.Fatalf("expected b to take the partitioned node's rank 1: %+v", rs2)
	}
	var lost time.Time
	select {
	case lost = <-lostc:
	case <-ctx.Done():
		t.Fatal("LeaseLost never fired on the partitioned node")
	}
	if !lost.Before(reused) {
		t.Fatalf("LeaseLost at +%s, but rank 1 was reused at +%s", lost.Sub(cut), reused.Sub(cut))
	}
	if lost.Sub(cut) > ttl {
		t.Fatalf("LeaseLost %s after the cut; TTL is %s", lost.Sub(cut), ttl)
	}
	if _, err := p.Next(ctx, rs[1]); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Next on the fenced node: %v", err)
	}
	t.Logf("cut +0, LeaseLost +%s, rank reused +%s", lost.Sub(cut).Round(time.Millisecond), reused.Sub(cut).Round(time.Millisecond))
	p.crash() // its client cannot reach etcd to revoke
}

// An etcd that goes away gives a clear error within the lease TTL, not a
// silent hang.
func TestEtcdGoesAway(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := etcdembed.Start(ctx, etcdembed.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			srv.Close()
		}
	}()
	h := newHarness(t)
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	a, b := h.node(h.cfg("a", 1, 2), cli), h.node(h.cfg("b", 1, 2), cli)
	rs := mustJoinAll(t, ctx, a, b)
	// etcd's graceful stop keeps answering keepalives until it is done, so
	// the lease is alive until Close returns.
	srv.Close()
	closed = true
	gone := time.Now()
	_, err = a.Next(ctx, rs[0])
	if !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), "no keepalive") || !strings.Contains(err.Error(), "last error") {
		t.Fatalf("want a lease-lost error naming the keepalive failure, got %v", err)
	}
	if took := time.Since(gone); took > 2*time.Second {
		t.Fatalf("noticed etcd gone after %s (TTL 2s)", took)
	}
	t.Logf("error after %s: %v", time.Since(gone).Round(time.Millisecond), err)
	a.crash()
	b.crash()
}

// Malformed values in etcd give errors that name the key; nothing panics.
func TestMalformedRecords(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := newKeys(fleet.DefaultPrefix, h.job)

	// A garbage round record: Join fails at once, naming the key.
	h.put(ctx, k.Head, "{not json")
	n := h.node(h.cfg("a", 2, 2))
	_, err := n.Join(ctx)
	if err == nil || !strings.Contains(err.Error(), k.Head) || !strings.Contains(err.Error(), "malformed round record") {
		t.Fatalf("join on a garbage round record: %v", err)
	}
	_ = n.Close()

	// A garbage target is ignored with an error log naming the key; the
	// round is sized as if none were set. The closer replaces the garbage
	// round record.
	h.put(ctx, k.desired, "lots")
	nodes := h.register(ctx, h.cfg("b", 1, 2), h.cfg("c", 1, 2))
	waitFor(t, 10*time.Second, "the closer to replace the garbage round record", func() bool {
		g, err := h.cli.Get(ctx, k.Head)
		return err == nil && len(g.Kvs) > 0 && strings.HasPrefix(string(g.Kvs[0].Value), `{"v":1`)
	})
	for _, n := range nodes {
		waitFor(t, 5*time.Second, "the nodes to see the replaced round record", func() bool {
			n.mu.Lock()
			defer n.mu.Unlock()
			return n.headErr == nil
		})
	}
	rs := mustJoinAll(t, ctx, nodes...)
	if rs[0].NumNodes != 2 || rs[0].Target != 0 {
		t.Fatalf("round with a garbage target: %+v", rs[0])
	}
	if logs := h.logs.String(); !strings.Contains(logs, "malformed desired record at "+k.desired) {
		t.Fatalf("no log naming the bad target key:\n%s", logs)
	}

	// A garbage restart count never stops the job: its last good value is
	// used (here 2), with a log naming the key; with no good value, 0.
	h.put(ctx, k.restarts, "2")
	h.put(ctx, k.restarts, "-3")
	if n, err := nodes[0].Restarts(ctx); err != nil || n != 2 || !strings.Contains(h.logs.String(), "malformed restart count at "+k.restarts) {
		t.Fatalf("Restarts with a garbage count: %d, %v; want the last good 2 and a log naming %s", n, err, k.restarts)
	}
	if _, err := nodes[0].ReportFailure(ctx, rs[0], "x", ""); err != nil {
		t.Fatalf("ReportFailure with a garbage count: %v", err)
	}
	// The closer counts the failure on its own time: once it has, nothing
	// else writes the count while the test replaces it (a count written
	// after the delete was the only good value, and was used).
	waitFor(t, 10*time.Second, "the closer to count the reported failure", func() bool {
		return strings.Contains(h.logs.String(), "counted a job restart")
	})
	h.cli.Delete(ctx, k.restarts)
	h.put(ctx, k.restarts, "lots")
	if n, err := nodes[0].Restarts(ctx); err != nil || n != 0 {
		t.Fatalf("Restarts with no good value ever: %d, %v; want 0", n, err)
	}

	// A garbage member record is ignored by the closer, with a log naming it.
	h.put(ctx, k.Member("zz"), `{"addr":""}`)
	waitFor(t, 5*time.Second, "a log naming the bad member record", func() bool {
		return strings.Contains(h.logs.String(), "malformed member record at "+k.Member("zz"))
	})
}

// Decoders return errors naming the key for any input; they never panic.
func TestDecodersRejectGarbage(t *testing.T) {
	const key = "/hyperpodrun/jobs/j/rdzv/r/head"
	for _, v := range []string{
		"", "null", "[]", `{"v":2,"round":1,"state":"open"}`, `{"v":1,"round":0,"state":"open"}`,
		`{"v":1,"round":1,"state":"weird"}`, `{"v":1,"round":1,"state":"closed","nodes":2,"world":2,"chunks":1,"nonce":"x"}`,
		`{"v":1,"round":1,"state":"proposed","nodes":2,"world":1,"chunks":1,"nonce":"x"}`,
		`{"v":1,"round":1,"state":"proposed","nodes":2,"world":2,"chunks":3,"nonce":"x"}`,
	} {
		if _, err := decodeHeader(key, []byte(v)); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("decodeHeader(%q): %v", v, err)
		}
	}
	for _, v := range []string{"1 2", "x 0 1 n a", "0 0 0 n a", "5 0 1 n a", "0 0 1 n a extra"} {
		if _, err := decodeChunk(key, []byte(v+"\n"), "", 3); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("decodeChunk(%q): %v", v, err)
		}
	}
	for _, v := range []string{"", "x", "-1", "1.5", "9999999999999999999999"} {
		if _, err := fleet.ParseCount(key, []byte(v), "restart count", 0); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("ParseCount(%q): %v", v, err)
		}
	}
	rng := rand.New(rand.NewSource(1))
	for range 2000 {
		b := make([]byte, rng.Intn(64))
		rng.Read(b)
		_, _ = decodeHeader(key, b)
		_, _ = decodeChunk(key, b, "", 4)
		_, _ = decodeChunk(key, b, "n", 4)
		_, _ = decodeMember(key, b)
		_, _ = decodeAck(key, b)
	}
	// Round trip.
	ms := []Member{{NodeID: "a", Addr: "h1", LocalWorldSize: 2, GroupRank: 0, BaseRank: 0}, {NodeID: "b", Addr: "h2", LocalWorldSize: 1, GroupRank: 1, BaseRank: 2}}
	for _, chunks := range []int{1, 2} {
		var all []Member
		for i, c := range encodeChunks(ms, chunks) {
			got, err := decodeChunk(fmt.Sprint(i), c, "", 2)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, got...)
		}
		if len(all) != 2 {
			t.Fatalf("round trip: %+v", all)
		}
	}
}

// The predecessor search finds the youngest older queue entry through
// windows of growing size, whatever the distance.
func TestPredecessorWindows(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := h.node(h.cfg("x", 1, 1))
	for _, r := range []int64{5, 100, 1000, 50000} {
		h.put(ctx, n.k.QueueKey(r), fmt.Sprint(r))
	}
	for my, want := range map[int64]int64{50001: 50000, 60000: 50000, 49999: 1000, 1001: 1000, 999: 100, 101: 100, 64: 5, 6: 5, 5: 0, 2: 0} {
		for _, prev := range []predResult{{}, {rev: 1}} {
			p, err := n.predecessor(ctx, n.k.QueueKey(my), my, prev)
			if err != nil {
				t.Fatal(err)
			}
			got := int64(0)
			if p.key != "" {
				for _, r := range []int64{5, 100, 1000, 50000} {
					if p.key == n.k.QueueKey(r) {
						got = r
					}
				}
			}
			// prev.rev != 0 skips the first window (the registration
			// transaction searched it).
			if prev.rev != 0 && want > my-1-firstWindow {
				continue
			}
			if got != want || !p.done {
				t.Errorf("predecessor of %d (prev %+v): got %d (%q), want %d", my, prev, got, p.key, want)
			}
		}
	}
}

// A closer steps down when an older entry appears in the election queue
// (an older node whose queue write lagged), and takes over again once it
// is gone; the closed round is not disturbed.
func TestCloserStepsDownForOlderEntry(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	nodes := h.register(ctx, h.cfg("a", 1, 2), h.cfg("b", 1, 2))
	rs := mustJoinAll(t, ctx, nodes...)
	older := nodes[0].k.QueueKey(1)
	h.put(ctx, older, "ghost")
	waitFor(t, 5*time.Second, "the closer to hand over", func() bool {
		return strings.Contains(h.logs.String(), "an older node entered the election; handing over")
	})
	if _, err := h.cli.Delete(ctx, older); err != nil {
		t.Fatal(err)
	}
	// a is the closer again: b leaving makes it form a round alone.
	if err := nodes[1].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	ch, err := nodes[0].Next(ctx, rs[0])
	if err != nil || ch.Reason != MemberLost || !strings.Contains(ch.Detail, "b") {
		t.Fatalf("change after b left: %+v %v (round must not have changed before)", ch, err)
	}
	r, err := nodes[0].Join(ctx)
	if err != nil || r.NumNodes != 1 {
		t.Fatalf("round after hand-back: %+v %v", r, err)
	}
}

package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// waitErr runs f in a goroutine and returns the channel of its result.
func waitErr(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

func recvWithin(t *testing.T, ch <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
		return nil
	}
}

func TestBarrierReleasesOnlyWhenEveryMemberArrived(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a := NewBarrier(h.cli, "", h.job, 3, 2, "a", 0)
	b := NewBarrier(h.cli, "", h.job, 3, 2, "b", 0)
	if err := a.Arrive(ctx); err != nil {
		t.Fatal(err)
	}
	// A member of another round does not count.
	if err := NewBarrier(h.cli, "", h.job, 4, 2, "c", 0).Arrive(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _, err := a.Arrived(ctx); err != nil || n != 1 {
		t.Fatalf("Arrived with a alone in round 3 = %d, %v; want 1", n, err)
	}
	// One of two members: a Wait whose caller gives up ends with the
	// caller's error, not as passed.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.Wait(gone); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with 1 of 2 members ready = %v, want the caller's context.Canceled", err)
	}
	done := waitErr(func() error { return a.Wait(ctx) })
	if err := b.Arrive(ctx); err != nil {
		t.Fatal(err)
	}
	if err := recvWithin(t, done, 10*time.Second, "Wait after both arrived"); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	// Arriving after everyone: Wait returns from the first read.
	if err := recvWithin(t, waitErr(func() error { return b.Wait(ctx) }), 10*time.Second, "a late Wait"); err != nil {
		t.Fatalf("late Wait = %v", err)
	}
}

func TestBarrierWaitEndsWithItsContext(t *testing.T) {
	h := newHarness(t)
	b := NewBarrier(h.cli, "", h.job, 1, 2, "a", 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := waitErr(func() error { return b.Wait(ctx) })
	cancel()
	if err := recvWithin(t, done, 10*time.Second, "Wait after cancel"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel = %v, want context.Canceled", err)
	}
}

func TestBarrierPruneOlderKeepsTheRound(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	for r := int64(1); r <= 3; r++ {
		if err := NewBarrier(h.cli, "", h.job, r, 1, "n", 0).Arrive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := NewBarrier(h.cli, "", h.job, 3, 1, "n", 0).PruneOlder(ctx); err != nil {
		t.Fatal(err)
	}
	keys := fleet.NewKeys(fleet.DefaultPrefix)
	resp, err := h.cli.Get(ctx, keys.ReadyPrefix(h.job), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, kv := range resp.Kvs {
		got = append(got, string(kv.Key))
	}
	if want := []string{keys.Ready(h.job, 2, "n"), keys.Ready(h.job, 3, "n")}; !slices.Equal(got, want) {
		t.Fatalf("ready keys after round 3 pruned = %v, want the rounds 2 and 3 kept: %v", got, want)
	}
}

// lease grants a lease for the test, revoked at cleanup.
func (h *harness) lease(ttl int64) clientv3.LeaseID {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := h.cli.Grant(ctx, ttl)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = h.cli.Revoke(ctx, l.ID)
	})
	return l.ID
}

func TestRunningMarkerWaitsForOlderWorkersOfOtherNodes(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	old := NewRunningMarker(h.cli, "", h.job, "old", h.lease(30), 0)
	same := NewRunningMarker(h.cli, "", h.job, "same", h.lease(30), 0)
	self := NewRunningMarker(h.cli, "", h.job, "self", h.lease(30), 0)
	for _, m := range []struct {
		m     *RunningMarker
		round int64
	}{{old, 4}, {same, 5}, {self, 1}} {
		if err := m.m.Mark(ctx, m.round); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := RunningNodes(ctx, h.cli, "", h.job, 0); err != nil || n != 3 {
		t.Fatalf("RunningNodes = %d, %v; want 3", n, err)
	}
	// Round 5 waits for the node still running round 4, not for a node of
	// round 5 nor for its own (stale) marker.
	older, _, err := self.Older(ctx, 5)
	if err != nil || !slices.Equal(older, []string{"old"}) {
		t.Fatalf("Older(5) = %v, %v; want [old]", older, err)
	}
	seen := make(chan []string, 10)
	done := waitErr(func() error {
		return self.WaitOlderGone(ctx, 5, func(n []string) { seen <- n })
	})
	select {
	case n := <-seen:
		if !slices.Equal(n, []string{"old"}) {
			t.Fatalf("waiting for %v, want [old]", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitOlderGone never said what it waits for")
	}
	if err := old.Clear(ctx); err != nil {
		t.Fatal(err)
	}
	if err := recvWithin(t, done, 10*time.Second, "WaitOlderGone after the old marker was cleared"); err != nil {
		t.Fatalf("WaitOlderGone = %v", err)
	}
}

func TestRunningMarkerGoesWithItsLease(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	lease := h.lease(30)
	dead := NewRunningMarker(h.cli, "", h.job, "dead", lease, 0)
	if err := dead.Mark(ctx, 1); err != nil {
		t.Fatal(err)
	}
	self := NewRunningMarker(h.cli, "", h.job, "self", h.lease(30), 0)
	done := waitErr(func() error { return self.WaitOlderGone(ctx, 2, nil) })
	if _, err := h.cli.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if err := recvWithin(t, done, 10*time.Second, "WaitOlderGone after the lease was revoked"); err != nil {
		t.Fatalf("WaitOlderGone = %v", err)
	}
	// A marker under a lease that is gone is refused as a lost lease.
	if err := dead.Mark(ctx, 3); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Mark under a revoked lease = %v, want ErrLeaseLost", err)
	}
	if err := NewRunningMarker(h.cli, "", h.job, "none", 0, 0).Mark(ctx, 3); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Mark without a lease = %v, want ErrLeaseLost", err)
	}
}

func TestBarrierPassesOnlyAfterOlderWorkersOutsideTheRoundAreGone(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	keys := fleet.NewKeys(fleet.DefaultPrefix)
	// A node that left the job (not in round 5) still checkpoints with its
	// workers of round 4; a member's own stale marker does not count.
	old := NewRunningMarker(h.cli, "", h.job, "old", h.lease(30), 0)
	if err := old.Mark(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if err := NewRunningMarker(h.cli, "", h.job, "b", h.lease(30), 0).Mark(ctx, 4); err != nil {
		t.Fatal(err)
	}
	a := NewBarrier(h.cli, "", h.job, 5, 2, "a", 0)
	b := NewBarrier(h.cli, "", h.job, 5, 2, "b", 0)
	for _, m := range []*Barrier{a, b} {
		if err := m.Arrive(ctx); err != nil {
			t.Fatal(err)
		}
	}
	done := waitErr(func() error { return b.Wait(ctx) })
	doneA := waitErr(func() error { return a.Wait(ctx) })
	if err := old.Clear(ctx); err != nil {
		t.Fatal(err)
	}
	resp, err := h.cli.Get(ctx, keys.Running(h.job, "old"))
	if err != nil {
		t.Fatal(err)
	}
	cleared := resp.Header.Revision
	for _, ch := range []<-chan error{done, doneA} {
		if err := recvWithin(t, ch, 10*time.Second, "Wait after the older workers stopped"); err != nil {
			t.Fatalf("Wait = %v", err)
		}
	}
	// The barrier passed after the old node's workers were gone, not before.
	p, err := h.cli.Get(ctx, passKey(keys, h.job, 5))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Kvs) != 1 || p.Kvs[0].CreateRevision <= cleared {
		t.Fatalf("round 5 passed at %v, want once, after the old node's marker was cleared at revision %d", p.Kvs, cleared)
	}
	// Past the barrier, a member's marker check is one read.
	if err := NewRunningMarker(h.cli, "", h.job, "a", h.lease(30), 0).WaitOlderGone(ctx, 5, nil); err != nil {
		t.Fatalf("WaitOlderGone after the barrier = %v", err)
	}
}

// TestBarrierCostsLinearWatchEvents: a barrier of n members costs O(n)
// watch events (the counter's and one pass per member), not every member
// watching every other member's arrival (O(n^2): issue 27's 10,000 nodes).
func TestBarrierCostsLinearWatchEvents(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 300
	bs := make([]*Barrier, n)
	for i := range bs {
		bs[i] = NewBarrier(h.cli, "", h.job, 1, n, fmt.Sprintf("n%03d", i), 0)
	}
	before := watchEventsDelivered(t)
	errs := make(chan error, n)
	for _, b := range bs {
		go func() {
			if err := b.Arrive(ctx); err != nil {
				errs <- err
				return
			}
			errs <- b.Wait(ctx)
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := watchEventsDelivered(t) - before; got > 3*n {
		t.Fatalf("a barrier of %d members delivered %d watch events, want at most %d (linear)", n, got, 3*n)
	}
}

// watchEventsDelivered is how many watch events the embedded etcd has
// delivered to watchers so far (etcd_debugging_mvcc_events_total).
func watchEventsDelivered(t *testing.T) int {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "etcd_debugging_mvcc_events_total" {
			return int(mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	t.Fatal("etcd_debugging_mvcc_events_total not registered")
	return 0
}

package rendezvous

import (
	"context"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// A member's lease id, which its keys under jobs/ carry, is random (issue
// 22): a lease granted just before says nothing of it, so nobody who
// cannot read the job's keys can keep a dead member alive.
func TestMemberLeaseIDIsNotPredictable(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	before, err := h.cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer h.cli.Revoke(ctx, before.ID)
	nodes := h.register(ctx, h.cfg("a", 1, 1))
	k := newKeys(fleet.DefaultPrefix, h.job)
	r, err := h.cli.Get(ctx, k.Member("a"))
	if err != nil || len(r.Kvs) != 1 || r.Kvs[0].Lease == 0 {
		t.Fatalf("member key: %v %v", r, err)
	}
	member := r.Kvs[0].Lease
	if d := member - int64(before.ID); d > -1e6 && d < 1e6 {
		t.Errorf("member lease %x is within 1e6 of lease %x, granted just before", member, int64(before.ID))
	}
	if err := nodes[0].Close(); err != nil {
		t.Fatal(err)
	}
	if r, err := h.cli.Get(ctx, k.Member("a")); err != nil || len(r.Kvs) != 0 {
		t.Errorf("the closed member's key outlived its secret lease: %v %v", r, err)
	}
}

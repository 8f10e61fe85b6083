package coordinator

import (
	"context"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// A leader acts within its term, and the term ends with its lease: cut off
// from etcd, the leader's term is over (and it stops leading) by its
// lease's deadline less the margin, not when a later read fails.
func TestTheLeadersTermEndsWithItsLease(t *testing.T) {
	p, cli := etcdtest.StartProxied(t)
	const ttl = 3
	c := New(cli, Config{Identity: "c", SessionTTL: ttl, Resync: 100 * time.Millisecond, PruneInterval: 50 * time.Millisecond, Engine: policy.Config{MinStablePeriod: -1}})
	terms := make(chan context.Context, 1)
	c.cfg.afterHousekeeping = func() { // on the leader's loop
		select {
		case terms <- c.term.ctx:
		default:
		}
	}
	led := make(chan bool, 4)
	c.cfg.OnLeader = func(on bool) { led <- on }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	var term context.Context
	select {
	case term = <-terms:
	case <-time.After(20 * time.Second):
		t.Fatal("no housekeeping round in 20 s")
	}
	if term == nil || term.Err() != nil {
		t.Fatalf("the leader's loop runs outside a live term (%v)", term)
	}
	p.Cut()
	cutAt := time.Now()
	select {
	case <-term.Done():
		// The lease's deadline is at most ttl after the cut; the term
		// ends termMargin before it.
		if d := time.Since(cutAt); d > ttl*time.Second-termMargin(ttl)+time.Second {
			t.Fatalf("the term ended %v after the cut; its lease's TTL is %d s", d, ttl)
		}
	case <-time.After(2 * ttl * time.Second):
		t.Fatalf("the term outlived its lease (%d s TTL) by %d s while cut off from etcd", ttl, ttl)
	}
	for {
		select {
		case on := <-led:
			if !on {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the leader still leads 10 s after its term ended")
		}
	}
}

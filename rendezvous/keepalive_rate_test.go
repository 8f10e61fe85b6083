package rendezvous

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// A node renews its lease every TTL/3 while it has no round (registering,
// waiting: no workers a fence could stop), which halves etcd's keepalives
// during a mass join, and every TTL/6 from its first round on, so an etcd
// leader change never leaves a node with workers an old proof.
func TestKeepaliveIsTwiceAsOftenOnceJoined(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = 3 * time.Second
	var (
		mu    sync.Mutex
		sends []time.Time // when each proven keepalive (or the grant) was sent
	)
	cfg := h.cfg("a", 2, 2)
	cfg.LeaseTTL = ttl
	cfg.OnRenew = func(r Renewal) {
		mu.Lock()
		sends = append(sends, r.Expiry.Add(-ttl))
		mu.Unlock()
	}
	renewals := func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(sends)
	}
	a := h.register(ctx, cfg)[0]
	waitFor(t, 15*time.Second, "5 renewals of a node waiting alone", func() bool { return len(renewals()) >= 5 })
	before := medianGap(renewals())

	b := h.register(ctx, h.cfg("b", 2, 2))[0]
	mustJoinAll(t, ctx, a, b)
	joined := time.Now()
	after := func() []time.Time {
		var out []time.Time
		for _, s := range renewals() {
			if s.After(joined) {
				out = append(out, s)
			}
		}
		return out
	}
	waitFor(t, 15*time.Second, "6 renewals after the join", func() bool { return len(after()) >= 6 })
	afterGap := medianGap(after())
	if before < 900*time.Millisecond || before > 1300*time.Millisecond {
		t.Errorf("a node without a round renewed every %s (median), want TTL/3 = 1s", before)
	}
	if afterGap > 700*time.Millisecond {
		t.Errorf("a node in a round renewed every %s (median), want TTL/6 = 500ms", afterGap)
	}
}

// medianGap is the median time between consecutive times.
func medianGap(ts []time.Time) time.Duration {
	var gaps []time.Duration
	for i := 1; i < len(ts); i++ {
		gaps = append(gaps, ts[i].Sub(ts[i-1]))
	}
	if len(gaps) == 0 {
		return 0
	}
	slices.Sort(gaps)
	return gaps[len(gaps)/2]
}

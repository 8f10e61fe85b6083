package quietlease

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
)

func TestDecide(t *testing.T) {
	sent := time.Unix(1000, 0)
	deadline := sent.Add(5 * time.Second)
	ok := &clientv3.LeaseKeepAliveResponse{TTL: 6}
	for _, tc := range []struct {
		rule      string
		resp      *clientv3.LeaseKeepAliveResponse
		err       error
		ended     bool
		now       time.Time
		plan      time.Time // zero: the deadline
		goOn      bool
		wait      time.Duration
		newDL     time.Time
		delivered bool
	}{
		{rule: "an answer renews again after a third of its TTL, its deadline counted from the send", resp: ok, now: sent.Add(time.Second), goOn: true, wait: 2 * time.Second, newDL: sent.Add(6 * time.Second), delivered: true},
		{rule: "an answer without a TTL (etcd no longer has the lease) stops the renewals", resp: &clientv3.LeaseKeepAliveResponse{TTL: 0}, now: sent},
		{rule: "an ended context stops the renewals, even after an answer", resp: ok, ended: true, now: sent},
		{rule: "a renewal given up is sent again at once", err: errGaveUp, now: sent.Add(time.Second), goOn: true, wait: 0},
		{rule: "a renewal given up at the deadline stops the renewals", err: errGaveUp, now: deadline},
		{rule: "another error retries after a pause while the lease lasts", err: errors.New("unavailable"), now: sent, goOn: true, wait: retryAfter},
		{rule: "another error stops the renewals when the lease ends before the retry", err: errors.New("unavailable"), now: deadline.Add(-retryAfter)},
		{rule: "another error near the terms' end retries within half the time left to it", err: errors.New("unavailable"), now: sent.Add(3900 * time.Millisecond), plan: sent.Add(4 * time.Second), goOn: true, wait: 50 * time.Millisecond},
		{rule: "another error after the terms' end retries after a pause", err: errors.New("unavailable"), now: sent.Add(4100 * time.Millisecond), plan: sent.Add(4 * time.Second), goOn: true, wait: retryAfter},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			delivered := false
			plan := deadline
			if !tc.plan.IsZero() {
				plan = tc.plan
			}
			r, goOn := decide(sent, tc.now, plan, deadline, tc.resp, tc.err, tc.ended, func() { delivered = true })
			if goOn != tc.goOn || r.wait != tc.wait || !r.deadline.Equal(tc.newDL) || delivered != tc.delivered {
				t.Fatalf("decide = %+v, %v, delivered %v; want wait %v, deadline %v, go on %v, delivered %v", r, goOn, delivered, tc.wait, tc.newDL, tc.goOn, tc.delivered)
			}
		})
	}
}

func TestPlanned(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		rule     string
		deadline time.Duration // after now
		margins  []time.Duration
		want     time.Duration // after now
	}{
		{rule: "a lease without terms plans against its deadline", deadline: 5 * time.Second, want: 5 * time.Second},
		{rule: "a lease with terms plans against the earliest term's end", deadline: 5 * time.Second, margins: []time.Duration{time.Second, 300 * time.Millisecond}, want: 4 * time.Second},
		{rule: "once the terms have ended, against the deadline", deadline: 500 * time.Millisecond, margins: []time.Duration{time.Second}, want: 500 * time.Millisecond},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			st := &leaseState{deadline: now.Add(tc.deadline)}
			for _, m := range tc.margins {
				st.terms = append(st.terms, &term{margin: m})
			}
			if got := st.planned(now).Sub(now); got != tc.want {
				t.Fatalf("planned = now + %v, want + %v", got, tc.want)
			}
		})
	}
}

func TestGiveUpAt(t *testing.T) {
	sent := time.Unix(1000, 0)
	for _, tc := range []struct {
		rule     string
		deadline time.Duration // after sent
		interval time.Duration
		want     time.Duration // after sent
	}{
		{rule: "a renewal is waited for an interval when the deadline is far", deadline: 6 * time.Second, interval: 1667 * time.Millisecond, want: 1667 * time.Millisecond},
		{rule: "near the deadline an attempt is a third of the time left, so that more fit", deadline: 4500 * time.Millisecond, interval: 2 * time.Second, want: 1500 * time.Millisecond},
		{rule: "an attempt is waited for a second at least", deadline: 1500 * time.Millisecond, interval: 1667 * time.Millisecond, want: time.Second},
		{rule: "no attempt is waited for past the deadline", deadline: 800 * time.Millisecond, interval: 1667 * time.Millisecond, want: 800 * time.Millisecond},
		{rule: "a lease whose TTL is unknown is waited for until its deadline", deadline: 10 * time.Second, interval: 0, want: 10 * time.Second},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := giveUpAt(sent, sent.Add(tc.deadline), tc.interval).Sub(sent); got != tc.want {
				t.Fatalf("giveUpAt = sent + %v, want + %v", got, tc.want)
			}
		})
	}
}

// lessorRunning reports whether clientv3's own keepalive loops run in
// this process.
func lessorRunning() bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Contains(string(buf[:n]), "(*lessor).sendKeepAliveLoop")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// A session on a NewClient outlives its TTL several times over, with no
// clientv3 keepalive loop running, and ends when its lease is revoked.
func TestASessionOutlivesItsTTLWithoutClientv3sLoops(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc, ql := NewClient(ctx, cli)
	sess, err := concurrency.NewSession(sc, concurrency.WithTTL(2))
	if err != nil {
		t.Fatal(err)
	}
	term, endTerm := ql.Context(context.Background(), sess.Lease(), 500*time.Millisecond)
	defer endTerm()
	start := time.Now()
	for time.Since(start) < 7*time.Second {
		select {
		case <-sess.Done():
			t.Fatalf("the session ended after %v, its TTL being 2 s", time.Since(start))
		case <-time.After(100 * time.Millisecond):
		}
	}
	tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Second)
	ttl, err := cli.TimeToLive(tctx, sess.Lease())
	tcancel()
	if err != nil || ttl.TTL <= 0 {
		t.Fatalf("after 7 s the lease has TTL %v (%v); want it alive", ttl, err)
	}
	if term.Err() != nil {
		t.Fatal("the term ended while its lease was renewed")
	}
	if d, ok := ql.Deadline(sess.Lease()); !ok || time.Until(d) <= 0 || time.Until(d) > 2*time.Second {
		t.Fatalf("the lease's deadline is %v from now (known: %v); want within its 2 s TTL", time.Until(d), ok)
	}
	if lessorRunning() {
		t.Fatal("clientv3's keepalive loop runs: the session's lease is not kept alive by quietlease")
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err = cli.Revoke(rctx, sess.Lease())
	rcancel()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sess.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the session did not end within 5 s of its lease's revocation")
	}
	select {
	case <-term.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the term did not end with its lease")
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, ok := ql.Deadline(sess.Lease()); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a lease no longer kept alive still has a deadline")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The renewals stop, and the channel closes, when the context ends; and
// a lease that is not there is never renewed.
func TestKeepAliveEnds(t *testing.T) {
	_, cli := etcdtest.Start(t)
	l := New(cli)
	gctx, gcancel := context.WithTimeout(context.Background(), 5*time.Second)
	g, err := cli.Grant(gctx, 30)
	gcancel()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, _ := l.KeepAlive(ctx, g.ID)
	select {
	case r, ok := <-ch:
		if !ok || r.TTL <= 0 {
			t.Fatalf("first renewal: %v, %v", r, ok)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal in 5 s")
	}
	cancel()
	waitClosed(t, ch, "after its context ended")

	missing, _ := l.KeepAlive(context.Background(), clientv3.LeaseID(0x7eadbeef))
	waitClosed(t, missing, "for a lease etcd does not have")
}

func waitClosed(t *testing.T, ch <-chan *clientv3.LeaseKeepAliveResponse, when string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case r, ok := <-ch:
			if !ok {
				return
			}
			if r.TTL <= 0 {
				t.Fatalf("a renewal without a TTL was delivered %s", when)
			}
		case <-deadline:
			t.Fatalf("the channel stayed open %s", when)
		}
	}
}

// Cut off from etcd, the renewals stop, and the session ends, by the
// lease's last known deadline: not after the cut is repaired.
func TestACutOffSessionEndsByItsDeadline(t *testing.T) {
	p, cli := etcdtest.StartProxied(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc, ql := NewClient(ctx, cli)
	sess, err := concurrency.NewSession(sc, concurrency.WithTTL(3))
	if err != nil {
		t.Fatal(err)
	}
	if unknown, _ := ql.Context(context.Background(), sess.Lease()+1, 0); unknown.Err() == nil {
		t.Fatal("the term of a lease the Lease does not know has not ended")
	}
	term, endTerm := ql.Context(context.Background(), sess.Lease(), time.Second)
	defer endTerm()
	p.Cut()
	cutAt := time.Now()
	select {
	case <-term.Done():
		if d := time.Since(cutAt); d > 2*time.Second+500*time.Millisecond {
			t.Fatalf("the term ended %v after the cut; the lease's TTL is 3 s, the term's margin 1 s", d)
		}
		select {
		case <-sess.Done():
			t.Fatal("the session ended before its term")
		default:
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the term outlived its lease by 7 s while cut off from etcd")
	}
	select {
	case <-sess.Done():
		if d := time.Since(cutAt); d > 3*time.Second+time.Second {
			t.Fatalf("the session ended %v after the cut; its TTL is 3 s", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session outlived its lease by 7 s while cut off from etcd")
	}
}

// On a 3-member cluster, a session outlives each member frozen in turn
// for longer than its TTL, the leader included: a renewal stuck on a
// frozen member is given up after an interval and sent again, to a
// member that answers. A stream kept until the deadline would end the
// session when its own member froze.
func TestASessionOutlivesEachMemberFrozen(t *testing.T) {
	c := etcdtest.StartClusterArgs(t, 3, "--heartbeat-interval", "50", "--election-timeout", "500")
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sc, ql := NewClient(ctx, cli)
	sess, err := concurrency.NewSession(sc, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	// The coordinator's term on it: a margin of a sixth of the TTL.
	term, endTerm := ql.Context(context.Background(), sess.Lease(), 5*time.Second/6)
	defer endTerm()
	for _, m := range c.Members {
		m.Pause()
		frozen := time.Now()
		for time.Since(frozen) < 6*time.Second {
			select {
			case <-sess.Done():
				m.Resume()
				t.Fatalf("the session ended %v after member %s froze; its TTL is 5 s", time.Since(frozen).Round(time.Millisecond), m.Name)
			case <-term.Done():
				m.Resume()
				t.Fatalf("the term ended %v after member %s froze, its lease well", time.Since(frozen).Round(time.Millisecond), m.Name)
			case <-time.After(100 * time.Millisecond):
			}
		}
		m.Resume()
		c.Leader() // the cluster has a leader again before the next freeze
	}
	tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer tcancel()
	if ttl, err := cli.TimeToLive(tctx, sess.Lease()); err != nil || ttl.TTL <= 0 {
		t.Fatalf("after the freezes the lease has TTL %v (%v); want it alive", ttl, err)
	}
}

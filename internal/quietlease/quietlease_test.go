package quietlease

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/tcpproxy"
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
		deadline  time.Time
		go_       bool
		wait      time.Duration
		newDL     time.Time
		delivered bool
	}{
		{rule: "an answer renews again after a third of its TTL, its deadline counted from the send", resp: ok, deadline: deadline, go_: true, wait: 2 * time.Second, newDL: sent.Add(6 * time.Second), delivered: true},
		{rule: "a lease etcd no longer has stops the renewals", err: rpctypes.ErrLeaseNotFound, deadline: deadline},
		{rule: "an answer without a TTL stops the renewals", resp: &clientv3.LeaseKeepAliveResponse{TTL: 0}, deadline: deadline},
		{rule: "an ended context stops the renewals, even after an answer", resp: ok, ended: true, deadline: deadline},
		{rule: "another error retries soon while the lease lasts", err: errors.New("unavailable"), deadline: deadline, go_: true, wait: retryAfter},
		{rule: "another error stops the renewals when the lease ends before the retry", err: errors.New("unavailable"), deadline: sent.Add(retryAfter)},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			delivered := false
			r, goOn := decide(sent, tc.deadline, tc.resp, tc.err, tc.ended, func() { delivered = true })
			if goOn != tc.go_ || r.wait != tc.wait || !r.deadline.Equal(tc.newDL) || delivered != tc.delivered {
				t.Fatalf("decide = %+v, %v, delivered %v; want wait %v, deadline %v, go on %v, delivered %v", r, goOn, delivered, tc.wait, tc.newDL, tc.go_, tc.delivered)
			}
		})
	}
}

// lessorRunning reports whether clientv3's own keepalive loops run in
// this process.
func lessorRunning() bool {
	buf := make([]byte, 1<<20)
	return strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*lessor).sendKeepAliveLoop")
}

// A session on a NewClient outlives its TTL several times over, with no
// clientv3 keepalive loop running, and ends when its lease is revoked.
func TestASessionOutlivesItsTTLWithoutClientv3sLoops(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sess, err := concurrency.NewSession(NewClient(ctx, cli), concurrency.WithTTL(2))
	if err != nil {
		t.Fatal(err)
	}
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
	srv, _ := etcdtest.Start(t)
	p, err := tcpproxy.New(strings.TrimPrefix(srv.Endpoints[0], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + p.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sess, err := concurrency.NewSession(NewClient(ctx, cli), concurrency.WithTTL(3))
	if err != nil {
		t.Fatal(err)
	}
	p.Cut()
	cutAt := time.Now()
	select {
	case <-sess.Done():
		if d := time.Since(cutAt); d > 3*time.Second+time.Second {
			t.Fatalf("the session ended %v after the cut; its TTL is 3 s", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session outlived its lease by 7 s while cut off from etcd")
	}
}

// Package quietlease keeps an etcd lease alive with one timer per lease
// and nothing else, so that a process that holds a lease and does nothing
// else sleeps between renewals.
//
// clientv3's own KeepAlive starts, with the first lease it keeps alive,
// two loops that wake the process every 500 ms and every second whatever
// the lease's TTL, and a stream that stays open: about three wake-ups a
// second. A coordinator that waits for its next input with a large heap
// pays for each one (on the project's own VM, about 10 us of CPU per MB
// of resident memory, 5 to 10 ms a wake-up), and they were most of its
// idle CPU. A lease kept alive here is renewed every TTL/3 on a stream
// of its own (reopened after an error), and between renewals nothing of
// it runs.
//
// Lease wraps a clientv3.Lease and replaces only its KeepAlive; set it as
// the Lease of a client that a concurrency.Session uses (see NewClient),
// and the session's lease is kept alive the quiet way.
package quietlease

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// firstBound bounds the first renewal of a lease not granted by this
// Lease, whose TTL is not known yet.
const firstBound = 10 * time.Second

// retryAfter is how long a failed renewal waits before the next try (the
// lease's deadline still bounds them).
const retryAfter = 250 * time.Millisecond

// Lease is a clientv3.Lease whose KeepAlive renews on one timer. Every
// other call goes to the client's own Lease.
type Lease struct {
	clientv3.Lease
	remote pb.LeaseClient

	mu      sync.Mutex
	granted map[clientv3.LeaseID]time.Time // the deadlines of leases Grant granted, until kept alive
}

// New returns cli's Lease with a quiet KeepAlive, over cli's connection
// and credentials.
func New(cli *clientv3.Client) *Lease {
	return &Lease{Lease: cli.Lease, remote: clientv3.RetryLeaseClient(cli), granted: map[clientv3.LeaseID]time.Time{}}
}

// Grant grants a lease, like clientv3's, and notes its deadline for
// KeepAlive: the lease cannot outlive the TTL counted from the request.
func (l *Lease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	sent := time.Now()
	r, err := l.Lease.Grant(ctx, ttl)
	if err == nil && r.TTL > 0 {
		l.mu.Lock()
		l.granted[r.ID] = sent.Add(time.Duration(r.TTL) * time.Second)
		l.mu.Unlock()
	}
	return r, err
}

// NewClient returns a client for ctx's lifetime that shares cli's
// connection, KV and watches and keeps leases alive with a Lease. Cancel
// ctx to release it; do not Close it (that would close cli's watches and
// lessor too).
func NewClient(ctx context.Context, cli *clientv3.Client) *clientv3.Client {
	c := clientv3.NewCtxClient(ctx, clientv3.WithZapLogger(cli.GetLogger()))
	c.KV, c.Watcher, c.Lease = cli.KV, cli.Watcher, New(cli)
	return c
}

// KeepAlive renews id at once and then every third of the TTL the last
// renewal returned, until ctx ends or the lease is gone: etcd says it is
// not found, or no renewal succeeded before the last one's TTL ran out.
// Each renewal's answer is sent on the returned channel (dropped when
// the channel is full, like clientv3's), which is closed when the
// renewals stop.
func (l *Lease) KeepAlive(ctx context.Context, id clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	ch := make(chan *clientv3.LeaseKeepAliveResponse, 16)
	go l.keepAlive(ctx, id, ch)
	return ch, nil
}

func (l *Lease) keepAlive(ctx context.Context, id clientv3.LeaseID, ch chan<- *clientv3.LeaseKeepAliveResponse) {
	defer close(ch)
	var st stream
	defer st.close()
	// Until the first answer the lease's deadline is known only if it was
	// granted here.
	deadline := time.Now().Add(firstBound)
	l.mu.Lock()
	if d, ok := l.granted[id]; ok {
		deadline = d
		delete(l.granted, id)
	}
	l.mu.Unlock()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := time.Now()
		if !sent.Before(deadline) {
			return
		}
		resp, err := l.renew(ctx, &st, id, deadline)
		next, ok := decide(sent, deadline, resp, err, ctx.Err() != nil, func() {
			select {
			case ch <- resp:
			default:
			}
		})
		if !ok {
			return
		}
		if !next.deadline.IsZero() {
			deadline = next.deadline
		}
		t.Reset(next.wait)
	}
}

// stream is the keepalive stream of one lease, kept open between
// renewals.
type stream struct {
	s      pb.Lease_LeaseKeepAliveClient
	ctx    context.Context
	cancel context.CancelFunc
}

func (st *stream) close() {
	if st.cancel != nil {
		st.cancel()
	}
	*st = stream{}
}

// renew sends one keepalive for id on st (opened when closed) and reads
// its answer by deadline; after an error st is closed, to be opened
// again (to another member, when the client has several) by the next
// renewal.
func (l *Lease) renew(ctx context.Context, st *stream, id clientv3.LeaseID, deadline time.Time) (*clientv3.LeaseKeepAliveResponse, error) {
	if st.s == nil {
		// Like clientv3's lessor: a member cut off from its cluster's
		// leader fails the stream rather than leave it unanswered.
		var sctx context.Context
		sctx, st.cancel = context.WithCancel(clientv3.WithRequireLeader(ctx))
		st.ctx = sctx
	}
	// Opening the stream, sending and the answer must all be done by the
	// deadline: past it, the stream is cut.
	cut := time.AfterFunc(time.Until(deadline), st.cancel)
	var err error
	if st.s == nil {
		st.s, err = l.remote.LeaseKeepAlive(st.ctx)
	}
	if err == nil {
		err = st.s.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)})
	}
	var r *pb.LeaseKeepAliveResponse
	if err == nil {
		r, err = st.s.Recv()
	}
	if !cut.Stop() && err != nil {
		err = context.DeadlineExceeded
	}
	if err != nil {
		st.close()
		return nil, err
	}
	return &clientv3.LeaseKeepAliveResponse{ResponseHeader: r.Header, ID: clientv3.LeaseID(r.ID), TTL: r.TTL}, nil
}

// renewal is what one renewal decided: when to renew next and, when it
// succeeded, the lease's new deadline.
type renewal struct {
	wait     time.Duration
	deadline time.Time
}

// decide is the rule after one renewal sent at sent: an answer with a
// TTL moves the deadline to sent+TTL (the renewal may have been handled
// at once) and the next renewal to a third of the TTL later; a lease
// etcd no longer has, or an ended context, stops the renewals; any other
// error retries after retryAfter, or stops them when the deadline would
// pass first. deliver is called for a good answer.
func decide(sent, deadline time.Time, resp *clientv3.LeaseKeepAliveResponse, err error, ended bool, deliver func()) (renewal, bool) {
	switch {
	case ended:
		return renewal{}, false
	case err == nil && resp != nil && resp.TTL > 0:
		deliver()
		ttl := time.Duration(resp.TTL) * time.Second
		return renewal{wait: ttl / 3, deadline: sent.Add(ttl)}, true
	case errors.Is(err, rpctypes.ErrLeaseNotFound), err == nil:
		return renewal{}, false
	case !sent.Add(retryAfter).Before(deadline):
		return renewal{}, false
	default:
		return renewal{wait: retryAfter}, true
	}
}

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
// Lease wraps a clientv3.Lease and replaces its KeepAlive; set it as the
// Lease of a client that a concurrency.Session uses (see NewClient), and
// the session's lease is kept alive the quiet way. It also knows how long
// each lease it keeps lasts at least (Deadline), and gives a context that
// ends before that (Context): the term of a leader whose lease this is.
package quietlease

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// firstBound bounds the first renewal of a lease not granted by this
// Lease, whose TTL is not known yet.
const firstBound = 10 * time.Second

// retryAfter is how long a renewal that failed at once (not one given
// up) waits before the next try; the lease's deadline still bounds them.
const retryAfter = 250 * time.Millisecond

// minAttempt is the shortest a renewal is waited for before it is given
// up, unless the lease's deadline comes first.
const minAttempt = time.Second

// errGaveUp: a renewal went unanswered for its attempt's time.
var errGaveUp = errors.New("the lease renewal went unanswered")

// Lease is a clientv3.Lease whose KeepAlive renews on one timer. Grant
// and Revoke go to the client's own Lease and note what they did; the
// other calls go to it unchanged, except Close.
type Lease struct {
	clientv3.Lease
	remote pb.LeaseClient

	mu     sync.Mutex
	leases map[clientv3.LeaseID]*leaseState // granted or kept alive here
}

// leaseState is what l knows of one lease.
type leaseState struct {
	deadline time.Time     // it lasts at least until then
	ttl      time.Duration // 0: unknown
	terms    []*term       // contexts to end before the deadline
}

// term is one Context: ended at the lease's deadline less margin.
type term struct {
	timer  *time.Timer
	margin time.Duration
	cancel context.CancelFunc
}

// planned is the deadline the renewals of st plan their attempts against:
// its terms' earliest end, so that a renewal failing for a while is tried
// again within the terms (a term must not end while the lease is well);
// the deadline itself once that end has passed.
func (st *leaseState) planned(now time.Time) time.Time {
	var m time.Duration
	for _, t := range st.terms {
		m = max(m, t.margin)
	}
	if p := st.deadline.Add(-m); now.Before(p) {
		return p
	}
	return st.deadline
}

// New returns cli's Lease with a quiet KeepAlive, over cli's connection
// and credentials.
func New(cli *clientv3.Client) *Lease {
	return &Lease{Lease: cli.Lease, remote: clientv3.RetryLeaseClient(cli), leases: map[clientv3.LeaseID]*leaseState{}}
}

// NewClient returns a client for ctx's lifetime that shares cli's
// connection, KV and watches and keeps leases alive with the Lease it
// also returns. Cancel ctx to release it; do not Close it (that would
// close cli's watches).
func NewClient(ctx context.Context, cli *clientv3.Client) (*clientv3.Client, *Lease) {
	l := New(cli)
	c := clientv3.NewCtxClient(ctx, clientv3.WithZapLogger(cli.GetLogger()))
	c.KV, c.Watcher, c.Lease = cli.KV, cli.Watcher, l
	return c, l
}

// Grant grants a lease, like clientv3's, and notes its deadline: the
// lease cannot end before its TTL counted from the request's send.
func (l *Lease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	sent := time.Now()
	r, err := l.Lease.Grant(ctx, ttl)
	if err == nil && r.TTL > 0 {
		d := time.Duration(r.TTL) * time.Second
		l.renewed(r.ID, sent.Add(d), d, true)
	}
	return r, err
}

// Revoke revokes a lease, like clientv3's; l forgets it first (its
// renewals stop at their next turn, its Contexts end), whatever etcd
// answers.
func (l *Lease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	l.end(id)
	return l.Lease.Revoke(ctx, id)
}

// Close does nothing: the client's own Lease is shared (NewClient).
func (l *Lease) Close() error { return nil }

// Deadline is the time until which lease id lasts at least, as its grant
// or last renewal here proves: etcd ends a lease no sooner than its TTL
// after it handled the request that granted or renewed it, and that is
// counted here from the request's send. ok is false for a lease neither
// granted nor kept alive by l, or no longer kept alive. Until it, no
// other holder can have taken what the lease holds (a leader's key). The
// time is Go's monotonic clock: a host suspended (not merely paused)
// does not count its sleep, so a holder that may be suspended must not
// rely on it.
func (l *Lease) Deadline(id clientv3.LeaseID) (deadline time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if st := l.leases[id]; st != nil {
		return st.deadline, true
	}
	return time.Time{}, false
}

// Context returns a context that ends margin before lease id's deadline
// unless a renewal moves it first, when the lease is no longer kept
// alive, or when parent ends: the term of the lease's holder, within
// which what the lease guards is still its own. Its timer is moved by
// each renewal and fires only when renewals fail, so it adds no wake-up.
// A lease l does not know gives a context already ended.
func (l *Lease) Context(parent context.Context, id clientv3.LeaseID, margin time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.leases[id]
	if st == nil {
		cancel()
		return ctx, cancel
	}
	t := &term{margin: margin, cancel: cancel, timer: time.AfterFunc(time.Until(st.deadline.Add(-margin)), cancel)}
	st.terms = append(st.terms, t)
	return ctx, func() {
		l.mu.Lock()
		t.timer.Stop()
		if st := l.leases[id]; st != nil {
			st.terms = slices.DeleteFunc(st.terms, func(x *term) bool { return x == t })
		}
		l.mu.Unlock()
		cancel()
	}
}

// renewed notes id's new deadline (and TTL, when known) and moves its
// terms' ends. A lease l no longer knows (revoked meanwhile) is noted
// only if create; it reports whether it was.
func (l *Lease) renewed(id clientv3.LeaseID, deadline time.Time, ttl time.Duration, create bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.leases[id]
	if st == nil {
		if !create {
			return false
		}
		st = &leaseState{}
		l.leases[id] = st
	}
	st.deadline = deadline
	if ttl > 0 {
		st.ttl = ttl
	}
	for _, t := range st.terms {
		t.timer.Reset(time.Until(deadline.Add(-t.margin)))
	}
	return true
}

// end forgets id and ends its terms.
func (l *Lease) end(id clientv3.LeaseID) {
	l.mu.Lock()
	st := l.leases[id]
	delete(l.leases, id)
	l.mu.Unlock()
	if st == nil {
		return
	}
	for _, t := range st.terms {
		t.timer.Stop()
		t.cancel()
	}
}

// KeepAlive renews id at once and then every third of the TTL the last
// renewal returned, until ctx ends or the lease is gone: etcd says it is
// not found, it was revoked through l, or no renewal succeeded before the
// lease's deadline. Each renewal's answer is sent on the returned channel
// (dropped when the channel is full, like clientv3's), which is closed
// when the renewals stop. One KeepAlive per lease: when it stops, l
// forgets the lease.
func (l *Lease) KeepAlive(ctx context.Context, id clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	ch := make(chan *clientv3.LeaseKeepAliveResponse, 16)
	go l.keepAlive(ctx, id, ch)
	return ch, nil
}

func (l *Lease) keepAlive(ctx context.Context, id clientv3.LeaseID, ch chan<- *clientv3.LeaseKeepAliveResponse) {
	defer close(ch)
	defer l.end(id) // its terms end before the channel closes
	var st stream
	defer st.close()
	// Until the first answer the lease's deadline and TTL are known only
	// if it was granted here.
	deadline, interval := time.Now().Add(firstBound), time.Duration(0)
	l.mu.Lock()
	s := l.leases[id]
	tracked := s != nil // l knows the lease: it stops when l forgets it (Revoke)
	if tracked {
		deadline, interval = s.deadline, s.ttl/3
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
		if _, known := l.Deadline(id); tracked && !known {
			return // revoked here
		}
		sent := time.Now()
		if !sent.Before(deadline) {
			return
		}
		plan := deadline
		l.mu.Lock()
		if s := l.leases[id]; s != nil {
			plan = s.planned(sent)
		}
		l.mu.Unlock()
		resp, err := l.renew(ctx, &st, id, giveUpAt(sent, plan, interval))
		next, ok := decide(sent, time.Now(), plan, deadline, resp, err, ctx.Err() != nil, func() {
			select {
			case ch <- resp:
			default:
			}
		})
		if !ok {
			return
		}
		if !next.deadline.IsZero() {
			deadline, interval = next.deadline, next.wait
			if !l.renewed(id, deadline, next.ttl, !tracked) {
				return // revoked here while the renewal was out
			}
			tracked = true
			// A third of the TTL after the send, not after a slow answer.
			next.wait = max(0, time.Until(sent.Add(next.wait)))
		}
		t.Reset(next.wait)
	}
}

// giveUpAt is when a renewal sent at sent is given up, to be sent again
// on a new stream (to another member, when the client has several): a
// stream stuck on a frozen member, or one cut off from its leader, would
// otherwise hold it until the deadline. An attempt is waited for an
// interval (a third of the TTL) at most, and a third of the time left
// before the deadline (the planned one: leaseState.planned) but at least
// minAttempt, so that several fit; never past the deadline. An interval
// of 0 (TTL unknown) waits to the deadline.
func giveUpAt(sent, deadline time.Time, interval time.Duration) time.Time {
	if interval <= 0 {
		return deadline
	}
	attempt := min(interval, max(minAttempt, deadline.Sub(sent)/3))
	if g := sent.Add(attempt); g.Before(deadline) {
		return g
	}
	return deadline
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
// its answer by giveUp (else errGaveUp); after an error, or an answer
// that came as the attempt was given up, st is closed, to be opened again
// (to another member, when the client has several) by the next renewal.
// etcd answers a lease it does not have with a TTL of 0, not an error.
func (l *Lease) renew(ctx context.Context, st *stream, id clientv3.LeaseID, giveUp time.Time) (*clientv3.LeaseKeepAliveResponse, error) {
	if st.s == nil {
		// Like clientv3's lessor: a member cut off from its cluster's
		// leader fails the stream rather than leave it unanswered.
		st.ctx, st.cancel = context.WithCancel(clientv3.WithRequireLeader(ctx))
	}
	// Opening the stream, sending and the answer must all be done by
	// giveUp: then the stream is cut.
	cut := time.AfterFunc(time.Until(giveUp), st.cancel)
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
	if !cut.Stop() {
		st.close() // cut: a later renewal needs a new one
		if err != nil && ctx.Err() == nil {
			err = errGaveUp
		}
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
	ttl      time.Duration
}

// decide is the rule after one renewal sent at sent and done at now: an
// answer with a TTL moves the deadline to sent+TTL (the renewal may have
// been handled at once) and the next renewal to a third of the TTL after
// the send; an answer without one (etcd no longer has the lease), or an
// ended context, stops the renewals; a renewal given up is sent again at
// once, one that failed at once after retryAfter (or half the time left
// before plan, the terms' end, when that is shorter, but 10 ms at least),
// while that is before the deadline, and otherwise the renewals stop. deliver is called
// for a good answer.
func decide(sent, now, plan, deadline time.Time, resp *clientv3.LeaseKeepAliveResponse, err error, ended bool, deliver func()) (renewal, bool) {
	switch {
	case ended:
		return renewal{}, false
	case err == nil && resp != nil && resp.TTL > 0:
		deliver()
		ttl := time.Duration(resp.TTL) * time.Second
		return renewal{wait: ttl / 3, deadline: sent.Add(ttl), ttl: ttl}, true
	case err == nil:
		return renewal{}, false
	}
	wait := retryAfter
	if errors.Is(err, errGaveUp) {
		wait = 0
	}
	if now.Before(plan) && plan.Before(deadline) {
		wait = min(wait, max(plan.Sub(now)/2, 10*time.Millisecond))
	}
	if !now.Add(wait).Before(deadline) {
		return renewal{}, false
	}
	return renewal{wait: wait}, true
}

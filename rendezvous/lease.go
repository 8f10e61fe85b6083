package rendezvous

import (
	"context"
	"fmt"
	"runtime/pprof"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Fencing. etcd renews a lease to "now + TTL" when it handles a keepalive,
// and the server handles it after we sent it, so a keepalive sent at time
// s and answered with TTL t proves the lease alive until at least s + t.
// Nothing else ends a lease early: only the leader expires leases, a new
// leader first renews every lease to a full TTL (etcd's lessor Promote),
// and a member that forwards a keepalive does so to the leader. clientv3's
// KeepAlive does not say when the request behind a response was sent, so
// the rendezvous runs its own keepalive stream that remembers the send time
// of every request, and each node fires LeaseLost at s + t - FenceMargin for
// its latest confirmed s (fenceAfter), unless a newer keepalive is
// confirmed first. That stays the rule whatever the cluster does.
//
// A leader change costs nothing because the proof never goes stale by more
// than one keepalive interval: keepalives go every TTL/6 once the node
// joined a round (keepaliveInterval; TTL/3 before, when a fence stops no
// workers),
// and a keepalive sent while the cluster elects a leader is held by the
// member that got it and answered, with its own send time, as soon as there
// is a leader. What a leader change must not do is leave the keepalives on
// a dead path: a stream that breaks (the member it was on was killed) is
// replaced at once, and a stream whose oldest keepalive stays unanswered
// for stuckAfter (a frozen member, one cut from the others) is dropped for
// a fresh one, which the client's balancer puts on another member; the
// wait doubles with each drop that brought no answer, so a slow but live
// leader is never abandoned for good (streamVerdict). A leader elected
// within TTL - FenceMargin - TTL/6 of the old one's death (3.5 s with the
// default 6 s lease; etcd elects one within two election timeouts, 2 s
// with its defaults, 2.7 s seen on a loaded machine) therefore never
// fences, while a node cut from every member gets no answer and still
// fences at s + t - FenceMargin, before its lease can expire.
//
// Like clientv3's lessor, one stream per client carries the keepalives of
// every lease on that client (many nodes may share a client in one
// process); etcd answers a stream's requests in order, so the responses for
// one lease match its sends first-in, first-out.

const (
	keepaliveTick = 50 * time.Millisecond
	maxInFlight   = 3 // keepalives of one lease awaiting an answer
	maxProbes     = 2 // probe streams at once (kaMux.probe)
	// minStuckAfter is the shortest wait for a stream's oldest keepalive
	// before the stream is replaced.
	minStuckAfter = 250 * time.Millisecond
)

// keepaliveInterval is how often a lease granted with ttl is renewed,
// at least every 100ms. Once its node joined a round (it may have workers
// that a fence would stop), TTL/6: the proof is never older than TTL/6
// when the leader goes and TTL - FenceMargin - TTL/6 is left for the
// election. Before (registering, waiting as a spare: no workers, so a
// fence costs only a new registration), TTL/3, as clientv3 renews: the
// keepalives of 10,000 nodes joining at once were the largest share of
// etcd's work (bench/rdzvscale), and halving them during the join costs
// only a shorter allowance (TTL - FenceMargin - TTL/3) for an election
// that happens while nodes register.
func keepaliveInterval(ttl time.Duration, joined bool) time.Duration {
	if joined {
		return max(ttl/6, 100*time.Millisecond)
	}
	return max(ttl/3, 100*time.Millisecond)
}

// fenceAfter is when a node must fire LeaseLost once a keepalive proved
// its lease alive until expiry (its send time plus the TTL etcd answered),
// given the fence it had (prev): expiry - margin, never earlier than prev
// (an answer to an older keepalive proves less). An answer with no TTL
// left is not a proof: the lease is gone and the node fences at once
// (receive).
func fenceAfter(prev, expiry time.Time, margin time.Duration) time.Time {
	if at := expiry.Add(-margin); at.After(prev) {
		return at
	}
	return prev
}

// streamVerdict says whether the keepalive stream is stuck: its oldest
// unanswered keepalive (zero when none) was sent stuckAfter or longer
// before now, and nothing was answered on it for as long (lastAnswer: its
// latest answer, or when it was opened). A stream that answers, late and
// in order (a loaded leader, many leases), is not stuck.
func streamVerdict(now, oldestUnanswered, lastAnswer time.Time, stuckAfter time.Duration) (stuck bool) {
	return !oldestUnanswered.IsZero() && now.Sub(oldestUnanswered) >= stuckAfter && now.Sub(lastAnswer) >= stuckAfter
}

// nextStuckAfter is the wait for the next stream after one was replaced
// with wait: doubled (a slow leader that answers keepalives late is waited
// for longer each time), at most maxWait.
func nextStuckAfter(wait, maxWait time.Duration) time.Duration {
	return min(2*wait, max(maxWait, minStuckAfter))
}

// stuckWait is how long a stream's oldest keepalive may go unanswered
// before the stream is replaced, for a client of endpoints members: the
// adaptive wait (wait) when there are other members to try, and the cap
// (maxWait, two keepalive intervals) when there is one. A new stream then
// goes to the same member: it helps only a stream that broke silently, and
// replacing the stream of a member that is merely saturated sends it every
// lease's keepalive again (a 10,000-node join on one member replaced
// nearly every stream and doubled the keepalives). Probes, for the same
// reason, go only where there is another member to ask.
func stuckWait(wait, maxWait time.Duration, endpoints int) time.Duration {
	if endpoints > 1 {
		return wait
	}
	return max(wait, maxWait, minStuckAfter)
}

type kaLease struct {
	n        *Node
	interval time.Duration
	next     time.Time
	sent     []time.Time // in flight, oldest first
}

// kaMux sends the keepalives of every lease of one client.
type kaMux struct {
	cli    *clientv3.Client
	cancel context.CancelFunc
	done   chan struct{}
	wake   chan struct{}

	mu     sync.Mutex
	leases map[clientv3.LeaseID]*kaLease
	// stuckAfter: how long the stream's oldest keepalive may go
	// unanswered before the stream is replaced (3 x the latest round
	// trip, at least minStuckAfter; doubled on each replacement).
	stuckAfter time.Duration
	probing    int       // probes in flight
	nextProbe  time.Time // the earliest next probe
	answered   time.Time // the stream's latest answer, or when it was opened
	// gen counts the streams: an answer that arrives on a dropped
	// stream (its receiver not yet stopped) matches no send of the
	// current one and is ignored.
	gen int
	// least is the shortest keepalive interval of the leases (0: to be
	// computed again, after the lease that had it stopped): every answer
	// reads it, and scanning every lease there cost O(leases) per answer,
	// a fifth of a 10,000-node rendezvous' CPU in one process.
	least time.Duration
}

var (
	muxMu sync.Mutex
	muxes = map[*clientv3.Client]*kaMux{}
)

// keepAlive starts renewing lease id of node n (granted with ttl by a
// request sent at sent) until n.stopKeepAlive.
func (n *Node) startKeepAlive(id clientv3.LeaseID, ttl time.Duration, sent time.Time) {
	// n.mu before muxMu, never inside it: fenceLocked takes muxMu while
	// holding n.mu.
	n.mu.Lock()
	joined := n.returned > 0
	n.mu.Unlock()
	muxMu.Lock()
	m := muxes[n.cli]
	if m == nil {
		ctx, cancel := context.WithCancel(context.Background())
		m = &kaMux{cli: n.cli, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1),
			leases: map[clientv3.LeaseID]*kaLease{}, stuckAfter: minStuckAfter}
		muxes[n.cli] = m
		go func() {
			defer close(m.done)
			pprof.Do(ctx, pprof.Labels("rdzv-task", "keepalive"), m.run)
		}()
	}
	interval := keepaliveInterval(ttl, joined)
	m.mu.Lock()
	m.leases[id] = &kaLease{n: n, interval: interval, next: sent.Add(interval)}
	if m.least != 0 {
		m.least = min(m.least, interval)
	}
	m.mu.Unlock()
	muxMu.Unlock()
}

// keepaliveJoined renews lease id at the interval of a node that joined a
// round (keepaliveInterval) from now on.
func (n *Node) keepaliveJoined(id clientv3.LeaseID, ttl time.Duration) {
	muxMu.Lock()
	defer muxMu.Unlock()
	m := muxes[n.cli]
	if m == nil {
		return
	}
	interval := keepaliveInterval(ttl, true)
	m.mu.Lock()
	if l := m.leases[id]; l != nil && l.interval != interval {
		l.interval = interval
		if soon := time.Now().Add(interval); soon.Before(l.next) {
			l.next = soon
		}
		if m.least != 0 {
			m.least = min(m.least, interval)
		}
	}
	m.mu.Unlock()
}

// stopKeepAlive stops renewing the lease; it returns a channel closed once
// the client's keepalive stream is gone, when this was its last lease.
func (n *Node) stopKeepAlive(id clientv3.LeaseID) <-chan struct{} {
	muxMu.Lock()
	defer muxMu.Unlock()
	m := muxes[n.cli]
	if m == nil {
		return nil
	}
	m.mu.Lock()
	if l := m.leases[id]; l != nil && l.interval == m.least {
		m.least = 0
	}
	delete(m.leases, id)
	empty := len(m.leases) == 0
	m.mu.Unlock()
	if !empty {
		return nil
	}
	delete(muxes, n.cli)
	m.cancel()
	return m.done
}

func (m *kaMux) run(ctx context.Context) {
	tick := time.NewTicker(keepaliveTick)
	defer tick.Stop()
	var (
		stream  pb.Lease_LeaseKeepAliveClient
		broken  chan error
		scancel context.CancelFunc = func() {}
		recv    sync.WaitGroup
	)
	defer func() { scancel(); recv.Wait() }()
	// reset drops the stream; the next tick opens a fresh one (on the
	// next member the client's balancer picks) and sends every lease's
	// keepalive on it at once.
	reset := func(err error) {
		scancel()
		stream, broken = nil, nil
		now := time.Now()
		m.mu.Lock()
		m.gen++
		nodes := make([]*Node, 0, len(m.leases))
		for _, l := range m.leases {
			l.sent = l.sent[:0]
			l.next = now
			nodes = append(nodes, l.n)
		}
		m.mu.Unlock()
		for _, n := range nodes {
			n.keepaliveFailed(err)
		}
	}
	var batch []clientv3.LeaseID
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-broken:
			reset(err)
			continue
		case <-tick.C:
		}
		if stream == nil {
			sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
			s, err := pb.NewLeaseClient(m.cli.ActiveConnection()).LeaseKeepAlive(sctx)
			if err != nil {
				cancel()
				if ctx.Err() == nil {
					reset(err)
				}
				continue
			}
			stream, scancel, broken = s, cancel, make(chan error, 1)
			m.mu.Lock()
			gen := m.gen
			m.answered = time.Now()
			m.mu.Unlock()
			recv.Add(1)
			go func(broken chan<- error) { defer recv.Done(); m.receive(s, broken, gen) }(broken)
		}
		now := time.Now()
		batch = batch[:0]
		m.mu.Lock()
		oldest := m.oldestUnansweredLocked()
		members := len(m.cli.Endpoints())
		if members > 1 && streamVerdict(now, oldest, m.answered, minStuckAfter) && m.probing < maxProbes && !now.Before(m.nextProbe) {
			m.probing++
			m.nextProbe = now.Add(minStuckAfter)
			ids := make([]clientv3.LeaseID, 0, len(m.leases))
			for id := range m.leases {
				ids = append(ids, id)
			}
			timeout := maxProbes * minStuckAfter // a new probe goes as the oldest one gives up
			recv.Add(1)
			go func() { defer recv.Done(); m.probe(ctx, ids, timeout) }()
		}
		if wait := stuckWait(m.stuckAfter, m.maxStuckAfterLocked(), members); streamVerdict(now, oldest, m.answered, wait) {
			m.stuckAfter = nextStuckAfter(wait, m.maxStuckAfterLocked())
			m.mu.Unlock()
			reset(fmt.Errorf("no keepalive answered on the stream for %s: trying another etcd member", wait))
			continue
		}
		for id, l := range m.leases {
			if !now.Before(l.next) && len(l.sent) < maxInFlight {
				l.next = now.Add(l.interval)
				l.sent = append(l.sent, now)
				batch = append(batch, id)
			}
		}
		m.mu.Unlock()
		for _, id := range batch {
			if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); err != nil {
				if ctx.Err() == nil {
					reset(err)
				}
				break
			}
		}
	}
}

// oldestUnansweredLocked is the send time of the oldest keepalive on the
// stream still awaiting its answer, zero when none.
func (m *kaMux) oldestUnansweredLocked() time.Time {
	var oldest time.Time
	for _, l := range m.leases {
		if len(l.sent) > 0 && (oldest.IsZero() || l.sent[0].Before(oldest)) {
			oldest = l.sent[0]
		}
	}
	return oldest
}

// maxStuckAfterLocked bounds the wait for a stream's answer: two of the
// shortest keepalive intervals of the stream's leases.
func (m *kaMux) maxStuckAfterLocked() time.Duration {
	if m.least == 0 {
		for _, l := range m.leases {
			if m.least == 0 || l.interval < m.least {
				m.least = l.interval
			}
		}
	}
	return 2 * m.least
}

// receive matches answers to sends until the stream breaks.
func (m *kaMux) receive(s pb.Lease_LeaseKeepAliveClient, broken chan<- error, gen int) {
	for {
		resp, err := s.Recv()
		if err != nil {
			broken <- err
			return
		}
		id := clientv3.LeaseID(resp.ID)
		m.mu.Lock()
		if m.gen != gen {
			m.mu.Unlock()
			continue
		}
		m.answered = time.Now()
		l := m.leases[id]
		var sent time.Time
		if l != nil && len(l.sent) > 0 {
			sent = l.sent[0]
			l.sent = l.sent[1:]
			m.stuckAfter = min(max(minStuckAfter, 3*time.Since(sent)), max(m.maxStuckAfterLocked(), minStuckAfter))
		}
		m.mu.Unlock()
		if l == nil || sent.IsZero() {
			continue
		}
		l.n.keepaliveAnswered(id, resp.TTL, sent)
	}
}

// probe sends one keepalive of each of ids on a stream of its own (the
// client's balancer puts it on the next member) while the main stream's
// keepalives go unanswered: a member that holds a keepalive while the
// cluster has no leader answers it only after waiting a whole election
// timeout, but a fresh request to a member that knows the new leader is
// forwarded at once. Every answer proves the lease from the probe's send
// time, like the main stream's.
func (m *kaMux) probe(ctx context.Context, ids []clientv3.LeaseID, timeout time.Duration) {
	defer func() {
		m.mu.Lock()
		m.probing--
		m.mu.Unlock()
	}()
	pctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), timeout)
	defer cancel()
	s, err := pb.NewLeaseClient(m.cli.ActiveConnection()).LeaseKeepAlive(pctx)
	if err != nil {
		return
	}
	sent := time.Now()
	for _, id := range ids {
		if s.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}) != nil {
			return
		}
	}
	for range ids {
		resp, err := s.Recv()
		if err != nil {
			return
		}
		m.mu.Lock()
		l := m.leases[clientv3.LeaseID(resp.ID)]
		m.mu.Unlock()
		if l != nil {
			l.n.keepaliveAnswered(clientv3.LeaseID(resp.ID), resp.TTL, sent)
		}
	}
}

// keepaliveAnswered records etcd's answer (ttl seconds left) to a
// keepalive of lease id sent at sent.
func (n *Node) keepaliveAnswered(id clientv3.LeaseID, ttl int64, sent time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if id != n.lease {
		return
	}
	if ttl <= 0 {
		n.fenceLocked(fmt.Errorf("%w: job %q node %q: etcd reports lease %x expired or revoked (keys of this node are gone)",
			ErrLeaseLost, n.cfg.JobID, n.cfg.NodeID, int64(id)))
		return
	}
	expiry := sent.Add(time.Duration(ttl) * time.Second)
	if n.kaErr != nil {
		n.log.Info("rendezvous: keepalive recovered", "after", time.Since(n.kaErrAt).Round(time.Millisecond),
			"fence_in", time.Until(expiry.Add(-n.cfg.FenceMargin)).Round(time.Millisecond))
		n.kaErr = nil
	}
	n.renewedLocked(expiry)
}

func (n *Node) keepaliveFailed(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lostErr != nil {
		return
	}
	if n.kaErr == nil {
		n.kaErrAt = time.Now()
		n.log.Warn("rendezvous: lease keepalive failed; retrying", "err", err, "fence_in", time.Until(n.fenceAt).Round(time.Millisecond))
	}
	n.kaErr = err
}

// renewedLocked records that the lease is alive until expiry (the send
// time of the confirmed keepalive or grant plus the TTL it was answered
// with).
func (n *Node) renewedLocked(expiry time.Time) {
	if n.lostErr != nil {
		return
	}
	at := fenceAfter(n.fenceAt, expiry, n.cfg.FenceMargin)
	if at.After(n.fenceAt) {
		n.fenceAt = at
		if n.cfg.OnRenew != nil {
			n.cfg.OnRenew(Renewal{FenceAt: at, Expiry: expiry})
		}
	}
	if n.fenceTimer == nil {
		n.fenceTimer = time.AfterFunc(time.Until(n.fenceAt), n.fenceCheck)
	} else {
		n.fenceTimer.Reset(time.Until(n.fenceAt))
	}
}

func (n *Node) fenceCheck() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lostErr != nil {
		return
	}
	if d := time.Until(n.fenceAt); d > 0 {
		n.fenceTimer.Reset(d)
		return
	}
	last := "none"
	if n.kaErr != nil {
		last = n.kaErr.Error()
	}
	n.fenceLocked(fmt.Errorf("%w: job %q node %q: no keepalive of lease %x confirmed by etcd %v in time (lease provably alive only until %s); last error: %s",
		ErrLeaseLost, n.cfg.JobID, n.cfg.NodeID, int64(n.lease), n.cli.Endpoints(), n.fenceAt.Add(n.cfg.FenceMargin).Format("15:04:05.000"), last))
}

// fenceLocked closes LeaseLost once and stops everything that acts on the
// node's behalf.
func (n *Node) fenceLocked(err error) {
	if n.lostErr != nil {
		return
	}
	n.lostErr = err
	close(n.lost)
	if n.fenceTimer != nil {
		n.fenceTimer.Stop()
	}
	if n.leaseStop != nil {
		n.leaseStop()
	}
	if n.lease != 0 {
		n.kaDone = n.stopKeepAlive(n.lease)
	}
	n.broadcastLocked()
	if !n.closed {
		n.log.Error("rendezvous: lease lost; workers must stop now", "err", err)
	}
}

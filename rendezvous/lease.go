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
// s and answered with TTL t proves the lease alive until at least s + t
// (the leader only ever extends leases when leadership changes). clientv3's
// KeepAlive does not say when the request behind a response was sent, so
// the rendezvous runs its own keepalive stream that remembers the send time
// of every request, and each node fires LeaseLost at s + t - FenceMargin for
// its latest confirmed s, unless a newer keepalive is confirmed first.
//
// Like clientv3's lessor, one stream per client carries the keepalives of
// every lease on that client (many nodes may share a client in one
// process); etcd answers a stream's requests in order, so the responses for
// one lease match its sends first-in, first-out.

const (
	keepaliveRetry = 200 * time.Millisecond
	keepaliveTick  = 50 * time.Millisecond
	maxInFlight    = 3 // keepalives of one lease awaiting an answer
)

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
}

var (
	muxMu sync.Mutex
	muxes = map[*clientv3.Client]*kaMux{}
)

// keepAlive starts renewing lease id of node n (granted with ttl by a
// request sent at sent) until n.stopKeepAlive.
func (n *Node) startKeepAlive(id clientv3.LeaseID, ttl time.Duration, sent time.Time) {
	muxMu.Lock()
	m := muxes[n.cli]
	if m == nil {
		ctx, cancel := context.WithCancel(context.Background())
		m = &kaMux{cli: n.cli, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1),
			leases: map[clientv3.LeaseID]*kaLease{}}
		muxes[n.cli] = m
		go func() {
			defer close(m.done)
			pprof.Do(ctx, pprof.Labels("rdzv-task", "keepalive"), m.run)
		}()
	}
	interval := max(ttl/3, 100*time.Millisecond)
	m.mu.Lock()
	m.leases[id] = &kaLease{n: n, interval: interval, next: sent.Add(interval)}
	m.mu.Unlock()
	muxMu.Unlock()
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
	reset := func(err error) {
		scancel()
		stream, broken = nil, nil
		now := time.Now()
		m.mu.Lock()
		nodes := make([]*Node, 0, len(m.leases))
		for _, l := range m.leases {
			l.sent = l.sent[:0]
			l.next = now.Add(keepaliveRetry)
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
			recv.Add(1)
			go func() { defer recv.Done(); m.receive(s, broken) }()
		}
		now := time.Now()
		batch = batch[:0]
		m.mu.Lock()
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

// receive matches answers to sends until the stream breaks.
func (m *kaMux) receive(s pb.Lease_LeaseKeepAliveClient, broken chan<- error) {
	for {
		resp, err := s.Recv()
		if err != nil {
			broken <- err
			return
		}
		id := clientv3.LeaseID(resp.ID)
		m.mu.Lock()
		l := m.leases[id]
		var sent time.Time
		if l != nil && len(l.sent) > 0 {
			sent = l.sent[0]
			l.sent = l.sent[1:]
		}
		m.mu.Unlock()
		if l == nil || sent.IsZero() {
			continue
		}
		n := l.n
		n.mu.Lock()
		if resp.TTL <= 0 {
			n.fenceLocked(fmt.Errorf("%w: job %q node %q: etcd reports lease %x expired or revoked (keys of this node are gone)",
				ErrLeaseLost, n.cfg.JobID, n.cfg.NodeID, int64(id)))
		} else {
			if n.kaErr != nil {
				n.log.Info("rendezvous: keepalive recovered", "after", time.Since(n.kaErrAt).Round(time.Millisecond))
				n.kaErr = nil
			}
			n.renewedLocked(sent.Add(time.Duration(resp.TTL) * time.Second))
		}
		n.mu.Unlock()
	}
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

// renewedLocked records that the lease is alive until expiry.
func (n *Node) renewedLocked(expiry time.Time) {
	if n.lostErr != nil {
		return
	}
	at := expiry.Add(-n.cfg.FenceMargin)
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

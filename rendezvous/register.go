package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/secretlease"
)

// register grants the lease and writes the member and queue keys, once.
func (n *Node) register(ctx context.Context) error {
	n.regMu.Lock()
	defer n.regMu.Unlock()
	n.mu.Lock()
	done, closed := n.registered, n.closed
	n.mu.Unlock()
	if closed {
		return n.closedErr()
	}
	if done {
		return nil
	}
	// Registration retries transient errors (an overloaded etcd answers
	// "too many requests" when thousands of nodes join at once; a
	// restarting etcd answers nothing) for as long as a join may take,
	// logging while it does: a node fenced by an etcd outage of a minute or
	// more rejoins when etcd is back. (A wrong endpoint fails at once, at
	// connect time.)
	ctx, cancel := context.WithTimeout(ctx, n.cfg.RegisterTimeout)
	defer cancel()
	// One write slot for the whole registration: the queue entry must follow
	// the member key closely (see election.go).
	release, err := acquireSlot(ctx, n.cli)
	if err != nil {
		return fmt.Errorf("rendezvous: job %q node %q: register: %w", n.cfg.JobID, n.cfg.NodeID, err)
	}
	defer release()
	lease, ttl, leaseCtx, err := n.grantLease(ctx)
	if err != nil {
		return err
	}
	mk := n.k.Member(n.cfg.NodeID)
	n.mu.Lock()
	qrev, qk := n.queueRev, n.queueKey
	n.mu.Unlock()
	rev, qrev, qk, head, pred, err := n.writeMember(ctx, lease, ttl, qrev, qk)
	if err != nil {
		return n.registrationFailed(ctx, lease, fmt.Errorf("rendezvous: job %q node %q: write member key %s: %w", n.cfg.JobID, n.cfg.NodeID, mk, err))
	}
	n.mu.Lock()
	n.registered, n.memberRev, n.queueKey, n.queueRev = true, rev, qk, qrev
	n.mu.Unlock()
	n.goTracked("head", func() { n.watchHead(leaseCtx, head, rev) })
	n.goTracked("campaign", func() { n.campaign(leaseCtx, pred) })
	n.log.Debug("rendezvous: registered", "lease", fmt.Sprintf("%x", int64(lease)), "ttl", ttl, "rev", rev)
	return nil
}

// grantLease grants the node's lease, makes it the node's and starts its
// keepalives. leaseCtx ends when the lease is given up.
func (n *Node) grantLease(ctx context.Context) (lease clientv3.LeaseID, ttl time.Duration, leaseCtx context.Context, err error) {
	ttlSec := int64((n.cfg.LeaseTTL + time.Second - 1) / time.Second)
	var (
		g    *clientv3.LeaseGrantResponse
		sent time.Time
	)
	err = n.retry(ctx, "grant lease", false, func(ctx context.Context) error {
		sent = time.Now()
		var err error
		// A random id etcd never shows to others: a member's keys live
		// under jobs/, which only the job (and the coordinator and node
		// agents) may read, and a guessable id would let anyone keep a
		// dead member alive (package secretlease).
		g, err = secretlease.Grant(ctx, n.cli, ttlSec)
		return err
	})
	if err != nil {
		return 0, 0, nil, fmt.Errorf("rendezvous: job %q node %q: grant a %ds lease at etcd %v: %w", n.cfg.JobID, n.cfg.NodeID, ttlSec, n.cli.Endpoints(), err)
	}
	ttl = time.Duration(g.TTL) * time.Second
	leaseCtx, leaseStop := context.WithCancel(n.ctx)
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		leaseStop()
		n.revokeBounded(ctx, g.ID)
		return 0, 0, nil, n.closedErr()
	}
	n.lease, n.ttl, n.leaseCtx, n.leaseStop = g.ID, ttl, leaseCtx, leaseStop
	// The queue entry's name (election.go); written at registration.
	n.queueRev = max(g.GetRevision(), 1)
	n.queueKey = n.queueEntry(n.queueRev, sent)
	if n.cfg.FenceMargin == 0 {
		n.cfg.FenceMargin = max(ttl/4, 250*time.Millisecond)
	}
	if n.cfg.FenceMargin >= ttl {
		n.cfg.FenceMargin = ttl / 2
	}
	n.renewedLocked(sent.Add(ttl))
	n.mu.Unlock()
	n.startKeepAlive(g.ID, ttl, sent)
	return g.ID, ttl, leaseCtx, nil
}

// revokeBounded revokes lease, best effort, within 2s, even when ctx has
// ended (its values are kept).
func (n *Node) revokeBounded(ctx context.Context, lease clientv3.LeaseID) {
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer rcancel()
	_, _ = n.cli.Revoke(rctx, lease)
}

// registrationFailed leaves the node fenced with its lease revoked, and
// returns err. When the lease was lost first (etcd restarting while the
// node registers), the failure says so: the retries gave up because the
// lease went, and the caller joins again with a fresh one. Reported as
// the retries' last error ("node id already registered": the previous
// lease, restored with a fresh TTL by the restarted etcd), it ended the
// job.
func (n *Node) registrationFailed(ctx context.Context, lease clientv3.LeaseID, err error) error {
	n.revokeBounded(ctx, lease)
	n.mu.Lock()
	lost := n.lostErr
	n.fenceLocked(fmt.Errorf("%w: registration failed: %w", ErrLeaseLost, err))
	n.mu.Unlock()
	if lost != nil && !errors.Is(err, ErrLeaseLost) {
		return fmt.Errorf("%w (%w)", lost, err)
	}
	return err
}

package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// A registered node that waits for a round relies on two watches it cannot
// check from the inside: the closer's watch of the members (it must see the
// registration to take the node in) and the node's own watch of the round
// record (it must see the round that includes it). A watch that lags or
// loses an event (etcd issue 17529: events of slow watchers multiplexed on
// one stream, as a frozen hyperpodrun's are, delayed for minutes, and lost
// after a compaction, before etcd 3.4.31 and 3.5.13; Debian's is 3.4.23),
// a closer wedged in a call, or a closer that keeps the node a suspect,
// leaves a registered node out with the job one node short, and nothing
// says why: a node frozen 30 s registered again and stayed out for 125 s
// (issue 24).
//
// So a node that waits while the latest round is closed below its size
// (a round that would grow for it: decide grows a closed round at once, or
// after the last call) supervises its own wait (stallDecide):
//
//   - after stallGrace it reads the round record itself: a newer one than
//     its watch delivered means its watch is stale, and the watch is
//     restarted; otherwise it rewrites its own member record, unchanged,
//     so the closer sees a fresh event of it ("nudge");
//   - after stallRevokeAfter with still no round, the closer is presumed
//     wedged, as superviseCloser presumes one that does not act on a
//     failure: its lease is revoked, loudly, and the next node in the
//     closer queue takes over from a fresh snapshot.
//
// Every step is logged at warning level: a node never waits silently.

// stallAction is what a waiting node does about its wait.
type stallAction int

const (
	// stallNone: nothing to do; check again at the returned time (zero:
	// at the next change).
	stallNone stallAction = iota
	// stallNudge: read the round record (restart the watch if it missed
	// a change), else rewrite this node's member record.
	stallNudge
	// stallRevokeCloser: revoke the lease of the round's closer.
	stallRevokeCloser
)

func (a stallAction) String() string {
	switch a {
	case stallNone:
		return "none"
	case stallNudge:
		return "nudge"
	case stallRevokeCloser:
		return "revoke-closer"
	}
	return fmt.Sprintf("stallAction(%d)", int(a))
}

// stallView is what a registered node knows of its wait.
type stallView struct {
	// head is the latest round record the node saw (nil: none); inRound
	// says its proposal includes this node; finishing that a member of
	// it finished (its done marker is written).
	head      *header
	inRound   bool
	finishing bool
	// since is when the wait began: the node registered, or saw the
	// round record change, or acted last.
	since time.Time
	// nudged says the node nudged since then.
	nudged bool
	// maxNodes and allowed (Config.AllowedSize) size the round.
	maxNodes int
	allowed  func(int) int
	// desired is the job's desired record as read when about to act
	// (read only then, like finishing): its target sizes the round as the
	// closer sizes it, not the target the round record carries, which a
	// coordinator's later, smaller target does not rewrite. stopping: the
	// record stops the job; unread: the read failed (never act on it).
	desired  desiredSeen
	target   int
	stopping bool
	// grace is the time a growth takes at most (stallGrace); revokeAfter
	// the time after which the closer is presumed wedged.
	grace, revokeAfter time.Duration
}

// Rules of stallDecide.
const (
	ruleStallNoRound     = "no-closed-round"
	ruleStallInRound     = "in-the-round"
	ruleStallFinishing   = "round-finishing"
	ruleStallAtSize      = "round-at-its-size"
	ruleStallStopping    = "job-stopping"
	ruleStallUnread      = "desired-record-unread"
	ruleStallWaiting     = "growth-not-due-yet"
	ruleStallNudge       = "growth-overdue-nudge"
	ruleStallNudged      = "nudged-wait-for-closer"
	ruleStallRevokeClose = "growth-overdue-revoke-closer"
)

// stallDecide says what a registered node waiting for a round does at now,
// the rule that decided, and when to decide again (zero: at the next
// change). Only a closed round below its size that would grow by this
// node is expected to take it: an open round may lack nodes this node
// cannot see, a proposed one is in flight (the closer's ack timeout
// bounds it), a round at its size keeps this node as a spare, and a
// finishing round grows no more.
func stallDecide(v stallView, now time.Time) (stallAction, string, time.Time) {
	h := v.head
	switch {
	case h == nil || h.State != stateClosed:
		return stallNone, ruleStallNoRound, time.Time{}
	case v.inRound:
		return stallNone, ruleStallInRound, time.Time{}
	case v.finishing:
		return stallNone, ruleStallFinishing, time.Time{}
	case v.desired == desiredRead && v.stopping:
		return stallNone, ruleStallStopping, time.Time{}
	case v.desired == desiredUnread:
		return stallNone, ruleStallUnread, time.Time{}
	}
	size := v.maxNodes
	switch {
	case v.desired == desiredRead && v.target > 0:
		size = min(size, v.target)
	case v.desired == desiredNotYet && h.Target > 0:
		size = min(size, h.Target)
	}
	if h.Nodes >= size || v.allowed(h.Nodes+1) <= h.Nodes {
		return stallNone, ruleStallAtSize, time.Time{}
	}
	switch waited := now.Sub(v.since); {
	case waited < v.grace:
		return stallNone, ruleStallWaiting, v.since.Add(v.grace)
	case !v.nudged:
		return stallNudge, ruleStallNudge, now.Add(v.grace)
	case waited < v.revokeAfter:
		return stallNone, ruleStallNudged, v.since.Add(v.revokeAfter)
	}
	return stallRevokeCloser, ruleStallRevokeClose, now.Add(v.revokeAfter)
}

// desiredSeen says whether a stallView holds the job's desired record.
type desiredSeen int

const (
	// desiredNotYet: not read (nothing to act on yet): the round
	// record's target stands in for it.
	desiredNotYet desiredSeen = iota
	// desiredRead: read (a job without a coordinator has none: target 0).
	desiredRead
	// desiredUnread: the read failed.
	desiredUnread
)

// stallGrace is the longest a closed round below its size takes to grow
// by a node that registered: the last call, the proposal's
// acknowledgement by rank 0 (AckTimeout, twice for a slow rank 0) and a
// lease TTL of slack for a loaded etcd.
func (c *Config) stallGrace() time.Duration {
	return c.LastCallTimeout + 2*c.AckTimeout + c.LeaseTTL
}

// stallRevokeAfter is how long a node waits, nudged, before it presumes
// the closer wedged: a grace after the nudge, and never before a closer
// regrouping after an outage (regroupTimeout) had its time.
func (c *Config) stallRevokeAfter() time.Duration {
	return c.stallGrace() + max(c.stallGrace(), regroupTimeout(c.LeaseTTL))
}

// waitSupervisor runs stallDecide for one Join while it waits.
type waitSupervisor struct {
	n       *Node
	since   time.Time
	nudged  bool
	seenRev int64
	timer   *time.Timer
}

func (n *Node) newWaitSupervisor() *waitSupervisor {
	return &waitSupervisor{n: n, since: time.Now(), seenRev: -1, timer: time.NewTimer(time.Hour)}
}

func (s *waitSupervisor) stop() { s.timer.Stop() }

// check decides on the wait as it stands, acts, and returns the channel
// that fires when it must decide again (nil: at the next change).
func (s *waitSupervisor) check(ctx context.Context) <-chan time.Time {
	n := s.n
	n.mu.Lock()
	v := stallView{
		head: n.head, inRound: n.head != nil && n.assigned.round == n.head.Round && n.assigned.in,
		maxNodes: n.cfg.MaxNodes, allowed: n.cfg.AllowedSize,
		grace: n.cfg.stallGrace(), revokeAfter: n.cfg.stallRevokeAfter(),
	}
	headRev := n.headRev
	n.mu.Unlock()
	if headRev != s.seenRev {
		s.since, s.nudged, s.seenRev = time.Now(), false, headRev
	}
	v.since, v.nudged = s.since, s.nudged
	now := time.Now()
	act, rule, wake := stallDecide(v, now)
	if act != stallNone {
		// Only when acting: whether the round is finishing and the job's
		// current target cost reads.
		v.finishing = n.finishing(ctx, v.head)
		v.desired, v.target, v.stopping = n.readDesired(ctx)
		act, rule, wake = stallDecide(v, now)
	}
	switch act {
	case stallNudge:
		n.nudge(ctx, v.head, time.Since(s.since), rule)
		s.nudged = true
	case stallRevokeCloser:
		n.revokeWedgedCloser(ctx, v.head, time.Since(s.since), rule)
		s.since, s.nudged = time.Now(), false
	}
	if !s.timer.Stop() {
		select {
		case <-s.timer.C:
		default:
		}
	}
	if wake.IsZero() {
		return nil
	}
	s.timer.Reset(time.Until(wake))
	return s.timer.C
}

// finishing reads whether a member of round h finished (its done marker):
// such a round grows no more. A failed read counts as not finishing.
func (n *Node) finishing(ctx context.Context, h *header) bool {
	if h == nil {
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, n.opTimeout())
	defer cancel()
	g, err := n.cli.Get(rctx, n.k.DoneKey(h.Round), clientv3.WithCountOnly())
	return err == nil && g.Count > 0
}

// readDesired reads the job's desired record: its target (0: none, or no
// record) and whether it stops the job; desiredUnread when the read
// failed or the record is malformed.
func (n *Node) readDesired(ctx context.Context) (desiredSeen, int, bool) {
	rctx, cancel := context.WithTimeout(ctx, n.opTimeout())
	defer cancel()
	g, err := n.cli.Get(rctx, n.k.desired)
	if err != nil {
		return desiredUnread, 0, false
	}
	if len(g.Kvs) == 0 {
		return desiredRead, 0, false
	}
	d, err := fleet.DecodeDesired(string(g.Kvs[0].Key), g.Kvs[0].Value)
	if err != nil {
		return desiredUnread, 0, false
	}
	return desiredRead, d.Target(), d.Stop != nil
}

// nudge reads the round record: when it is newer than what the node's
// watch delivered, the watch is restarted; otherwise the node rewrites
// its member record (only while its own lease holds it), so the closer
// sees an event of it again.
func (n *Node) nudge(ctx context.Context, h *header, waited time.Duration, rule string) {
	rctx, cancel := context.WithTimeout(ctx, n.opTimeout())
	defer cancel()
	g, err := n.cli.Get(rctx, n.k.Head)
	if err != nil {
		n.log.Warn("rendezvous: no round took this node yet; cannot read the round record", "waited", waited.Round(time.Millisecond), "err", err)
		return
	}
	n.mu.Lock()
	seen, lease, restart := n.headRev, n.lease, n.rewatchHead
	n.mu.Unlock()
	if len(g.Kvs) > 0 && g.Kvs[0].ModRevision > seen {
		n.log.Warn("rendezvous: the round record changed without this node's watch seeing it; watching it again",
			"seen_rev", seen, "rev", g.Kvs[0].ModRevision, "waited", waited.Round(time.Millisecond))
		if restart != nil {
			restart()
		}
		return
	}
	mk := n.k.Member(n.cfg.NodeID)
	rec, _ := json.Marshal(memberRec{Addr: n.cfg.Addr, LWS: n.cfg.LocalWorldSize})
	t, err := n.cli.Txn(rctx).If(clientv3.Compare(clientv3.LeaseValue(mk), "=", lease)).
		Then(clientv3.OpPut(mk, string(rec), clientv3.WithLease(lease))).Commit()
	switch {
	case err != nil:
		n.log.Warn("rendezvous: no round took this node yet; cannot remind the closer", "waited", waited.Round(time.Millisecond), "err", err)
	case !t.Succeeded:
		n.log.Warn("rendezvous: no round took this node yet, and its member record is gone", "key", mk)
	default:
		n.log.Warn("rendezvous: no round took this node although the round is below its size; reminding the closer",
			"rule", rule, "round", h.Round, "nodes", h.Nodes, "target", h.Target, "closer", h.Closer, "waited", waited.Round(time.Millisecond))
	}
}

// revokeWedgedCloser revokes the lease of round h's closer, which did not
// take this node into a round below its size even after a nudge: the next
// node in the closer queue takes over from a fresh snapshot. A closer that
// was alive after all fences its workers and rejoins as a new member.
func (n *Node) revokeWedgedCloser(ctx context.Context, h *header, waited time.Duration, rule string) {
	if h.Closer == "" || h.Closer == n.cfg.NodeID {
		n.log.Error("rendezvous: no round took this node although the round is below its size", "rule", rule,
			"round", h.Round, "nodes", h.Nodes, "target", h.Target, "waited", waited.Round(time.Millisecond))
		return
	}
	rctx, cancel := context.WithTimeout(ctx, n.opTimeout())
	defer cancel()
	m, err := n.cli.Get(rctx, n.k.Member(h.Closer))
	if err != nil || len(m.Kvs) == 0 || m.Kvs[0].Lease == 0 {
		n.log.Warn("rendezvous: no round took this node, and the round's closer is gone or unreadable; its successor takes over",
			"closer", h.Closer, "round", h.Round, "waited", waited.Round(time.Millisecond), "err", err)
		return
	}
	n.log.Warn("rendezvous: no round took this node although the round is below its size, even after a reminder; revoking the closer's lease so the next node takes over (wedged closer?)",
		"rule", rule, "closer", h.Closer, "round", h.Round, "nodes", h.Nodes, "target", h.Target, "waited", waited.Round(time.Millisecond))
	if _, err := n.cli.Revoke(rctx, clientv3.LeaseID(m.Kvs[0].Lease)); err != nil && ctx.Err() == nil {
		n.log.Warn("rendezvous: revoke the wedged closer's lease", "closer", h.Closer, "err", err)
	}
}

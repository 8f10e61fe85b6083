package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// The closer is the one node (the oldest) that watches the whole job:
// member keys, acknowledgements, failure and finish markers, and the target.
// It alone writes the round header and its member chunks, always with a
// Txn guarded on the header's mod revision and on its own member key, so a
// stale or fenced closer can never overwrite a newer decision.
//
// A round goes open -> proposed -> closed. A proposal fixes the member list
// and ranks; rank 0 acknowledges it with the MASTER_PORT it picked. A round
// formed after a failure or a loss (when another agent may be dead while
// its lease still runs: a SIGKILLed agent's lease lives up to the TTL)
// needs every member's acknowledgement: members that do not acknowledge
// within AckTimeout of the last acknowledgement progress are left out as
// suspects and the round is proposed again without them, so a dead agent
// costs the survivors about AckTimeout instead of the TTL. A suspect that
// acknowledges anything later is alive and becomes a spare again. The first
// round and growth rounds need only rank 0's acknowledgement: their members
// just proved themselves alive, and a member that died meanwhile is caught
// by its lease, then by the next round's acknowledgements.

const (
	maxChunkBatchOps   = 100
	maxChunkBatchBytes = 1 << 20
)

var (
	errResnapshot  = errors.New("closer state changed; re-reading")
	errSteppedDown = errors.New("an older node joined the closer election; stepping down")
)

type cand struct {
	id        string
	rec       memberRec
	createRev int64
	suspect   bool
	// suspectedAt is when the node became a suspect (suspicionEnded).
	suspectedAt time.Time
}

type closer struct {
	n   *Node
	cfg *Config
	k   keys
	log *slog.Logger

	members map[string]*cand
	// unavail counts the members that are suspect or draining, suspects
	// those suspect, draining those draining: kept as members change
	// (apply, removeMember, setSuspect), so no decision counts them one
	// by one.
	unavail, suspects, draining int

	head    *header // nil when absent or malformed
	headRev int64   // mod revision of the header key, 0 when absent
	headBad bool

	round   []Member // member list of the latest proposal (kept while open)
	inRound map[string]int
	present int
	lost    []string
	lostSet map[string]bool
	acked   map[string]ackRec
	failure *failureRec
	finish  bool

	target   int      // the desired record's size (0: none)
	placed   []string // the desired record's nodes
	lastCall time.Time
	ackSince time.Time
	timer    *time.Timer

	proposedAt time.Time
}

// runCloser acts as the closer until ctx ends, an error, or an older node
// shows up in the election queue after revision elected.
func (n *Node) runCloser(ctx context.Context, elected int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n.mu.Lock()
	mine := n.queueKey
	n.mu.Unlock()
	older := n.cli.Watch(clientv3.WithRequireLeader(ctx), mine+"\x00",
		clientv3.WithRange(clientv3.GetPrefixRangeEnd(n.k.Queue)), clientv3.WithRev(elected+1), clientv3.WithFilterDelete())
	for {
		c, rev, err := n.snapshot(ctx)
		if err != nil {
			return err
		}
		err = c.run(ctx, rev, older)
		if !errors.Is(err, errResnapshot) {
			return err
		}
		n.log.Debug("rendezvous: closer re-reading state", "err", err)
	}
}

// snapshot reads everything the closer needs at one revision.
func (n *Node) snapshot(ctx context.Context) (*closer, int64, error) {
	k := n.k
	rctx, cancel := context.WithTimeout(ctx, n.opTimeout())
	defer cancel()
	resp, err := n.cli.Txn(rctx).Then(
		clientv3.OpGet(k.Head),
		clientv3.OpGet(k.Members, clientv3.WithPrefix()),
		clientv3.OpGet(k.Acks, clientv3.WithPrefix()),
		clientv3.OpGet(k.Failures, clientv3.WithPrefix()),
		clientv3.OpGet(k.Done, clientv3.WithPrefix()),
		clientv3.OpGet(k.desired),
	).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("rendezvous: closer: read job state under %s: %w", k.Base, err)
	}
	rev := resp.Header.Revision
	c := &closer{
		n: n, cfg: &n.cfg, k: k, log: n.log.With("role", "closer"),
		members: map[string]*cand{}, inRound: map[string]int{}, lostSet: map[string]bool{},
		acked: map[string]ackRec{}, ackSince: time.Now(),
	}
	kvs := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().Kvs }
	if hk := kvs(0); len(hk) > 0 {
		c.headRev = hk[0].ModRevision
		h, err := decodeHeader(k.Head, hk[0].Value)
		if err != nil {
			c.log.Error("rendezvous: closer: replacing malformed round record", "err", err)
			c.headBad = true
		} else {
			c.head = h
			if h.State != stateOpen {
				if err := c.loadRound(rctx, h, rev); err != nil {
					if rctx.Err() != nil {
						return nil, 0, err
					}
					c.log.Error("rendezvous: closer: replacing malformed round record", "err", err)
					c.head, c.headBad = nil, true
				}
			}
		}
	}
	for _, kv := range kvs(1) {
		c.apply(&clientv3.Event{Type: mvccpb.PUT, Kv: kv})
	}
	for i := 2; i <= 4; i++ {
		for _, kv := range kvs(i) {
			c.apply(&clientv3.Event{Type: mvccpb.PUT, Kv: kv})
		}
	}
	if tk := kvs(5); len(tk) > 0 {
		c.applyDesired(tk[0])
	}
	// Members of the current round already gone (the previous closer itself,
	// typically) are lost.
	for _, m := range c.round {
		if c.members[m.NodeID] == nil && !c.lostSet[m.NodeID] {
			c.lostSet[m.NodeID] = true
			c.lost = append(c.lost, m.NodeID)
		}
	}
	return c, rev, nil
}

func (c *closer) loadRound(ctx context.Context, h *header, rev int64) error {
	pfx := c.k.ChunkPrefix(h.Round, h.Nonce)
	g, err := c.n.cli.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return fmt.Errorf("rendezvous: closer: read %s: %w", pfx, err)
	}
	all, err := decodeAll(pfx, g.Kvs, h)
	if err != nil {
		return err
	}
	c.setRound(all)
	return nil
}

func (c *closer) setRound(ms []Member) {
	c.round = ms
	c.inRound = make(map[string]int, len(ms))
	for _, m := range ms {
		c.inRound[m.NodeID] = m.GroupRank
	}
	c.present = 0
	for _, m := range ms {
		if c.members[m.NodeID] != nil {
			c.present++
		}
	}
	c.lost, c.lostSet = nil, map[string]bool{}
	c.acked = map[string]ackRec{}
	c.ackSince = time.Now()
	c.proposedAt = c.ackSince
	c.failure, c.finish = nil, false
	c.lastCall = time.Time{}
}

func (c *closer) run(ctx context.Context, rev int64, older clientv3.WatchChan) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	nodesW := c.n.cli.Watch(wctx, c.k.Nodes, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	targetW := c.n.cli.Watch(wctx, c.k.desired, clientv3.WithRev(rev+1))
	c.timer = time.NewTimer(time.Hour)
	defer c.timer.Stop()
	onNodes := func(wr clientv3.WatchResponse, ok bool) error {
		if !ok || wr.Err() != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: watch %s: %v", errResnapshot, c.k.Nodes, wr.Err())
		}
		for _, ev := range wr.Events {
			c.apply(ev)
		}
		return nil
	}
	onTarget := func(wr clientv3.WatchResponse, ok bool) error {
		if !ok || wr.Err() != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: watch %s: %v", errResnapshot, c.k.desired, wr.Err())
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				c.setDesired(nil)
			} else {
				c.applyDesired(ev.Kv)
			}
		}
		return nil
	}
	onOlder := func(wr clientv3.WatchResponse, ok bool) error {
		if !ok || wr.Err() != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("watch the election queue: %v", wr.Err())
		}
		if len(wr.Events) > 0 {
			c.log.Info("rendezvous: closer: an older node entered the election; handing over", "entry", string(wr.Events[0].Kv.Key))
			return errSteppedDown
		}
		return nil
	}
	for {
		if err := c.evaluate(ctx); err != nil {
			return err
		}
		var err error
		select {
		case <-ctx.Done():
			return ctx.Err()
		case wr, ok := <-older:
			err = onOlder(wr, ok)
		case wr, ok := <-nodesW:
			err = onNodes(wr, ok)
		case wr, ok := <-targetW:
			err = onTarget(wr, ok)
		case <-c.timer.C:
		}
		// Apply whatever else already arrived before deciding.
		for drained := false; err == nil && !drained; {
			select {
			case wr, ok := <-older:
				err = onOlder(wr, ok)
			case wr, ok := <-nodesW:
				err = onNodes(wr, ok)
			case wr, ok := <-targetW:
				err = onTarget(wr, ok)
			default:
				drained = true
			}
		}
		if err != nil {
			return err
		}
	}
}

// apply updates the closer's view with one event under the nodes prefix.
func (c *closer) apply(ev *clientv3.Event) {
	key := string(ev.Kv.Key)
	put := ev.Type == mvccpb.PUT
	switch {
	case strings.HasPrefix(key, c.k.Members):
		id := key[len(c.k.Members):]
		if !put {
			c.removeMember(id)
			return
		}
		rec, err := decodeMember(key, ev.Kv.Value)
		if err != nil {
			c.log.Error("rendezvous: closer: ignoring node with a malformed member record", "err", err)
			c.removeMember(id)
			return
		}
		if m := c.members[id]; m != nil {
			c.count(m, -1)
			m.rec = rec
			c.count(m, 1)
			return
		}
		m := &cand{id: id, rec: rec, createRev: ev.Kv.CreateRevision}
		c.members[id] = m
		c.count(m, 1)
		if _, ok := c.inRound[id]; ok && !c.lostSet[id] {
			if c.headRev > 0 && ev.Kv.CreateRevision > c.headRev {
				// Registered again since the round was written: a new
				// incarnation (its lease was lost, its workers fenced), as
				// a closer's snapshot after an etcd outage finds it.
				c.lostSet[id] = true
				c.lost = append(c.lost, id)
				return
			}
			c.present++
		}
	case strings.HasPrefix(key, c.k.Acks):
		if !put {
			return
		}
		id := key[len(c.k.Acks):]
		a, err := decodeAck(key, ev.Kv.Value)
		if err != nil {
			c.log.Error("rendezvous: closer: ignoring malformed acknowledgement", "err", err)
			return
		}
		if m := c.members[id]; m != nil && m.suspect {
			c.setSuspect(m, false)
			c.log.Info("rendezvous: closer: node acknowledged late; it is alive and waits as a spare", "node", id, "round", a.Round)
		}
		if c.head == nil || c.head.State != stateProposed || a.Round != c.head.Round || a.Nonce != c.head.Nonce {
			return
		}
		rank, ok := c.inRound[id]
		if _, dup := c.acked[id]; !ok || dup || (!c.head.AckAll && rank != 0) {
			return
		}
		if rank == 0 && a.Port == 0 {
			c.log.Error("rendezvous: closer: rank 0 acknowledged without a MASTER_PORT", "node", id, "key", key)
			return
		}
		c.acked[id] = a
		c.ackSince = time.Now()
	case strings.HasPrefix(key, c.k.Failures):
		if !put || c.head == nil || c.head.State != stateClosed || c.failure != nil {
			return
		}
		if r, ok := c.k.FailureRound(key); !ok || r != c.head.Round {
			return
		}
		var f failureRec
		if err := json.Unmarshal(ev.Kv.Value, &f); err != nil {
			c.log.Error("rendezvous: closer: malformed failure report; restarting the round anyway", "key", key, "err", err)
			f = failureRec{Node: "?", Detail: "malformed failure report at " + key}
		}
		c.failure = &f
	case strings.HasPrefix(key, c.k.Done):
		if !put || c.head == nil {
			return
		}
		if r, ok := c.k.DoneRound(key); ok && r == c.head.Round {
			c.finish = true
		}
	}
}

func (c *closer) removeMember(id string) {
	m := c.members[id]
	if m == nil {
		return
	}
	c.setSuspect(m, false)
	c.count(m, -1)
	delete(c.members, id)
	if _, ok := c.inRound[id]; ok && !c.lostSet[id] {
		c.present--
		c.lostSet[id] = true
		c.lost = append(c.lost, id)
	}
}

// setSuspect flags member m a suspect (since now) or clears the flag,
// keeping the counts.
func (c *closer) setSuspect(m *cand, suspect bool) {
	if m.suspect == suspect {
		return
	}
	c.count(m, -1)
	m.suspect = suspect
	if suspect {
		m.suspectedAt = time.Now()
	}
	c.count(m, 1)
}

// count adds member m to the closer's counts (by = 1) or takes it out of
// them (by = -1).
func (c *closer) count(m *cand, by int) {
	c.unavail += by * b2i(unavailable(m))
	c.suspects += by * b2i(m.suspect)
	c.draining += by * b2i(m.rec.Leaving)
}

// applyDesired takes the job's target size and placement from the
// coordinator's desired record.
func (c *closer) applyDesired(kv *mvccpb.KeyValue) {
	d, err := fleet.DecodeDesired(string(kv.Key), kv.Value)
	if err != nil {
		c.log.Error("rendezvous: closer: ignoring malformed desired record; sizing rounds as if no target were set", "err", err)
		d = nil
	}
	c.setDesired(d)
}

func (c *closer) setDesired(d *fleet.Desired) {
	if t := d.Target(); t != c.target {
		c.log.Info("rendezvous: closer: target size changed", "from", c.target, "to", t)
		c.target = t
	}
	c.placed = nil
	if d.Target() > 0 {
		c.placed = d.Nodes
	}
}

// view is a snapshot of the closer's state for decide.
func (c *closer) view() view {
	return view{
		members: c.members, avail: len(c.members) - c.unavail, draining: c.draining,
		head: c.head, headRev: c.headRev, headBad: c.headBad,
		round: c.round, present: c.present, lost: c.lost,
		acked:   c.acked,
		failure: c.failure, finish: c.finish,
		target: c.target, placed: c.placed,
		lastCall: c.lastCall, ackSince: c.ackSince,
		minNodes: c.cfg.MinNodes, maxNodes: c.cfg.MaxNodes,
		sizes: c.cfg.Sizes, step: c.cfg.Step,
		lastCallTimeout: c.cfg.LastCallTimeout, ackTimeout: c.cfg.AckTimeout,
		regroupTimeout: regroupTimeout(c.cfg.LeaseTTL),
	}
}

// regroupTimeout is how long a closer waits for the members of a round
// that lost them all (an etcd outage) to register again: as long as a
// re-registering node may wait out its previous incarnation's member key
// (writeMember), two lease TTLs and a second.
func regroupTimeout(ttl time.Duration) time.Duration { return 2*ttl + time.Second }

// evaluate acts on the current state until nothing more is to be done now
// (each write may enable the next, e.g. a proposal that needs no
// acknowledgement from others), then waits for events or the timer.
func (c *closer) evaluate(ctx context.Context) error {
	for range 4 {
		before := c.headRev
		if err := c.step(ctx); err != nil || c.headRev == before {
			return err
		}
	}
	return nil
}

// step asks decide what to do now and does it: at most one write; when
// there is none to make it arms the timer for the next deadline (last
// call, acknowledgements).
func (c *closer) step(ctx context.Context) error {
	var (
		ended     []string
		forgiveAt time.Time
	)
	if c.suspects > 0 {
		ended, forgiveAt = suspicionEnded(c.members, time.Now(), suspectFor(c.cfg.LeaseTTL))
	}
	for _, id := range ended {
		c.setSuspect(c.members[id], false)
		c.log.Info("rendezvous: closer: a node left out for a missed acknowledgement still holds its lease: it is alive and waits as a spare", "node", id)
	}
	a := decide(c.view(), time.Now())
	if a.kind == actWake && !forgiveAt.IsZero() && (a.wake.IsZero() || forgiveAt.Before(a.wake)) {
		a.wake = forgiveAt
	}
	c.lastCall = a.lastCall
	switch a.kind {
	case actPropose:
		return c.propose(ctx, a)
	case actClose:
		return c.close(ctx)
	case actAckTimeout:
		return c.ackTimeout(ctx)
	case actFinish:
		h := *c.head
		h.State = stateFinished
		c.log.Info("rendezvous: closer: every member finished: the rendezvous is closed for good", "round", h.Round)
		return c.writeHead(ctx, &h, nil)
	}
	if !c.timer.Stop() {
		select {
		case <-c.timer.C:
		default:
		}
	}
	if !a.wake.IsZero() {
		c.timer.Reset(time.Until(a.wake))
	}
	return nil
}

// ackTimeout leaves out the members that did not acknowledge the proposal,
// after re-reading the acknowledgements (the watch may lag under load).
func (c *closer) ackTimeout(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, c.n.opTimeout())
	g, err := c.n.cli.Get(rctx, c.k.Acks, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return fmt.Errorf("rendezvous: closer: read %s: %w", c.k.Acks, err)
	}
	before := len(c.acked)
	for _, kv := range g.Kvs {
		c.apply(&clientv3.Event{Type: mvccpb.PUT, Kv: kv})
	}
	v := c.view()
	if len(c.acked) == v.acksNeeded() {
		return c.close(ctx)
	}
	if len(c.acked) > before {
		return nil // progress after all: wait another AckTimeout
	}
	missing := v.missingAcks()
	for _, id := range missing {
		if cm := c.members[id]; cm != nil {
			c.setSuspect(cm, true)
		}
	}
	c.log.Warn("rendezvous: closer: leaving out nodes that did not acknowledge the proposed round (dead agent?)",
		"round", c.head.Round, "nodes", list(missing), "ack_wait", ackWait(c.cfg.AckTimeout, len(c.round)))
	a := c.view().proposal(MemberLost, fmt.Sprintf("node(s) %s did not acknowledge round %d within %s", list(missing), c.head.Round, ackWait(c.cfg.AckTimeout, len(c.round))))
	if a.kind != actPropose {
		return nil
	}
	return c.propose(ctx, a)
}

// propose writes the round decide proposed: a new member list, or an open
// round when too few nodes are left.
func (c *closer) propose(ctx context.Context, a action) error {
	if a.members == nil {
		h := &header{V: formatVersion, Round: a.round, State: stateOpen, Target: a.target, Reason: a.reason, Detail: a.detail, Closer: c.n.cfg.NodeID}
		c.log.Info("rendezvous: closer: round ended; waiting for nodes", "round", a.round, "nodes", a.candidates, "min", c.cfg.MinNodes, "reason", a.reason, "detail", a.detail)
		return c.writeHead(ctx, h, nil)
	}
	size := len(a.members)
	world := 0
	for _, m := range a.members {
		world += m.LocalWorldSize
	}
	h := &header{
		V: formatVersion, Round: a.round, State: stateProposed, Nonce: newNonce(),
		Nodes: size, World: world, Chunks: chunkCount(size), Target: a.target,
		AckAll: a.ackAll, Reason: a.reason, Detail: a.detail, Closer: c.n.cfg.NodeID,
	}
	if a.reason == MemberFailed && c.failure != nil {
		h.Summary = c.failure.Summary
	}
	if err := c.writeChunks(ctx, h, a.members); err != nil {
		return err
	}
	c.log.Info("rendezvous: closer: proposing round", "round", a.round, "nodes", size, "world", world,
		"spares", a.spares, "reason", a.reason, "detail", a.detail)
	return c.writeHead(ctx, h, a.members)
}

func (c *closer) writeChunks(ctx context.Context, h *header, ms []Member) error {
	chunks := encodeChunks(ms, h.Chunks)
	var ops []clientv3.Op
	bytes := 0
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		wctx, cancel := context.WithTimeout(ctx, c.n.opTimeout())
		defer cancel()
		_, err := c.n.cli.Txn(wctx).Then(ops...).Commit()
		ops, bytes = ops[:0], 0
		if err != nil {
			return fmt.Errorf("rendezvous: closer: write member list of round %d under %s: %w", h.Round, c.k.ChunkPrefix(h.Round, h.Nonce), err)
		}
		return nil
	}
	for i, v := range chunks {
		if len(ops) == maxChunkBatchOps || bytes+len(v) > maxChunkBatchBytes {
			if err := flush(); err != nil {
				return err
			}
		}
		ops = append(ops, clientv3.OpPut(c.k.Chunk(h.Round, h.Nonce, i), string(v)))
		bytes += len(v) + 64
	}
	return flush()
}

// keptFailureReports is how many rounds before the one opening keep their
// failure reports (a failure's round, and one more that may not form).
const keptFailureReports = 2

// writeHead publishes h if nobody changed the header since we read it and
// this node is still registered. ms is the member list of a proposal.
func (c *closer) writeHead(ctx context.Context, h *header, ms []Member) error {
	v, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("rendezvous: closer: encode round record: %w", err)
	}
	c.n.mu.Lock()
	memberRev := c.n.memberRev
	c.n.mu.Unlock()
	ops := []clientv3.Op{clientv3.OpPut(c.k.Head, string(v))}
	if h.State != stateClosed && h.State != stateFinished && h.State != stateFailed {
		seg := fleet.Hex16(h.Round)
		ops = append(ops,
			clientv3.OpDelete(c.k.Chunks, clientv3.WithRange(c.k.Chunks+seg)),
			// The failure reports of the last keptFailureReports rounds
			// stay: elasticctl shows the last one and its time (describe's
			// Last error, get jobs' Restarting).
			clientv3.OpDelete(c.k.Failures, clientv3.WithRange(c.k.Failures+fleet.Hex16(max(h.Round-keptFailureReports, 0)))),
			clientv3.OpDelete(c.k.Done, clientv3.WithRange(c.k.Done+seg)),
		)
	}
	wctx, cancel := context.WithTimeout(ctx, c.n.opTimeout())
	defer cancel()
	resp, err := c.n.cli.Txn(wctx).If(
		clientv3.Compare(clientv3.ModRevision(c.k.Head), "=", c.headRev),
		clientv3.Compare(clientv3.CreateRevision(c.k.Member(c.n.cfg.NodeID)), "=", memberRev),
	).Then(ops...).Commit()
	if err == nil && !resp.Succeeded {
		err = errResnapshot
	}
	if err != nil {
		if h.State == stateProposed {
			dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_, _ = c.n.cli.Delete(dctx, c.k.ChunkPrefix(h.Round, h.Nonce), clientv3.WithPrefix())
			dcancel()
		}
		if errors.Is(err, errResnapshot) {
			return fmt.Errorf("%w: round record %s changed under us", errResnapshot, c.k.Head)
		}
		return fmt.Errorf("rendezvous: closer: write round record %s: %w", c.k.Head, err)
	}
	c.head, c.headRev, c.headBad = h, resp.Header.Revision, false
	if h.State == stateProposed {
		c.setRound(ms)
	}
	if h.State != stateClosed {
		c.failure, c.finish = nil, false
	}
	c.lastCall = time.Time{}
	return nil
}

// close finalises the proposal every member acknowledged.
func (c *closer) close(ctx context.Context) error {
	r0 := c.round[0]
	h := *c.head
	if h.Reason == MemberFailed {
		// Every member of the failed round acknowledged this one: the
		// failure was the workers' own, so it counts as one job restart.
		if err := c.countRestart(ctx, h.Round); err != nil {
			return err
		}
	}
	h.State, h.MasterAddr, h.MasterPort = stateClosed, r0.Addr, c.acked[r0.NodeID].Port
	if err := c.writeHead(ctx, &h, nil); err != nil {
		return err
	}
	c.log.Info("rendezvous: closer: round closed", "round", h.Round, "nodes", h.Nodes, "world", h.World,
		"master", fmt.Sprintf("%s:%d", h.MasterAddr, h.MasterPort), "acks_took", time.Since(c.proposedAt))
	return nil
}

// countRestart adds one to the job's restart count for the round that
// closes after a failure. The count's key records the round it was last
// counted for, so a closer that takes over and closes the same round again
// does not count it twice.
func (c *closer) countRestart(ctx context.Context, round int64) error {
	marker := c.k.restartsCounted
	for {
		if err := c.countRestartOnce(ctx, marker, round); !errors.Is(err, errCountChanged) {
			return err
		}
	}
}

// errCountChanged: the restart count changed under countRestartOnce; read it again.
var errCountChanged = errors.New("restart count changed; retrying")

// countRestartOnce is one read-and-increment of countRestart, each request
// bounded by opTimeout.
func (c *closer) countRestartOnce(ctx context.Context, marker string, round int64) error {
	ctx, cancel := context.WithTimeout(ctx, c.n.opTimeout())
	defer cancel()
	st := fleet.New(c.n.cli, c.cfg.Prefix)
	// A malformed count (or marker) is logged and replaced: it never stops
	// the job (Counter falls back to its last good value, or 0).
	cur, mod, problem, err := st.Counter(ctx, c.k.restarts, "restart count")
	if err != nil {
		return fmt.Errorf("rendezvous: %w", err)
	}
	if problem != nil {
		c.log.Warn("rendezvous: closer: malformed restart count", "err", problem)
	}
	counted, _, _, err := st.Counter(ctx, marker, "counted round")
	if err != nil {
		return fmt.Errorf("rendezvous: %w", err)
	}
	if counted == round {
		return nil
	}
	t, err := c.n.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(c.k.restarts), "=", mod)).
		Then(clientv3.OpPut(c.k.restarts, fleet.FormatCount(cur+1)), clientv3.OpPut(marker, fleet.FormatCount(round))).Commit()
	if err != nil {
		return fmt.Errorf("rendezvous: count restart: %w", err)
	}
	if t.Succeeded {
		c.log.Info("rendezvous: closer: counted a job restart", "round", round, "restarts", cur+1)
		return nil
	}
	return errCountChanged
}

package rendezvous

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
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
}

type closer struct {
	n   *Node
	cfg *Config
	k   keys
	log *slog.Logger

	members  map[string]*cand
	nSuspect int

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
			m.rec = rec
			return
		}
		c.members[id] = &cand{id: id, rec: rec, createRev: ev.Kv.CreateRevision}
		if _, ok := c.inRound[id]; ok && !c.lostSet[id] {
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
			m.suspect = false
			c.nSuspect--
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
		if r, err := strconv.ParseUint(key[len(c.k.Failures):], 16, 63); err != nil || int64(r) != c.head.Round {
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
		if r, err := strconv.ParseUint(key[len(c.k.Done):], 16, 63); err == nil && int64(r) == c.head.Round {
			c.finish = true
		}
	}
}

func (c *closer) removeMember(id string) {
	m := c.members[id]
	if m == nil {
		return
	}
	delete(c.members, id)
	if m.suspect {
		c.nSuspect--
	}
	if _, ok := c.inRound[id]; ok && !c.lostSet[id] {
		c.present--
		c.lostSet[id] = true
		c.lost = append(c.lost, id)
	}
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

// capacity is the size a round should have: the target clamped to
// [MIN, MAX] when set, else MAX.
func (c *closer) capacity() int {
	if c.target > 0 {
		return min(max(c.target, c.cfg.MinNodes), c.cfg.MaxNodes)
	}
	return c.cfg.MaxNodes
}

func (c *closer) headTarget() int {
	if c.target > 0 {
		return c.capacity()
	}
	return 0
}

// evaluate acts on the current state until nothing more is to be done now
// (each write may enable the next, e.g. a proposal that needs no
// acknowledgement from others), then waits for events or the timer.
func (c *closer) evaluate(ctx context.Context) error {
	for range 4 {
		before := c.headRev
		if err := c.decide(ctx); err != nil || c.headRev == before {
			return err
		}
	}
	return nil
}

// decide makes at most one write; when it makes none it arms the timer for
// the next deadline (last call, acknowledgements).
func (c *closer) decide(ctx context.Context) error {
	now := time.Now()
	var wake time.Time
	avail := len(c.members) - c.nSuspect - c.nLeaving()
	capN := c.capacity()
	state := ""
	if c.head != nil {
		state = c.head.State
		if state == stateClosed && c.finish && c.present == 0 {
			state = stateOpen // everyone finished: a later node starts over
		}
	}
	lastCall := func(reason Reason, detail string) error {
		if c.lastCall.IsZero() {
			c.lastCall = now.Add(c.cfg.LastCallTimeout)
		}
		if !now.Before(c.lastCall) {
			return c.propose(ctx, reason, detail)
		}
		wake = c.lastCall
		return nil
	}
	switch state {
	case "", stateOpen:
		var reason Reason
		var detail string
		if c.head != nil && c.head.State == stateOpen {
			reason, detail = c.head.Reason, c.head.Detail
		}
		switch {
		case avail >= capN:
			return c.propose(ctx, reason, detail)
		case avail >= c.cfg.MinNodes:
			if err := lastCall(reason, detail); err != nil {
				return err
			}
		default:
			c.lastCall = time.Time{}
		}
	case stateProposed:
		switch {
		case len(c.lost) > 0:
			return c.propose(ctx, MemberLost, fmt.Sprintf("node(s) %s left or lost their lease before round %d closed", list(c.lost), c.head.Round))
		case len(c.leavingInRound()) > 0:
			return c.propose(ctx, NodeLeaving, fmt.Sprintf("node(s) %s are draining", list(c.leavingInRound())))
		case len(c.acked) == c.acksNeeded():
			return c.close(ctx)
		}
		deadline := c.ackSince.Add(c.cfg.AckTimeout)
		if !now.Before(deadline) {
			return c.ackTimeout(ctx)
		}
		wake = deadline
	case stateClosed:
		size := len(c.round)
		waiting := avail - c.present
		switch {
		case c.failure != nil && len(c.lost) > 0:
			// A member is gone too: its death broke the others' collectives.
			// A membership change, not counted as a restart.
			return c.propose(ctx, MemberLost, fmt.Sprintf("node(s) %s of round %d left or lost their lease (and node %s reported a worker failure: %s)", list(c.lost), c.head.Round, c.failure.Node, c.failure.Detail))
		case c.failure != nil:
			return c.propose(ctx, MemberFailed, fmt.Sprintf("node %s reported a worker failure in round %d: %s", c.failure.Node, c.head.Round, c.failure.Detail))
		case c.finish:
			// Members leave as their workers succeed; nothing restarts.
		case len(c.lost) > 0:
			return c.propose(ctx, MemberLost, fmt.Sprintf("node(s) %s of round %d left or lost their lease", list(c.lost), c.head.Round))
		case len(c.leavingInRound()) > 0:
			return c.propose(ctx, NodeLeaving, fmt.Sprintf("node(s) %s of round %d are draining", list(c.leavingInRound()), c.head.Round))
		case capN < size:
			return c.propose(ctx, TargetChanged, fmt.Sprintf("target %d: shrinking from %d to %d nodes", c.target, size, capN))
		case waiting > 0 && size < capN:
			headCap := c.cfg.MaxNodes
			if c.head.Target > 0 {
				headCap = c.head.Target
			}
			// Growth waits for the nodes it grows by: at once when enough
			// are waiting, else a last call after the first one arrived,
			// so nodes started a moment apart (the coordinator's new
			// placement) join in one round instead of one round each.
			reason, detail := NodeWaiting, fmt.Sprintf("%d node(s) waiting while round %d has %d of %d nodes", waiting, c.head.Round, size, capN)
			if capN > headCap {
				reason, detail = TargetChanged, fmt.Sprintf("target %d: growing from %d nodes with %d waiting", c.target, size, waiting)
			}
			if avail >= capN {
				return c.propose(ctx, reason, detail)
			}
			if err := lastCall(reason, detail); err != nil {
				return err
			}
		default:
			c.lastCall = time.Time{}
		}
	}
	if !c.timer.Stop() {
		select {
		case <-c.timer.C:
		default:
		}
	}
	if !wake.IsZero() {
		c.timer.Reset(time.Until(wake))
	}
	return nil
}

func list(ids []string) string {
	if len(ids) > 5 {
		return strings.Join(ids[:5], ", ") + fmt.Sprintf(" and %d more", len(ids)-5)
	}
	return strings.Join(ids, ", ")
}

// acksNeeded is how many acknowledgements close the proposal: all members
// (in rank order) when AckAll, else rank 0's alone.
func (c *closer) acksNeeded() int {
	if c.head.AckAll {
		return len(c.round)
	}
	return 1
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
	if len(c.acked) == c.acksNeeded() {
		return c.close(ctx)
	}
	if len(c.acked) > before {
		return nil // progress after all: wait another AckTimeout
	}
	var missing []string
	for _, m := range c.round[:c.acksNeeded()] {
		if _, ok := c.acked[m.NodeID]; ok {
			continue
		}
		missing = append(missing, m.NodeID)
		if cm := c.members[m.NodeID]; cm != nil && !cm.suspect {
			cm.suspect = true
			c.nSuspect++
		}
	}
	c.log.Warn("rendezvous: closer: leaving out nodes that did not acknowledge the proposed round (dead agent?)",
		"round", c.head.Round, "nodes", list(missing), "ack_timeout", c.cfg.AckTimeout)
	return c.propose(ctx, MemberLost, fmt.Sprintf("node(s) %s did not acknowledge round %d within %s", list(missing), c.head.Round, c.cfg.AckTimeout))
}

// candidates are the live members not under suspicion.
func (c *closer) candidates() []*cand {
	out := make([]*cand, 0, len(c.members))
	for _, m := range c.members {
		if !m.suspect && !m.rec.Leaving {
			out = append(out, m)
		}
	}
	return out
}

// nLeaving counts the members that are draining (suspects apart).
func (c *closer) nLeaving() int {
	n := 0
	for _, m := range c.members {
		if m.rec.Leaving && !m.suspect {
			n++
		}
	}
	return n
}

// leavingInRound lists the members of the current round that are draining.
func (c *closer) leavingInRound() []string {
	var out []string
	for _, m := range c.round {
		if cm := c.members[m.NodeID]; cm != nil && cm.rec.Leaving {
			out = append(out, m.NodeID)
		}
	}
	return out
}

// assign picks size nodes and ranks them: members of the previous round
// first (they keep their rank when it still exists), then the others in
// join order; freed ranks go to the remaining nodes in that order.
// placement is the coordinator's node placement of the job (the desired
// record's nodes) when the round cannot take every candidate: the placed
// nodes are kept, the others become spares (and are drained by their node
// agents). nil when there is none.
func (c *closer) placement(needed bool) map[string]bool {
	if !needed || len(c.placed) == 0 {
		return nil
	}
	set := make(map[string]bool, len(c.placed))
	for _, id := range c.placed {
		set[id] = true
	}
	return set
}

// assign picks size members, keeping nodes of the previous round (and, when
// placed is set, the placed nodes first) and their ranks where possible.
func assign(prev []Member, cands []*cand, size int, placed map[string]bool) []Member {
	byID := make(map[string]*cand, len(cands))
	for _, c := range cands {
		byID[c.id] = c
	}
	oldRank := make(map[string]int, len(prev))
	order := make([]*cand, 0, len(cands))
	for _, m := range prev {
		if c := byID[m.NodeID]; c != nil {
			oldRank[m.NodeID] = m.GroupRank
			order = append(order, c)
			delete(byID, m.NodeID)
		}
	}
	rest := make([]*cand, 0, len(byID))
	for _, c := range byID {
		rest = append(rest, c)
	}
	slices.SortFunc(rest, func(a, b *cand) int {
		return cmp.Or(cmp.Compare(a.createRev, b.createRev), strings.Compare(a.id, b.id))
	})
	order = append(order, rest...)
	if placed != nil {
		slices.SortStableFunc(order, func(a, b *cand) int {
			switch pa, pb := placed[a.id], placed[b.id]; {
			case pa && !pb:
				return -1
			case pb && !pa:
				return 1
			}
			return 0
		})
	}
	order = order[:size]
	slots := make([]*cand, size)
	var floating []*cand
	for _, c := range order {
		if r, ok := oldRank[c.id]; ok && r < size && slots[r] == nil {
			slots[r] = c
		} else {
			floating = append(floating, c)
		}
	}
	for i := range slots {
		if slots[i] == nil {
			slots[i], floating = floating[0], floating[1:]
		}
	}
	out := make([]Member, size)
	base := 0
	for i, c := range slots {
		out[i] = Member{NodeID: c.id, Addr: c.rec.Addr, LocalWorldSize: c.rec.LWS, GroupRank: i, BaseRank: base}
		base += c.rec.LWS
	}
	return out
}

// nextRound is the number of the next round record.
func (c *closer) nextRound() int64 {
	switch {
	case c.headBad:
		return c.headRev + 1 // above every round written before it
	case c.head == nil:
		return 1
	case c.head.State == stateOpen:
		return c.head.Round
	default:
		return c.head.Round + 1
	}
}

// propose fixes a new member list, or records an open round when too few
// nodes are left.
func (c *closer) propose(ctx context.Context, reason Reason, detail string) error {
	cands := c.candidates()
	next := c.nextRound()
	if len(cands) < c.cfg.MinNodes {
		if c.head != nil && c.head.State == stateOpen {
			return nil
		}
		h := &header{V: formatVersion, Round: next, State: stateOpen, Target: c.headTarget(), Reason: reason, Detail: detail, Closer: c.n.cfg.NodeID}
		c.log.Info("rendezvous: closer: round ended; waiting for nodes", "round", next, "nodes", len(cands), "min", c.cfg.MinNodes, "reason", reason, "detail", detail)
		return c.writeHead(ctx, h, nil)
	}
	size := min(len(cands), c.capacity())
	ms := assign(c.round, cands, size, c.placement(size < len(cands)))
	world := 0
	for _, m := range ms {
		world += m.LocalWorldSize
	}
	h := &header{
		V: formatVersion, Round: next, State: stateProposed, Nonce: newNonce(),
		Nodes: size, World: world, Chunks: chunkCount(size), Target: c.headTarget(),
		AckAll: reason == MemberLost || reason == MemberFailed,
		Reason: reason, Detail: detail, Closer: c.n.cfg.NodeID,
	}
	if err := c.writeChunks(ctx, h, ms); err != nil {
		return err
	}
	c.log.Info("rendezvous: closer: proposing round", "round", next, "nodes", size, "world", world,
		"spares", len(cands)-size, "reason", reason, "detail", detail)
	return c.writeHead(ctx, h, ms)
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
	if h.State != stateClosed {
		seg := fleet.Hex16(h.Round)
		ops = append(ops,
			clientv3.OpDelete(c.k.Chunks, clientv3.WithRange(c.k.Chunks+seg)),
			clientv3.OpDelete(c.k.Failures, clientv3.WithRange(c.k.Failures+seg)),
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
		g, err := c.n.cli.Txn(ctx).Then(clientv3.OpGet(c.k.restarts), clientv3.OpGet(marker)).Commit()
		if err != nil {
			return fmt.Errorf("rendezvous: read %s: %w", c.k.restarts, err)
		}
		cur, mod := int64(0), int64(0)
		if kv := g.Responses[0].GetResponseRange().Kvs; len(kv) > 0 {
			if cur, err = fleet.ParseCount(c.k.restarts, kv[0].Value, "restart count", 0); err != nil {
				return fmt.Errorf("rendezvous: %w", err)
			}
			mod = kv[0].ModRevision
		}
		if kv := g.Responses[1].GetResponseRange().Kvs; len(kv) > 0 && string(kv[0].Value) == fleet.FormatCount(round) {
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
	}
}

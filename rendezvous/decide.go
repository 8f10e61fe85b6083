package rendezvous

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The closer's decisions are one pure function, decide(view, now): the
// closer (closer.go) keeps its state from etcd watches, hands decide a
// snapshot of it, and carries out the action it returns (an etcd write, a
// re-read of the acknowledgements, or arming its timer). decide reads no
// clock and does no I/O, so every rule below is tested by a table
// (decide_test.go) without etcd and without waiting.

// view is what the closer knows when it decides: a snapshot of its state.
// decide does not modify it (its maps are the closer's own, shared).
type view struct {
	// members are the live member records by node id (suspects flagged);
	// avail counts those neither suspect nor draining, and draining those
	// draining (the closer keeps both counts as members change: counting
	// them on every decision cost O(nodes) per watch event, seconds of a
	// 10,000-node join).
	members         map[string]*cand
	avail, draining int
	// head is the current round record (nil when absent or malformed,
	// headBad when malformed); headRev is its mod revision.
	head    *header
	headRev int64
	headBad bool
	// round is the member list of the latest proposal, in rank order
	// (kept while the round is open); present counts its members still
	// registered, lost lists those gone since.
	round   []Member
	present int
	lost    []string
	// acked holds the acknowledgements of the proposal by node id.
	acked map[string]ackRec
	// failure is the first failure report of the closed round; finish says
	// a member of it finished (its workers succeeded).
	failure *failureRec
	finish  bool
	// target and placed are the desired record's size (0: none) and nodes.
	target int
	placed []string
	// lastCall is the deadline of the running last call (zero: none);
	// ackSince is when the acknowledgements last made progress.
	lastCall time.Time
	ackSince time.Time

	minNodes, maxNodes int
	// sizes (ascending) or step (> 1) narrow the sizes a round may have
	// within [minNodes, maxNodes], as the job spec's sizes and step do for
	// the coordinator's engine; neither set: every size.
	sizes                       []int
	step                        int
	lastCallTimeout, ackTimeout time.Duration
	// regroupTimeout bounds the wait for the lost members of a round that
	// lost every member (see decide: an etcd outage fences a whole job).
	regroupTimeout time.Duration
}

// actionKind is what the closer does next.
type actionKind int

const (
	// actWake: nothing to do now; decide again at action.wake (zero: at
	// the next event).
	actWake actionKind = iota
	// actPropose: write a new round: action.members in rank order, or an
	// open round when members is nil (too few nodes are left).
	actPropose
	// actClose: every acknowledgement the proposal needs is in: close it.
	actClose
	// actAckTimeout: members of the proposal did not acknowledge within
	// AckTimeout: re-read the acknowledgements, then leave out
	// action.missing and propose again.
	actAckTimeout
	// actFinish: every member of the closed round finished: close the
	// rendezvous for good (a node joining later is refused).
	actFinish
)

func (k actionKind) String() string {
	switch k {
	case actWake:
		return "wake-at"
	case actPropose:
		return "propose"
	case actClose:
		return "close"
	case actAckTimeout:
		return "ack-timeout"
	case actFinish:
		return "finish"
	}
	return fmt.Sprintf("actionKind(%d)", int(k))
}

// action is decide's outcome.
type action struct {
	kind actionKind
	// lastCall is the last-call deadline the closer keeps from now on
	// (zero: none running), whatever the kind.
	lastCall time.Time
	// wake (actWake) is when to decide again; zero: at the next event.
	wake time.Time

	// actPropose: the round's number, reason and detail, its target (the
	// header's), whether every member must acknowledge it, and its member
	// list (nil: the round is recorded open). spares counts the
	// candidates left out; candidates counts all of them.
	round      int64
	reason     Reason
	detail     string
	target     int
	ackAll     bool
	members    []Member
	candidates int
	spares     int

	// actAckTimeout: the members that did not acknowledge, in rank order.
	missing []string
}

// decide is the closer's rule book: what to do with the job in state v at
// time now.
//
// A round closes at MaxNodes at once; at >= MinNodes after the last call;
// at the target size at once. In a proposed round, a lost or draining
// member means a new proposal at once, complete acknowledgements close it,
// and missing ones after AckTimeout leave their nodes out. In a closed
// round, a failure or a lost or draining member means a new round at once,
// a lower target shrinks at once, and waiting nodes grow the round: at once
// when enough wait, else after the last call from the first of them. A
// closed round that lost every member (present == 0: the whole job was
// fenced, as an etcd outage longer than the lease does) is re-formed by its
// members together: the closer waits for the lost members to register
// again, up to regroupTimeout, instead of forming a smaller round with the
// first to come back and growing it again (every node restarting twice).
func decide(v view, now time.Time) action {
	lc := v.lastCall
	done := func(a action) action {
		a.lastCall = lc
		return a
	}
	propose := func(reason Reason, detail string) action { return done(v.proposal(reason, detail)) }
	// lastCall proposes once the last call that starts now (or started
	// earlier) has run out.
	lastCall := func(reason Reason, detail string) action {
		if lc.IsZero() {
			lc = now.Add(v.lastCallTimeout)
		}
		if !now.Before(lc) {
			return propose(reason, detail)
		}
		return done(action{kind: actWake, wake: lc})
	}
	avail := v.available()
	capN := v.capacity()
	state := ""
	if v.head != nil {
		state = v.head.State
		if state == stateClosed && v.finish && v.present == 0 {
			// Everyone finished: the job is done. A later node does not
			// start it over (torch answers a closed rendezvous).
			return done(action{kind: actFinish})
		}
	}
	if state == stateFinished || state == stateFailed {
		return done(action{kind: actWake})
	}
	switch state {
	case "", stateOpen:
		var reason Reason
		var detail string
		if v.head != nil && v.head.State == stateOpen {
			reason, detail = v.head.Reason, v.head.Detail
		}
		switch {
		case avail >= capN:
			return propose(reason, detail)
		case avail >= v.minNodes:
			return lastCall(reason, detail)
		}
		lc = time.Time{}
	case stateProposed:
		leaving := v.leavingInRound()
		switch {
		case len(v.lost) > 0:
			return propose(MemberLost, fmt.Sprintf("node(s) %s left or lost their lease before round %d closed", list(v.lost), v.head.Round))
		case len(leaving) > 0:
			return propose(NodeLeaving, fmt.Sprintf("node(s) %s are draining", list(leaving)))
		case len(v.acked) == v.acksNeeded():
			return done(action{kind: actClose})
		}
		deadline := v.ackSince.Add(ackWait(v.ackTimeout, len(v.round)))
		if !now.Before(deadline) {
			return done(action{kind: actAckTimeout, missing: v.missingAcks()})
		}
		return done(action{kind: actWake, wake: deadline})
	case stateClosed:
		size := len(v.round)
		waiting := avail - v.present
		leaving := v.leavingInRound()
		if v.present == 0 && len(v.lost) > 0 && !v.finish && len(v.away()) > 0 {
			// Regroup: wait for the round's members to come back.
			if lc.IsZero() {
				lc = now.Add(v.regroupTimeout)
			}
			if now.Before(lc) {
				return done(action{kind: actWake, wake: lc})
			}
		}
		switch {
		case v.failure != nil && len(v.lost) > 0:
			// A member is gone too: its death broke the others' collectives.
			// A membership change, not counted as a restart.
			return propose(MemberLost, fmt.Sprintf("node(s) %s of round %d left or lost their lease (and node %s reported a worker failure: %s)", list(v.lost), v.head.Round, v.failure.Node, v.failure.Detail))
		case v.failure != nil:
			return propose(MemberFailed, fmt.Sprintf("node %s reported a worker failure in round %d: %s", v.failure.Node, v.head.Round, v.failure.Detail))
		case v.finish:
			// Members leave as their workers succeed; nothing restarts.
		case len(v.lost) > 0:
			return propose(MemberLost, fmt.Sprintf("node(s) %s of round %d left or lost their lease", list(v.lost), v.head.Round))
		case len(leaving) > 0:
			return propose(NodeLeaving, fmt.Sprintf("node(s) %s of round %d are draining", list(leaving), v.head.Round))
		case capN < size:
			return propose(TargetChanged, fmt.Sprintf("target %d: shrinking from %d to %d nodes", v.target, size, capN))
		case waiting > 0 && size < capN && v.fit(avail) > size:
			headCap := v.maxNodes
			if v.head.Target > 0 {
				headCap = v.head.Target
			}
			// Growth waits for the nodes it grows by: at once when enough
			// are waiting, else a last call after the first one arrived,
			// so nodes started a moment apart (the coordinator's new
			// placement) join in one round instead of one round each.
			reason, detail := NodeWaiting, fmt.Sprintf("%d node(s) waiting while round %d has %d of %d nodes", waiting, v.head.Round, size, capN)
			if capN > headCap {
				reason, detail = TargetChanged, fmt.Sprintf("target %d: growing from %d nodes with %d waiting", v.target, size, waiting)
			}
			if avail >= capN {
				return propose(reason, detail)
			}
			return lastCall(reason, detail)
		default:
			lc = time.Time{}
		}
	}
	return done(action{kind: actWake})
}

// proposal is the round to propose now, for reason: the candidates ranked
// by assign, at most the capacity of them; an open round when fewer than
// MinNodes are left.
func (v view) proposal(reason Reason, detail string) action {
	cands := v.candidates()
	a := action{
		kind: actPropose, round: v.nextRound(), reason: reason, detail: detail,
		target: v.headTarget(), candidates: len(cands),
	}
	if len(cands) < v.minNodes {
		if v.head != nil && v.head.State == stateOpen {
			return action{kind: actWake} // recorded open already
		}
		return a
	}
	// Never a size the job does not allow: after a loss, the largest one
	// the nodes left can fill (the others wait as spares).
	size := v.fit(min(len(cands), v.capacity()))
	a.members = assign(v.round, cands, size, v.placement(size < len(cands)))
	a.spares = len(cands) - size
	a.ackAll = reason == MemberLost || reason == MemberFailed
	return a
}

// suspectFor is how long a node left out for a missed acknowledgement
// stays a suspect while its member key lives: a dead agent's lease expires
// within one TTL of its last keepalive (before the acknowledgement it
// missed), so a key that outlives two is a live node's.
func suspectFor(ttl time.Duration) time.Duration { return 2 * ttl }

// suspicionEnded lists, in id order, the suspects whose suspicion ended by
// now (suspected for at least after while still registered), and the
// earliest time another one ends (zero: none). A live node that never
// acknowledges anything again (its watch delivered only the round that
// superseded the proposal it missed, as after a freeze) would otherwise
// stay out of every round for good.
func suspicionEnded(members map[string]*cand, now time.Time, after time.Duration) (ended []string, next time.Time) {
	for id, m := range members {
		if !m.suspect {
			continue
		}
		if at := m.suspectedAt.Add(after); !now.Before(at) {
			ended = append(ended, id)
		} else if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	slices.Sort(ended)
	return ended, next
}

// available counts the candidates: live members neither suspect nor
// draining.
func (v view) available() int { return v.avail }

// unavailable says whether a member is no candidate: suspect or draining.
func unavailable(m *cand) bool { return m.suspect || m.rec.Leaving }

// tally counts the members that are candidates and those draining, one
// by one.
func tally(members map[string]*cand) (avail, draining int) {
	for _, m := range members {
		avail += b2i(!unavailable(m))
		draining += b2i(m.rec.Leaving)
	}
	return avail, draining
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// candidates are the live members not under suspicion and not draining.
func (v view) candidates() []*cand {
	out := make([]*cand, 0, len(v.members))
	for _, m := range v.members {
		if !unavailable(m) {
			out = append(out, m)
		}
	}
	return out
}

// capacity is the size a round should have: the target clamped to
// [MIN, MAX] when set, else MAX, down to an allowed size.
func (v view) capacity() int {
	if v.target > 0 {
		return max(v.fit(v.target), v.minNodes)
	}
	return max(v.fit(v.maxNodes), v.minNodes)
}

// fit is the largest size a round may have with at most n nodes (0: none,
// fewer than MinNodes).
func (v view) fit(n int) int { return fitSize(n, v.minNodes, v.maxNodes, v.sizes, v.step) }

// fitSize is the largest allowed node count of at most n (0: none): at
// most maxNodes, one of sizes when set, else minNodes plus a multiple of
// step.
func fitSize(n, minNodes, maxNodes int, sizes []int, step int) int {
	n = min(n, maxNodes)
	if n < minNodes {
		return 0
	}
	if len(sizes) > 0 {
		i, _ := slices.BinarySearch(sizes, n+1) // the first size above n
		if i == 0 {
			return 0
		}
		return sizes[i-1]
	}
	step = max(step, 1)
	return minNodes + (n-minNodes)/step*step
}

// headTarget is the target a new round record carries (0: none).
func (v view) headTarget() int {
	if v.target > 0 {
		return v.capacity()
	}
	return 0
}

// away lists the lost members of the round that have not registered again
// (a member fenced by an etcd outage registers again with a fresh lease).
func (v view) away() []string {
	var out []string
	for _, id := range v.lost {
		if v.members[id] == nil {
			out = append(out, id)
		}
	}
	return out
}

// leavingInRound lists the members of the current round that are draining.
func (v view) leavingInRound() []string {
	if v.draining == 0 {
		return nil
	}
	var out []string
	for _, m := range v.round {
		if cm := v.members[m.NodeID]; cm != nil && cm.rec.Leaving {
			out = append(out, m.NodeID)
		}
	}
	return out
}

// ackWaitPerMember is what each member of a proposal adds to the wait
// for its acknowledgements (ackWait).
const ackWaitPerMember = 250 * time.Microsecond

// ackWait is how long a proposal of size members waits for an
// acknowledgement without progress before it leaves the silent members
// out: AckTimeout, plus 250 us per member. Every member reads the
// proposal (its chunk) at once, so the member that must acknowledge may
// be served last: at 10,000 nodes on a 2-core etcd, rank 0's
// acknowledgement came 0.6 - 1.6 s after the proposal, and a fixed 1 s
// left a live rank 0 out and cost every node a second round. 10,000
// members wait 3.5 s; 8 members wait AckTimeout and 2 ms.
func ackWait(ackTimeout time.Duration, size int) time.Duration {
	return ackTimeout + time.Duration(size)*ackWaitPerMember
}

// acksNeeded is how many acknowledgements close the proposal: all members
// (in rank order) when AckAll, else rank 0's alone.
func (v view) acksNeeded() int {
	if v.head.AckAll {
		return len(v.round)
	}
	return 1
}

// missingAcks lists the members whose acknowledgement the proposal still
// needs, in rank order.
func (v view) missingAcks() []string {
	var out []string
	for _, m := range v.round[:v.acksNeeded()] {
		if _, ok := v.acked[m.NodeID]; !ok {
			out = append(out, m.NodeID)
		}
	}
	return out
}

// nextRound is the number of the next round record.
func (v view) nextRound() int64 {
	switch {
	case v.headBad:
		return v.headRev + 1 // above every round written before it
	case v.head == nil:
		return 1
	case v.head.State == stateOpen:
		return v.head.Round
	default:
		return v.head.Round + 1
	}
}

// placement is the coordinator's node placement of the job (the desired
// record's nodes) when the round cannot take every candidate: the placed
// nodes are kept, the others become spares (and are drained by their node
// agents). nil when there is none.
func (v view) placement(needed bool) map[string]bool {
	if !needed || len(v.placed) == 0 {
		return nil
	}
	set := make(map[string]bool, len(v.placed))
	for _, id := range v.placed {
		set[id] = true
	}
	return set
}

// assign picks size members, keeping nodes of the previous round (and, when
// placed is set, the placed nodes first) and their ranks where possible:
// members of the previous round first (they keep their rank when it still
// exists), then the others in join order; freed ranks go to the remaining
// nodes in that order.
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

func list(ids []string) string {
	if len(ids) > 5 {
		return strings.Join(ids[:5], ", ") + fmt.Sprintf(" and %d more", len(ids)-5)
	}
	return strings.Join(ids, ", ")
}

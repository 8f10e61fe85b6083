package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The member side: every node watches one key, the round header. When a
// proposal names it, the node reads the one chunk holding its entry (or the
// whole list for small rounds), rank 0 picks a fresh free MASTER_PORT, and
// the node acknowledges by writing its own ack key. When the header turns
// closed, Join returns the round.

// watchHead follows the round header until ctx ends, starting from its
// value kv at revision rev (read when the node registered).
func (n *Node) watchHead(ctx context.Context, kv *mvccpb.KeyValue, rev int64) {
	backoff := newBackoff()
	for first := true; ctx.Err() == nil; first = false {
		if !first {
			rctx, cancel := context.WithTimeout(ctx, n.opTimeout())
			g, err := n.cli.Get(rctx, n.k.Head)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					n.log.Warn("rendezvous: read round record", "key", n.k.Head, "err", err)
					backoff.wait(ctx)
				}
				continue
			}
			kv, rev = nil, g.Header.Revision
			if len(g.Kvs) > 0 {
				kv = g.Kvs[0]
			}
		}
		n.onHead(ctx, kv)
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		n.mu.Lock()
		n.rewatchHead = cancel
		n.mu.Unlock()
		for wr := range n.cli.Watch(wctx, n.k.Head, clientv3.WithRev(rev+1)) {
			if err := wr.Err(); err != nil {
				if ctx.Err() == nil {
					n.log.Warn("rendezvous: round record watch interrupted; re-reading", "err", err)
				}
				break
			}
			if len(wr.Events) == 0 {
				continue
			}
			ev := wr.Events[len(wr.Events)-1] // only the latest state matters
			if ev.Type == mvccpb.DELETE {
				n.onHead(ctx, nil)
			} else {
				n.onHead(ctx, ev.Kv)
			}
			backoff.reset()
		}
		cancel()
	}
}

// onHead applies one state of the round header.
func (n *Node) onHead(ctx context.Context, kv *mvccpb.KeyValue) {
	if kv == nil {
		n.mu.Lock()
		n.head, n.headRev, n.headErr = nil, 0, nil
		n.broadcastLocked()
		n.mu.Unlock()
		return
	}
	h, err := decodeHeader(n.k.Head, kv.Value)
	if err != nil {
		n.log.Error("rendezvous: bad round record", "err", err)
		n.mu.Lock()
		n.head, n.headRev, n.headErr = nil, kv.ModRevision, err
		n.broadcastLocked()
		n.mu.Unlock()
		return
	}
	var a assignment
	if h.State == stateProposed || h.State == stateClosed {
		a, err = n.assignment(ctx, h)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !errors.Is(err, errGone) {
				n.log.Error("rendezvous: bad round record", "err", err)
				n.mu.Lock()
				n.head, n.headRev, n.headErr = nil, kv.ModRevision, err
				n.broadcastLocked()
				n.mu.Unlock()
				return
			}
			// Superseded while we read it; a newer header follows.
			a = assignment{}
		}
	}
	n.mu.Lock()
	n.head, n.headRev, n.headErr = h, kv.ModRevision, nil
	if a.round != 0 {
		n.assigned = a
	}
	// A round written before this node registered names an earlier
	// incarnation of it (fenced: its lease was lost, e.g. in an etcd
	// outage), not this one: the closer replaces it, and joining it would
	// start workers that the next round restarts at once.
	current := kv.ModRevision > n.memberRev
	if h.State == stateClosed && a.in && current {
		n.joined = &Round{
			Number: h.Round, Members: a.members, Self: a.self, Rank: a.self.GroupRank,
			NumNodes: h.Nodes, WorldSize: h.World, MasterAddr: h.MasterAddr, MasterPort: h.MasterPort,
			Target: h.Target, Reason: h.Reason, Detail: h.Detail, FailureSummary: h.Summary, headRev: kv.ModRevision,
		}
		n.lastPort = h.MasterPort
	}
	n.broadcastLocked()
	n.mu.Unlock()
	if h.State == stateProposed && a.in && current && (h.AckAll || a.self.GroupRank == 0) {
		n.acknowledge(ctx, h, a)
	}
}

var errGone = errors.New("round record superseded")

// assignment finds this node in the proposal h (cached per proposal).
func (n *Node) assignment(ctx context.Context, h *header) (assignment, error) {
	n.mu.Lock()
	cached := n.assigned
	n.mu.Unlock()
	if cached.round == h.Round && cached.nonce == h.Nonce {
		return cached, nil
	}
	a := assignment{round: h.Round, nonce: h.Nonce}
	if n.cfg.MemberListLimit < 0 || h.Nodes <= n.cfg.MemberListLimit {
		var all []Member
		err := n.read(ctx, "read member list", func(ctx context.Context) (err error) {
			all, err = n.readAll(ctx, h)
			return err
		})
		if err != nil {
			return a, err
		}
		a.members = all
		for _, m := range all {
			if m.NodeID == n.cfg.NodeID {
				a.in, a.self = true, m
			}
		}
		return a, nil
	}
	key := n.k.Chunk(h.Round, h.Nonce, bucket(n.cfg.NodeID, h.Chunks))
	var g *clientv3.GetResponse
	// Chunks never change once written, so a serializable read that finds
	// one is as good as a linearizable one and skips the read-index round;
	// only a miss (a lagging member) needs the linearizable read.
	err := n.read(ctx, "read member chunk", func(ctx context.Context) (err error) {
		if g, err = n.cli.Get(ctx, key, clientv3.WithSerializable()); err == nil && len(g.Kvs) > 0 {
			return nil
		}
		g, err = n.cli.Get(ctx, key)
		return err
	})
	if err != nil {
		return a, fmt.Errorf("rendezvous: job %q: read %s: %w", n.cfg.JobID, key, err)
	}
	if len(g.Kvs) == 0 {
		return a, errGone
	}
	ms, err := decodeChunk(key, g.Kvs[0].Value, n.cfg.NodeID, h.Nodes)
	if err != nil {
		return a, err
	}
	if len(ms) == 1 {
		a.in, a.self = true, ms[0]
	}
	return a, nil
}

// readAll reads and checks a round's whole member list.
func (n *Node) readAll(ctx context.Context, h *header) ([]Member, error) {
	pfx := n.k.ChunkPrefix(h.Round, h.Nonce)
	g, err := n.cli.Get(ctx, pfx, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("rendezvous: job %q: read %s: %w", n.cfg.JobID, pfx, err)
	}
	if len(g.Kvs) == 0 {
		return nil, errGone
	}
	return decodeAll(pfx, g.Kvs, h)
}

// decodeAll parses every chunk of a round and checks the list is complete.
func decodeAll(pfx string, kvs []*mvccpb.KeyValue, h *header) ([]Member, error) {
	if len(kvs) != h.Chunks {
		return nil, fmt.Errorf("rendezvous: malformed round record at %s*: %d chunks, the header says %d", pfx, len(kvs), h.Chunks)
	}
	all := make([]Member, 0, h.Nodes)
	for _, kv := range kvs {
		ms, err := decodeChunk(string(kv.Key), kv.Value, "", h.Nodes)
		if err != nil {
			return nil, err
		}
		all = append(all, ms...)
	}
	slices.SortFunc(all, func(a, b Member) int { return a.GroupRank - b.GroupRank })
	world := 0
	for i, m := range all {
		if m.GroupRank != i || m.BaseRank != world {
			return nil, fmt.Errorf("rendezvous: malformed round record at %s*: ranks or base ranks are not contiguous at node %s", pfx, m.NodeID)
		}
		world += m.LocalWorldSize
	}
	if len(all) != h.Nodes || world != h.World {
		return nil, fmt.Errorf("rendezvous: malformed round record at %s*: %d nodes / world %d, header says %d / %d", pfx, len(all), world, h.Nodes, h.World)
	}
	return all, nil
}

// acknowledge tells the closer this node's agent is alive and takes part
// in proposal h; rank 0 also publishes the MASTER_PORT it picked.
func (n *Node) acknowledge(ctx context.Context, h *header, a assignment) {
	ack := ackRec{Round: h.Round, Nonce: h.Nonce}
	if a.self.GroupRank == 0 {
		n.mu.Lock()
		avoid, port := n.lastPort, a.port
		n.mu.Unlock()
		if port == 0 {
			var err error
			if port, err = freePort(avoid); err != nil {
				n.log.Error("rendezvous: cannot pick a MASTER_PORT; not acknowledging round", "round", h.Round, "err", err)
				return
			}
			n.mu.Lock()
			if n.assigned.round == h.Round && n.assigned.nonce == h.Nonce {
				n.assigned.port = port
			}
			n.mu.Unlock()
		}
		ack.Port = port
	}
	v, _ := json.Marshal(ack)
	n.mu.Lock()
	lease, delay := n.lease, n.ackDelay
	n.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	err := n.do(ctx, "acknowledge round", func(ctx context.Context) error {
		_, err := n.cli.Put(ctx, n.k.Ack(n.cfg.NodeID), string(v), clientv3.WithLease(lease))
		return err
	})
	if err != nil && ctx.Err() == nil {
		n.log.Error("rendezvous: cannot acknowledge round; the closer will leave this node out", "round", h.Round, "err", err)
	}
}

// freePort picks a free TCP port on all interfaces (where torch's TCPStore
// listens), different from avoid (the previous round's port, which the old
// store may still hold).
func freePort(avoid int) (int, error) {
	for range 8 {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			return 0, fmt.Errorf("pick a free port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p != avoid {
			return p, nil
		}
	}
	return 0, fmt.Errorf("pick a free port: kernel kept returning %d", avoid)
}

// backoff is a small capped exponential backoff for retries against etcd.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: 50 * time.Millisecond} }

func (b *backoff) reset() { b.d = 50 * time.Millisecond }

func (b *backoff) wait(ctx context.Context) {
	t := time.NewTimer(b.d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	b.d = min(b.d*2, time.Second)
}

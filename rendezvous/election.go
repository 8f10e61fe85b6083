package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Closer election. Like concurrency.Election, the oldest live node (lowest
// member create revision) leads and every other node watches only its
// predecessor, so losing the closer costs O(1) reads per node. Unlike it,
// the order lives in the key name (queueKey: the member key's revision,
// inverted), so finding the predecessor is a small ascending range with
// limit 1 that etcd answers from its index; concurrency.Election's sort by
// create revision makes etcd read the whole prefix for every node, O(N^2)
// at scale.
//
// A node's entry, rdzv/q/<inverted revision>/<inverted time>/<node id>, is
// named by the revision and the local time of its lease grant
// (queueEntry), which the node knows before it registers, so the member
// key and the queue entry go in one transaction, together with the first
// predecessor lookup and the read of the round header: registering costs
// one write besides the lease grant. Lease grants do not move etcd's
// revision, so in a mass join hundreds of nodes share one; among them the
// grant time orders the entries (the node id breaks ties), which follows
// the order of their writes closely (each writes right after its grant),
// so that a node rarely enters the election as older than nodes already
// in it. The entry's position is known before it is written, so an older
// node's entry can still appear after a younger node found no predecessor
// and became the closer (clocks of different hosts differ; a node whose
// registration was retried). The closer therefore also watches the
// part of the queue older than itself and steps down when an entry shows
// up there; the older node, finding no predecessor, takes over. The closer's
// writes are guarded, so the brief overlap cannot corrupt a round.

// predResult is the outcome of a predecessor lookup: the key found (empty
// when none), the revision the lookup read it at (when none: the revision of
// its first read), and whether the lookup covered the whole older part of
// the queue.
type predResult struct {
	key  string
	rev  int64
	done bool
}

const firstWindow = 64

// campaign waits to become the closer, then runs it, until ctx ends. first
// is the lookup made together with the queue write.
func (n *Node) campaign(ctx context.Context, first predResult) {
	b := newBackoff()
	n.mu.Lock()
	mine, myRev := n.queueKey, n.queueRev
	n.mu.Unlock()
	p := first
	for ctx.Err() == nil {
		if !p.done {
			var err error
			if p, err = n.predecessor(ctx, mine, myRev, p); err != nil {
				if ctx.Err() == nil {
					n.log.Warn("rendezvous: look up predecessor", "err", err)
					b.wait(ctx)
				}
				p = predResult{}
				continue
			}
		}
		if p.key == "" {
			n.log.Debug("rendezvous: this node is the closer")
			err := n.runCloser(ctx, p.rev)
			if ctx.Err() != nil {
				return
			}
			if !errors.Is(err, errSteppedDown) {
				n.log.Warn("rendezvous: closer stopped; retrying", "err", err)
				b.wait(ctx)
			}
			p = predResult{}
			continue
		}
		if err := waitDelete(ctx, n.cli, p.key, p.rev+1); err != nil && ctx.Err() == nil {
			n.log.Warn("rendezvous: watch predecessor", "key", p.key, "err", err)
			b.wait(ctx)
		} else {
			b.reset()
		}
		p = predResult{}
	}
}

// queueEntry is this node's election queue key when named by revision rev
// and time at: newer times sort first, as newer revisions do.
func (n *Node) queueEntry(rev int64, at time.Time) string {
	return fmt.Sprintf("%s/%016x/%s", n.k.QueueKey(rev), uint64(math.MaxInt64-at.UnixNano()), n.cfg.NodeID)
}

// window returns the key range of queue entries with revisions in
// [hi-w+1, hi] (older revisions sort later), starting after the key after
// when it is set (this node's own entry: the range holds the entries of
// its revision that sort after it), and whether it reaches the oldest
// possible entry. An entry is QueueKey(rev) or QueueKey(rev)+"/"+node:
// both sort before QueueKey(rev-1).
func (n *Node) window(after string, hi, w int64) (from, to string, last bool) {
	lo := max(hi-w+1, 1)
	from, to = n.k.QueueKey(hi), n.k.QueueKey(lo-1)
	if after != "" {
		from = after + "\x00"
	}
	if lo == 1 {
		to = clientv3.GetPrefixRangeEnd(n.k.Queue)
	}
	return from, to, lo == 1
}

// writeMember registers this node in one transaction: its member key and
// its election queue entry qk (named by qrev, its lease grant's revision)
// under lease, with a read of the round header (the head watcher starts
// from it) and the first predecessor lookup. It returns the member key's
// create revision and the queue entry written, with its revision. When the
// answer to a write that succeeded was lost, the predecessor is left to
// campaign to look up (pred.done false).
func (n *Node) writeMember(ctx context.Context, lease clientv3.LeaseID, ttl time.Duration, qrev int64, qk string) (rev, qrevOut int64, qkOut string, head *mvccpb.KeyValue, pred predResult, err error) {
	rec, _ := json.Marshal(memberRec{Addr: n.cfg.Addr, LWS: n.cfg.LocalWorldSize})
	mk := n.k.Member(n.cfg.NodeID)
	// A node id still held by a lease is either a second agent with the same
	// id or this agent's previous incarnation, fenced but not yet expired on
	// the server; waiting out its lease tells them apart. The wait counts
	// from the first conflict seen, not from the start: an etcd restarted
	// after an outage gives every old lease a fresh TTL, plus its leader's
	// election time, plus up to a lessor tick, from when it came back, which
	// may be after this registration began (it waited out the outage). One
	// TTL from the start lost a job that way after a 65 s outage.
	var busyUntil time.Time
	err = n.retry(ctx, "write member key", false, func(ctx context.Context) error {
		from, to, last := n.window(qk, qrev, firstWindow)
		tr, err := n.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(mk), "=", 0)).
			Then(clientv3.OpPut(mk, string(rec), clientv3.WithLease(lease)), clientv3.OpGet(n.k.Head),
				clientv3.OpPut(qk, n.cfg.NodeID, clientv3.WithLease(lease)),
				clientv3.OpGet(from, clientv3.WithRange(to), clientv3.WithLimit(1), clientv3.WithKeysOnly())).
			Else(clientv3.OpGet(mk), clientv3.OpGet(n.k.Head)).
			Commit()
		if err != nil {
			return err
		}
		if hk := tr.Responses[1].GetResponseRange().Kvs; len(hk) > 0 {
			head = hk[0]
		}
		if tr.Succeeded {
			rev = tr.Header.Revision
			pred = predResult{rev: rev, done: last}
			if kvs := tr.Responses[3].GetResponseRange().Kvs; len(kvs) > 0 {
				pred.key, pred.done = string(kvs[0].Key), true
			}
			return nil
		}
		// Ours already, when an earlier attempt's answer was lost: that
		// attempt wrote the queue entry qk too (qk changes only after an
		// attempt that wrote nothing).
		if kvs := tr.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 && clientv3.LeaseID(kvs[0].Lease) == lease {
			rev, pred = kvs[0].CreateRevision, predResult{}
			return nil
		}
		// Not written: the next attempt's entry takes a fresh position,
		// so a node that waited out a busy id does not enter the election
		// as older than the nodes that registered meanwhile.
		qrev = tr.Header.Revision
		qk = n.queueEntry(qrev, time.Now())
		err = fmt.Errorf("node id %q is already registered at %s (two agents with the same node id?)", n.cfg.NodeID, mk)
		if busyUntil.IsZero() {
			busyUntil = time.Now().Add(2*ttl + time.Second)
		}
		if time.Now().Before(busyUntil) {
			return fmt.Errorf("%w: %w", errRetry, err)
		}
		return err
	})
	return rev, qrev, qk, head, pred, err
}

// predecessor finds the queue entry of the youngest node older than this
// one (mine, named by revision myRev; none: this node is the closer),
// continuing after the windows that prev already searched (prev.rev == 0:
// from scratch). etcd counts every key
// of a range to fill in the response's count, even with a limit, so the
// lookup scans windows of growing size back from this node's revision
// instead of the whole older part of the queue: during a mass join the
// predecessor is a few revisions away.
func (n *Node) predecessor(ctx context.Context, mine string, myRev int64, prev predResult) (predResult, error) {
	// When nothing is found, the result carries the revision of the first
	// window read: an entry written into an already searched window after
	// that read is caught by the closer's watch on the older part of the
	// queue, which starts there.
	first := prev.rev
	after, hi, w := mine, myRev, int64(firstWindow)
	if prev.rev != 0 {
		after, hi, w = "", myRev-firstWindow, 4*firstWindow
	}
	for ; ; w *= 4 {
		if hi < 1 {
			return predResult{rev: first, done: true}, nil
		}
		from, to, last := n.window(after, hi, w)
		after = ""
		rctx, cancel := context.WithTimeout(ctx, n.opTimeout())
		g, err := n.cli.Get(rctx, from, clientv3.WithRange(to), clientv3.WithLimit(1), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			return predResult{}, err
		}
		if first == 0 {
			first = g.Header.Revision
		}
		if len(g.Kvs) > 0 {
			return predResult{key: string(g.Kvs[0].Key), rev: g.Header.Revision, done: true}, nil
		}
		if last {
			return predResult{rev: first, done: true}, nil
		}
		hi -= w
	}
}

// waitDelete returns once key is deleted at or after rev.
func waitDelete(ctx context.Context, cli *clientv3.Client, key string, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range cli.Watch(wctx, key, clientv3.WithRev(rev)) {
		if err := wr.Err(); err != nil {
			return err
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("watch closed")
}

package rendezvous

import (
	"context"
	"errors"

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
// A queue entry is written after the member key that fixes its position,
// so an older node's entry can appear after a younger node found no
// predecessor and became the closer. The closer therefore also watches the
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
	myRev := n.memberRev
	n.mu.Unlock()
	p := first
	for ctx.Err() == nil {
		if !p.done {
			var err error
			if p, err = n.predecessor(ctx, myRev, p); err != nil {
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

// window returns the key range of queue entries with revisions in
// [hi-w+1, hi] (older revisions sort later) and whether it reaches the
// oldest possible entry.
func (n *Node) window(hi, w int64) (from, to string, last bool) {
	lo := max(hi-w+1, 1)
	from, to = n.k.QueueKey(hi), n.k.QueueKey(lo)+"\x00"
	if lo == 1 {
		to = clientv3.GetPrefixRangeEnd(n.k.Queue)
	}
	return from, to, lo == 1
}

// predecessor finds the queue entry of the youngest node older than this
// one (none: this node is the closer), continuing after the windows that
// prev already searched (prev.rev == 0: from scratch). etcd counts every key
// of a range to fill in the response's count, even with a limit, so the
// lookup scans windows of growing size back from this node's revision
// instead of the whole older part of the queue: during a mass join the
// predecessor is a few revisions away.
func (n *Node) predecessor(ctx context.Context, myRev int64, prev predResult) (predResult, error) {
	// When nothing is found, the result carries the revision of the first
	// window read: an entry written into an already searched window after
	// that read is caught by the closer's watch on the older part of the
	// queue, which starts there.
	first := prev.rev
	hi, w := myRev-1, int64(firstWindow)
	if prev.rev != 0 {
		hi, w = myRev-1-firstWindow, 4*firstWindow
	}
	for ; ; w *= 4 {
		if hi < 1 {
			return predResult{rev: first, done: true}, nil
		}
		from, to, last := n.window(hi, w)
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

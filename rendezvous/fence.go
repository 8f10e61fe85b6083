package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// The ready barrier and the running markers are the job's cross-node
// fencing protocol between rounds (docs/internals.md, the key table): no
// node starts a round's workers before every member of the round has
// stopped its previous ones (the barrier: the resume checkpoint is final
// then), nor while a node outside the round still runs workers of an older
// round (the markers: a drained node or a spare finishes its checkpoint
// first). They are small types in the style of etcd's client/v3/concurrency:
// each owns its keys (and the marker its lease), and every etcd request is
// bounded by a deadline of its own besides the caller's ctx.

// defaultFenceOpTimeout bounds each etcd request of a Barrier or a
// RunningMarker made with a zero timeout.
const defaultFenceOpTimeout = 5 * time.Second

// writeWithin runs the write op (idempotent) until it succeeds, fails for
// good, or timeout passes, retrying transient errors with jittered
// backoff: every member of a round arrives and marks itself at once, and
// an etcd with thousands of proposals not yet applied answers "too many
// requests" to some of them (at 20,000 nodes in bench/rdzvscale), which
// is no reason to fail a node's round.
func writeWithin(ctx context.Context, timeout time.Duration, op func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	b := newBackoff()
	for {
		err := op(ctx)
		if err == nil || ctx.Err() != nil || !transient(err) {
			return err
		}
		b.waitJitter(ctx)
		if ctx.Err() != nil {
			return err
		}
	}
}

// Barrier is one round's ready barrier (fleet.Keys.Ready): each member
// arrives once its previous workers are gone, and waits until all of the
// round's members have.
//
// The barrier costs O(members) watch events, not O(members^2): the first
// member to arrive becomes the round's counter (rdzv/b/<round>/counter,
// claimed in the same transaction as its arrival); it alone watches the
// round's ready keys, and once every member has arrived and no node outside
// the round holds a running marker of an older round (RunningMarker), it
// writes one pass key (rdzv/b/<round>/pass) that every other member
// watches. The pass is written in a transaction guarded on the running
// markers' revisions, so a marker of an older round written after the
// counter read them holds the pass back until it is read and waited out.
// A counter that dies before the pass leaves the round to be superseded
// through the rendezvous (it is a member: its lease goes), as any member
// that dies before the barrier does.
type Barrier struct {
	cli     *clientv3.Client
	keys    fleet.Keys
	job     string
	round   int64
	size    int
	node    string
	timeout time.Duration

	// arrivedRev is the revision of this Barrier's arrival (0: not yet);
	// counter says it claimed the round's counter; passed that the round
	// had passed at arrivedRev.
	arrivedRev int64
	counter    bool
	passed     bool
}

// NewBarrier is node's view of round's ready barrier in job, which size
// members must reach. timeout bounds each etcd request (0: 5s).
func NewBarrier(cli *clientv3.Client, prefix, job string, round int64, size int, node string, timeout time.Duration) *Barrier {
	if timeout <= 0 {
		timeout = defaultFenceOpTimeout
	}
	return &Barrier{cli: cli, keys: fleet.NewKeys(fleet.NormalizePrefix(prefix)), job: job, round: round, size: size, node: node, timeout: timeout}
}

// barrierBase is the prefix of the counter and pass keys of job's rounds
// (<job>/rdzv/b/): they sort by round, so every older round's lies before
// barrierRound(round).
func barrierBase(k fleet.Keys, job string) string { return k.Rdzv(job).Base + "b/" }

func barrierRound(k fleet.Keys, job string, round int64) string {
	return barrierBase(k, job) + fleet.Hex16(round) + "/"
}

// passKey is written once, by the round's counter, when every member has
// arrived and no older workers run outside the round.
func passKey(k fleet.Keys, job string, round int64) string {
	return barrierRound(k, job, round) + "pass"
}

// counterKey names the round's counter: the first member to arrive.
func counterKey(k fleet.Keys, job string, round int64) string {
	return barrierRound(k, job, round) + "counter"
}

// Arrive marks this node ready for the round: its previous workers are
// gone. The key is not under a lease: a member that dies after arriving
// supersedes the round through the rendezvous instead. The first member
// to arrive claims the round's counter in the same transaction.
func (b *Barrier) Arrive(ctx context.Context) error {
	ck := counterKey(b.keys, b.job, b.round)
	ready := clientv3.OpPut(b.keys.Ready(b.job, b.round, b.node), "1")
	passed := clientv3.OpGet(passKey(b.keys, b.job, b.round), clientv3.WithCountOnly())
	// Again after a lost answer: the counter is then ours already (Else).
	var resp *clientv3.TxnResponse
	err := writeWithin(ctx, b.timeout, func(ctx context.Context) (err error) {
		resp, err = b.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(ck), "=", 0)).
			Then(ready, clientv3.OpPut(ck, b.node), passed).
			Else(ready, clientv3.OpGet(ck), passed).Commit()
		return err
	})
	if err != nil {
		return fmt.Errorf("mark ready for round %d: %w", b.round, err)
	}
	b.arrivedRev = resp.Header.Revision
	b.passed = resp.Responses[2].GetResponseRange().Count > 0
	b.counter = resp.Succeeded
	if !resp.Succeeded {
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 && string(kvs[0].Value) == b.node {
			b.counter = true // arrived before, in an earlier Barrier
		}
	}
	return nil
}

// passedRounds remembers, per job (by its barrier prefix), the latest round
// whose pass this process has seen: RunningMarker.WaitOlderGone for that
// round needs no read then.
var passedRounds sync.Map // string -> int64

func (b *Barrier) sawPass() {
	passedRounds.Store(barrierBase(b.keys, b.job), b.round)
}

// PruneOlder deletes the barriers of the rounds before the previous one:
// they are garbage once this round formed (rank 0 of the round does it).
// The previous round's is kept for a member still reading it.
func (b *Barrier) PruneOlder(ctx context.Context) error {
	if b.round <= 2 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	bb := barrierBase(b.keys, b.job)
	if _, err := b.cli.Txn(ctx).Then(
		clientv3.OpDelete(b.keys.ReadyPrefix(b.job), clientv3.WithRange(b.keys.ReadyRound(b.job, b.round-1))),
		clientv3.OpDelete(bb, clientv3.WithRange(barrierRound(b.keys, b.job, b.round-1))),
	).Commit(); err != nil {
		return fmt.Errorf("delete the ready barriers before round %d: %w", b.round-1, err)
	}
	return nil
}

// Arrived counts the members that have arrived, at the revision read.
func (b *Barrier) Arrived(ctx context.Context) (n int, rev int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	resp, err := b.cli.Get(ctx, b.keys.ReadyRound(b.job, b.round), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, 0, fmt.Errorf("round %d barrier: %w", b.round, err)
	}
	return int(resp.Count), resp.Header.Revision, nil
}

// Wait returns once every member of the round has arrived and no node
// outside the round still holds a running marker of an older round, or
// ctx's error. Only the initial read is bounded by the request timeout:
// the wait itself lasts as long as ctx (the caller cancels it when the
// round is superseded).
func (b *Barrier) Wait(ctx context.Context) error {
	pk := passKey(b.keys, b.job, b.round)
	rev := b.arrivedRev
	if b.passed {
		b.sawPass()
		return nil
	}
	// After this Barrier's arrival, the pass key is watched from there:
	// the arrival's transaction read it (and the counter key) already.
	if !b.counter && rev == 0 {
		rctx, cancel := context.WithTimeout(ctx, b.timeout)
		resp, err := b.cli.Txn(rctx).Then(clientv3.OpGet(pk, clientv3.WithCountOnly()), clientv3.OpGet(counterKey(b.keys, b.job, b.round))).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("round %d barrier: %w", b.round, err)
		}
		if resp.Responses[0].GetResponseRange().Count > 0 {
			b.sawPass()
			return nil
		}
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 && string(kvs[0].Value) == b.node {
			b.counter = true
		}
		rev = resp.Header.Revision
	}
	if b.counter {
		if err := b.count(ctx); err != nil {
			return err
		}
		b.sawPass()
		return nil
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := b.cli.Watch(wctx, pk, clientv3.WithRev(rev+1), clientv3.WithFilterDelete())
	for {
		w, ok := <-wch
		if err := ctx.Err(); err != nil {
			return err
		}
		if !ok || w.Err() != nil {
			return fmt.Errorf("round %d barrier: watch ended: %v", b.round, w.Err())
		}
		if len(w.Events) > 0 {
			b.sawPass()
			return nil
		}
	}
}

// count is the counter's Wait: it watches the round's ready keys until
// every member arrived, waits out older workers outside the round, and
// writes the pass.
func (b *Barrier) count(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, b.timeout)
	pre := b.keys.ReadyRound(b.job, b.round)
	resp, err := b.cli.Txn(rctx).Then(clientv3.OpGet(passKey(b.keys, b.job, b.round), clientv3.WithCountOnly()), clientv3.OpGet(pre, clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	cancel()
	if err != nil {
		return fmt.Errorf("round %d barrier: %w", b.round, err)
	}
	if resp.Responses[0].GetResponseRange().Count > 0 {
		return nil // passed already (an earlier Wait of this counter)
	}
	arrived := make(map[string]bool, b.size)
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		arrived[strings.TrimPrefix(string(kv.Key), pre)] = true
	}
	if len(arrived) < b.size {
		if err := b.watchArrivals(ctx, pre, resp.Header.Revision, arrived); err != nil {
			return err
		}
	}
	return b.pass(ctx, arrived)
}

// watchArrivals adds the members arriving after rev to arrived until all
// have.
func (b *Barrier) watchArrivals(ctx context.Context, pre string, rev int64, arrived map[string]bool) error {
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := b.cli.Watch(wctx, pre, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterDelete())
	for len(arrived) < b.size {
		w, ok := <-wch
		if err := ctx.Err(); err != nil {
			return err
		}
		if !ok || w.Err() != nil {
			return fmt.Errorf("round %d barrier: watch ended: %v", b.round, w.Err())
		}
		for _, ev := range w.Events {
			arrived[strings.TrimPrefix(string(ev.Kv.Key), pre)] = true
		}
	}
	return nil
}

// pass writes the round's pass key once no node outside the round (the
// members arrived: their workers are gone) holds a running marker of an
// older round. The write is guarded on the markers' revisions: a marker
// written after they were read sends the counter back to read them.
func (b *Barrier) pass(ctx context.Context, arrived map[string]bool) error {
	m := RunningMarker{cli: b.cli, keys: b.keys, job: b.job, node: b.node, timeout: b.timeout}
	rp := b.keys.RunningPrefix(b.job)
	for {
		older, rev, err := m.older(ctx, b.round, arrived)
		if err != nil {
			return err
		}
		if len(older) > 0 {
			if err := m.nextChange(ctx, rev); err != nil {
				return fmt.Errorf("round %d barrier: %w", b.round, err)
			}
			continue
		}
		var resp *clientv3.TxnResponse
		err = writeWithin(ctx, b.timeout, func(ctx context.Context) (err error) {
			resp, err = b.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(rp), "<", rev+1).WithRange(clientv3.GetPrefixRangeEnd(rp))).
				Then(clientv3.OpPut(passKey(b.keys, b.job, b.round), b.node)).Commit()
			return err
		})
		if err != nil {
			return fmt.Errorf("round %d barrier: write the pass: %w", b.round, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
}

// RunningMarker is a node's running-workers marker (fleet.Keys.Running):
// the round whose workers may be alive on the node, kept under the node's
// rendezvous lease, so a dead node's marker goes with its lease.
type RunningMarker struct {
	cli     *clientv3.Client
	keys    fleet.Keys
	job     string
	node    string
	lease   clientv3.LeaseID
	timeout time.Duration
}

// NewRunningMarker is node's running marker in job, kept under lease.
// timeout bounds each etcd request (0: 5s).
func NewRunningMarker(cli *clientv3.Client, prefix, job, node string, lease clientv3.LeaseID, timeout time.Duration) *RunningMarker {
	if timeout <= 0 {
		timeout = defaultFenceOpTimeout
	}
	return &RunningMarker{cli: cli, keys: fleet.NewKeys(fleet.NormalizePrefix(prefix)), job: job, node: node, lease: lease, timeout: timeout}
}

// Mark records that this node's workers of round may be alive from now
// on. It wraps ErrLeaseLost when the lease is gone (or was never held).
func (m *RunningMarker) Mark(ctx context.Context, round int64) error {
	if m.lease == 0 {
		return fmt.Errorf("round %d: mark workers running: %w", round, ErrLeaseLost)
	}
	err := writeWithin(ctx, m.timeout, func(ctx context.Context) error {
		_, err := m.cli.Put(ctx, m.keys.Running(m.job, m.node), fleet.Hex16(round), clientv3.WithLease(m.lease))
		return err
	})
	if errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("round %d: mark workers running: %w", round, ErrLeaseLost)
	}
	if err != nil {
		return fmt.Errorf("round %d: mark workers running: %w", round, err)
	}
	return nil
}

// Clear deletes the marker once this node's workers are gone.
func (m *RunningMarker) Clear(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	if _, err := m.cli.Delete(ctx, m.keys.Running(m.job, m.node)); err != nil {
		return fmt.Errorf("clear the running-workers marker: %w", err)
	}
	return nil
}

// Older lists the nodes other than this one whose workers of a round
// before round may still be alive (a marker that does not parse counts as
// older), with the revision read.
func (m *RunningMarker) Older(ctx context.Context, round int64) ([]string, int64, error) {
	return m.older(ctx, round, map[string]bool{m.node: true})
}

// older is Older leaving out the nodes in skip.
func (m *RunningMarker) older(ctx context.Context, round int64, skip map[string]bool) ([]string, int64, error) {
	p := m.keys.RunningPrefix(m.job)
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	resp, err := m.cli.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("round %d: read running workers: %w", round, err)
	}
	var older []string
	for _, kv := range resp.Kvs {
		node, ok := strings.CutPrefix(string(kv.Key), p)
		if !ok || skip[node] || strings.Contains(node, "/") {
			continue // ours are gone: the caller is past its workers
		}
		if r, ok := fleet.ParseRound(string(kv.Value)); !ok || r < round {
			older = append(older, node)
		}
	}
	return older, resp.Header.Revision, nil
}

// WaitOlderGone returns once no node other than this one holds a marker
// of a round before round, or ctx's error. waiting, when set, is told the
// nodes each time some are still running older workers. Once round's
// ready barrier has passed (Barrier.Wait), its counter has waited them out
// for every member: one read of the pass key answers.
func (m *RunningMarker) WaitOlderGone(ctx context.Context, round int64, waiting func(nodes []string)) error {
	if r, ok := passedRounds.Load(barrierBase(m.keys, m.job)); ok && r.(int64) == round {
		return nil // this process saw the pass
	}
	rctx, cancel := context.WithTimeout(ctx, m.timeout)
	resp, err := m.cli.Get(rctx, passKey(m.keys, m.job, round), clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return fmt.Errorf("round %d: read the ready barrier's pass: %w", round, err)
	}
	if resp.Count > 0 {
		return nil
	}
	for {
		older, rev, err := m.Older(ctx, round)
		if err != nil {
			return err
		}
		if len(older) == 0 {
			return nil
		}
		if waiting != nil {
			waiting(older)
		}
		if err := m.nextChange(ctx, rev); err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
	}
}

// nextChange waits for the first change to the job's markers after rev.
func (m *RunningMarker) nextChange(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, ok := <-m.cli.Watch(wctx, m.keys.RunningPrefix(m.job), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	if err := ctx.Err(); err != nil {
		return err
	}
	if !ok || w.Err() != nil {
		return fmt.Errorf("watch running workers ended: %v", w.Err())
	}
	return nil
}

// RunningNodes counts the job's nodes whose workers may run now.
func RunningNodes(ctx context.Context, cli *clientv3.Client, prefix, job string, timeout time.Duration) (int, error) {
	if timeout <= 0 {
		timeout = defaultFenceOpTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := cli.Get(ctx, fleet.NewKeys(fleet.NormalizePrefix(prefix)).RunningPrefix(job), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("count the job's running workers: %w", err)
	}
	return int(resp.Count), nil
}

package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// Barrier is one round's ready barrier (fleet.Keys.Ready): each member
// arrives once its previous workers are gone, and waits until all of the
// round's members have.
type Barrier struct {
	cli     *clientv3.Client
	keys    fleet.Keys
	job     string
	round   int64
	size    int
	node    string
	timeout time.Duration
}

// NewBarrier is node's view of round's ready barrier in job, which size
// members must reach. timeout bounds each etcd request (0: 5s).
func NewBarrier(cli *clientv3.Client, prefix, job string, round int64, size int, node string, timeout time.Duration) *Barrier {
	if timeout <= 0 {
		timeout = defaultFenceOpTimeout
	}
	return &Barrier{cli: cli, keys: fleet.NewKeys(fleet.NormalizePrefix(prefix)), job: job, round: round, size: size, node: node, timeout: timeout}
}

// Arrive marks this node ready for the round: its previous workers are
// gone. The key is not under a lease: a member that dies after arriving
// supersedes the round through the rendezvous instead.
func (b *Barrier) Arrive(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	if _, err := b.cli.Put(ctx, b.keys.Ready(b.job, b.round, b.node), "1"); err != nil {
		return fmt.Errorf("mark ready for round %d: %w", b.round, err)
	}
	return nil
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
	if _, err := b.cli.Delete(ctx, b.keys.ReadyPrefix(b.job), clientv3.WithRange(b.keys.ReadyRound(b.job, b.round-1))); err != nil {
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

// Wait returns once every member of the round has arrived, or ctx's error.
// Only the initial read is bounded by the request timeout: the wait itself
// lasts as long as ctx (the caller cancels it when the round is
// superseded).
func (b *Barrier) Wait(ctx context.Context) error {
	ready, rev, err := b.Arrived(ctx)
	if err != nil {
		return err
	}
	if ready >= b.size {
		return nil
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := b.cli.Watch(wctx, b.keys.ReadyRound(b.job, b.round), clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterDelete())
	for ready < b.size {
		w, ok := <-wch
		if err := ctx.Err(); err != nil {
			return err
		}
		if !ok || w.Err() != nil {
			return fmt.Errorf("round %d barrier: watch ended: %v", b.round, w.Err())
		}
		for _, ev := range w.Events {
			if ev.IsCreate() {
				ready++
			}
		}
	}
	return nil
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
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	_, err := m.cli.Put(ctx, m.keys.Running(m.job, m.node), fleet.Hex16(round), clientv3.WithLease(m.lease))
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
		if !ok || node == m.node || strings.Contains(node, "/") {
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
// nodes each time some are still running older workers.
func (m *RunningMarker) WaitOlderGone(ctx context.Context, round int64, waiting func(nodes []string)) error {
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

package rendezvous

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"
	"weak"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errRetry marks an error worth retrying for a while.
var errRetry = errors.New("retrying")

// transient reports whether an etcd error is worth retrying: the server is
// overloaded ("too many requests"), has no leader or changed it, timed out,
// or is unreachable for the moment.
func transient(err error) bool {
	if errors.Is(err, errRetry) {
		return true
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable || ee.Code() == codes.ResourceExhausted
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded:
		return true
	}
	// An etcd without quorum lets the request's deadline pass on its side
	// and answers "context deadline exceeded" as an unknown error.
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		if s := se.GRPCStatus(); s.Code() == codes.Unknown && s.Message() == context.DeadlineExceeded.Error() {
			return true
		}
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// do runs op with a per-attempt timeout, retrying transient errors with
// jittered backoff until ctx ends; it holds one of the client's write slots
// while op runs. what names the operation in the warning logged while
// retrying.
func (n *Node) do(ctx context.Context, what string, op func(context.Context) error) error {
	return n.retry(ctx, what, true, op)
}

// read is do for reads: no write slot.
func (n *Node) read(ctx context.Context, what string, op func(context.Context) error) error {
	return n.retry(ctx, what, false, op)
}

func (n *Node) retry(ctx context.Context, what string, write bool, op func(context.Context) error) error {
	b := newBackoff()
	var warned time.Time
	for {
		release := func() {}
		if write {
			r, err := acquireSlot(ctx, n.cli)
			if err != nil {
				return err
			}
			release = r
		}
		actx, cancel := context.WithTimeout(ctx, n.opTimeout())
		err := op(actx)
		cancel()
		release()
		if err == nil || ctx.Err() != nil || !transient(err) {
			if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
				err = errors.Join(ctx.Err(), err)
			}
			return err
		}
		if time.Since(warned) > 5*time.Second {
			warned = time.Now()
			n.log.Warn("rendezvous: etcd request failed; retrying", "op", what, "endpoints", n.cli.Endpoints(), "err", err)
		}
		b.waitJitter(ctx)
	}
}

// Per-client flow control: many nodes may share one client (an in-process
// simulation of a large job, or tests); bounding the writes each client has
// in flight keeps etcd's apply queue short, so it neither rejects proposals
// ("too many requests") nor delays lease renewals behind a write backlog.
// A process with one node never reaches the bound.
const clientWriteSlots = 16

var (
	slotsMu sync.Mutex
	slots   = map[weak.Pointer[clientv3.Client]]chan struct{}{}
)

func acquireSlot(ctx context.Context, cli *clientv3.Client) (func(), error) {
	wp := weak.Make(cli)
	slotsMu.Lock()
	ch, ok := slots[wp]
	if !ok {
		ch = make(chan struct{}, clientWriteSlots)
		slots[wp] = ch
		forgetOnGC(cli, wp)
	}
	slotsMu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (b *backoff) waitJitter(ctx context.Context) {
	d := b.d/2 + rand.N(b.d)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	b.d = min(b.d*2, time.Second)
}

// forgetOnGC forgets a client's slots once it is garbage collected.
func forgetOnGC(cli *clientv3.Client, wp weak.Pointer[clientv3.Client]) {
	runtime.AddCleanup(cli, func(wp weak.Pointer[clientv3.Client]) {
		slotsMu.Lock()
		delete(slots, wp)
		slotsMu.Unlock()
	}, wp)
}

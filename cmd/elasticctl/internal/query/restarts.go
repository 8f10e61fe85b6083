package query

import (
	"context"
	"errors"
	"fmt"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// restartsReaders bounds the transactions WorkerRestartsOf runs at once.
const restartsReaders = 4

// WorkerRestartsOf reads the restarts hyperpodrun made after worker
// failures (fleet.WorkerRestarts: the count, the last failure report and
// the latest checkpoint's time) of the named jobs, at revision rev (0: the
// newest). A job hyperpodrun never restarted is absent from the map. It
// reads every job's restart count, and the rest only for the jobs that
// have one (most have none: a third of the reads at 5,000 running jobs),
// in transactions of at most fleet.MaxTxnOps reads, a few at once. The
// keys are under jobs/, which a team's user may not read: the error then
// wraps rpctypes.ErrPermissionDenied.
func (s *Store) WorkerRestartsOf(ctx context.Context, names []string, rev int64) (map[string]*fleet.WorkerRestarts, error) {
	if rev == 0 && len(names) > 0 {
		// One revision for both passes.
		r, err := s.Cli.Get(ctx, s.Keys.Restarts(names[0]), clientv3.WithCountOnly())
		if err != nil {
			return nil, fmt.Errorf("read the jobs' restarts: %w", err)
		}
		rev = r.Header.Revision
	}
	at := clientv3.WithRev(rev)
	var restarted []string
	err := s.txnBatches(ctx, names, func(name string) []clientv3.Op { return []clientv3.Op{clientv3.OpGet(s.Keys.Restarts(name), at)} },
		func(name string, resps []*pb.ResponseOp) {
			if len(resps[0].GetResponseRange().Kvs) > 0 {
				restarted = append(restarted, name)
			}
		})
	if err != nil {
		return nil, err
	}
	out := make(map[string]*fleet.WorkerRestarts, len(restarted))
	err = s.txnBatches(ctx, restarted, func(name string) []clientv3.Op { return s.Keys.WorkerRestartsOps(name, at) },
		func(name string, resps []*pb.ResponseOp) {
			if w := s.Keys.DecodeWorkerRestarts(name, resps); w != nil {
				out[name] = w
			}
		})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// txnBatches reads ops(name) for every name, in transactions of at most
// fleet.MaxTxnOps reads (restartsReaders at once), and hands each name's
// answers to use, one call at a time. Every name has as many ops.
func (s *Store) txnBatches(ctx context.Context, names []string, ops func(name string) []clientv3.Op, use func(name string, resps []*pb.ResponseOp)) error {
	if len(names) == 0 {
		return nil
	}
	per := len(ops(names[0]))
	n := max(1, fleet.MaxTxnOps/per)
	var batches [][]string
	for len(names) > 0 {
		k := min(len(names), n)
		batches = append(batches, names[:k])
		names = names[k:]
	}
	// The first failure (a team's user may read none of it) stops the
	// batches not sent yet.
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	errs := make([]error, len(batches))
	sem := make(chan struct{}, restartsReaders)
	var wg sync.WaitGroup
	for i, batch := range batches {
		sem <- struct{}{}
		if ctx.Err() != nil {
			<-sem
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var all []clientv3.Op
			for _, name := range batch {
				all = append(all, ops(name)...)
			}
			r, err := s.Cli.Txn(ctx).Then(all...).Commit()
			if err != nil {
				errs[i] = fmt.Errorf("read the jobs' restarts: %w", err)
				cancel()
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for j, name := range batch {
				use(name, r.Responses[j*per:(j+1)*per])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := parent.Err(); err != nil { // stopped before every batch was read
		return fmt.Errorf("read the jobs' restarts: %w", err)
	}
	return nil
}

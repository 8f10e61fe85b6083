package query

import (
	"context"
	"errors"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// restartsReaders bounds the transactions WorkerRestartsOf runs at once.
const restartsReaders = 4

// WorkerRestartsOf reads the restarts hyperpodrun made after worker
// failures (fleet.WorkerRestarts: the count, the last failure report and
// the latest checkpoint's time) of the named jobs, at revision rev (0: the
// newest), in transactions of at most fleet.MaxTxnOps reads, a few at
// once. A job hyperpodrun never restarted is absent from the map. The
// keys are under jobs/, which a team's user may not read: the error then
// wraps rpctypes.ErrPermissionDenied.
func (s *Store) WorkerRestartsOf(ctx context.Context, names []string, rev int64) (map[string]*fleet.WorkerRestarts, error) {
	per := len(s.Keys.WorkerRestartsOps(""))
	n := fleet.MaxTxnOps / per
	var batches [][]string
	for len(names) > 0 {
		k := min(len(names), n)
		batches = append(batches, names[:k])
		names = names[k:]
	}
	out := make(map[string]*fleet.WorkerRestarts)
	var mu sync.Mutex
	errs := make([]error, len(batches))
	sem := make(chan struct{}, restartsReaders)
	var wg sync.WaitGroup
	for i, batch := range batches {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var ops []clientv3.Op
			for _, name := range batch {
				ops = append(ops, s.Keys.WorkerRestartsOps(name, clientv3.WithRev(rev))...)
			}
			r, err := s.Cli.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				errs[i] = fmt.Errorf("read the jobs' restarts: %w", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for j, name := range batch {
				if w := s.Keys.DecodeWorkerRestarts(name, r.Responses[j*per:(j+1)*per]); w != nil {
					out[name] = w
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

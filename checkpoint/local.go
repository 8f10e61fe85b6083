package checkpoint

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
)

// LocalRecord keeps a single-node job's latest committed checkpoint in
// process, with the same rules as Store: for --standalone, which runs
// without etcd. It is safe for concurrent use.
type LocalRecord struct {
	mu  sync.Mutex
	rec *Record
}

// Commit records rec unless the kept one has a higher step (an error
// wrapping ErrStale). A zero Time is set to now.
func (l *LocalRecord) Commit(rec Record) error {
	if err := rec.validate(); err != nil {
		return fmt.Errorf("checkpoint: commit: %w", err)
	}
	if rec.Time.IsZero() {
		rec.Time = time.Now().UTC()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rec != nil && rec.Step < l.rec.Step {
		return fmt.Errorf("checkpoint: commit step %d: %w (step %d)", rec.Step, ErrStale, l.rec.Step)
	}
	l.rec = &rec
	return nil
}

// Latest returns a copy of the latest committed checkpoint, or nil.
func (l *LocalRecord) Latest() *Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rec == nil {
		return nil
	}
	r := *l.rec
	return &r
}

// ReportHandler commits every checkpoint report (at round 0), and every step
// whose checkpoint_update reports are complete, and accepts
// every other report, like Store.ReportHandler.
func (l *LocalRecord) ReportHandler() control.Handler {
	var pending parts
	return func(_ context.Context, r control.Report) error {
		switch r.Type {
		case control.ReportCheckpoint:
			return l.Commit(Record{Step: r.Step, Path: r.Path, WorldSize: r.WorldSize, Time: r.Received.UTC()})
		case control.ReportCheckpointUpdate:
			if rec, done := pending.add(r); done {
				return l.Commit(rec)
			}
		}
		return nil
	}
}

package elastic

// A failed checkpoint is an event, not a silent restart (issue 24): a rank
// that cannot save (a full or read-only checkpoint disk) reports it on the
// control channel (checkpoint_failed, from the Python helper's
// save_and_commit); when the round's workers then stop, for a planned
// change or by failing, the agent says which steps are lost and why, in
// its log and in the failure it reports for the job (whose detail ends up
// in the job's failure summary when its restart budget is spent).

import (
	"context"
	"fmt"
	"sync"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// ckptFailure is the first checkpoint_failed report of a round.
type ckptFailure struct {
	round, step int64
	rank        int
	err         string
}

// ckptFailures holds the last round's first checkpoint failure.
type ckptFailures struct {
	mu   sync.Mutex
	last *ckptFailure
}

// checkpointFailed records a worker's checkpoint_failed report (the first
// of its round) and logs it.
func (e *elastic) checkpointFailed(r control.Report) {
	f := &e.ckptFails
	f.mu.Lock()
	if f.last == nil || f.last.round != r.Round {
		f.last = &ckptFailure{round: r.Round, step: r.Step, rank: r.Rank, err: r.Error}
	}
	f.mu.Unlock()
	e.log.Error("a worker could not save its checkpoint; the step is not committed", "round", r.Round, "rank", r.Rank,
		"step", r.Step, "path", r.Path, "err", r.Error)
}

// failedCheckpoint is round r's checkpoint failure, if any.
func (e *elastic) failedCheckpoint(r *rendezvous.Round) *ckptFailure {
	f := &e.ckptFails
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil || f.last.round != r.Number {
		return nil
	}
	c := *f.last
	return &c
}

// lostSteps is what a round whose checkpoint of step failed loses: the
// steps after the last committed one (committed -1: none committed).
func lostSteps(failed, committed int64) string {
	if committed < 0 {
		return fmt.Sprintf("the job restarts from step 0: %d steps lost", failed)
	}
	if failed <= committed {
		return fmt.Sprintf("step %d is committed already: no step lost", committed)
	}
	return fmt.Sprintf("the job resumes from step %d, the last committed checkpoint: %d steps lost", committed, failed-committed)
}

// checkpointLoss says, after round r's workers stopped, whether their
// checkpoint failed and what that costs; "" when none failed.
func (e *elastic) checkpointLoss(ctx context.Context, r *rendezvous.Round) string {
	f := e.failedCheckpoint(r)
	if f == nil {
		return ""
	}
	committed := int64(-1)
	lctx, cancel := context.WithTimeout(detached(ctx), e.opTimeout())
	rec, err := e.store.Latest(lctx)
	cancel()
	if err == nil && rec != nil {
		committed = rec.Step
	}
	return fmt.Sprintf("rank %d could not save the checkpoint of step %d (%s); %s", f.rank, f.step, f.err, lostSteps(f.step, committed))
}

// sayPlannedLoss logs, after a planned change's workers stopped, that the
// change loses steps when their checkpoint failed.
func (e *elastic) sayPlannedLoss(ctx context.Context, r *rendezvous.Round) {
	if loss := e.checkpointLoss(ctx, r); loss != "" {
		e.log.Error("the planned change lost steps: its checkpoint failed", "round", r.Number, "detail", loss)
	}
}

// failureDetail is the detail of round r's worker failure: the failed
// checkpoint's when one was reported.
func (e *elastic) failureDetail(ctx context.Context, r *rendezvous.Round, detail string) string {
	if loss := e.checkpointLoss(ctx, r); loss != "" {
		return detail + ": " + loss
	}
	return detail
}

package elastic

// A failed checkpoint is an event, not a silent restart (issue 24): a rank
// that cannot save (a full or read-only checkpoint disk) reports it on the
// control channel (checkpoint_failed, from the Python helper's
// save_and_commit) and the agent answers what to do (adviseFailedSave,
// decided by plannedCheckpointFailed):
//
//   - during a planned change under --inprocess-resize, with survivors: go
//     on without the checkpoint; the survivors keep the state in memory and
//     reconfigure to the new world size, nothing is lost;
//   - during another planned change: save the same step again after a
//     pause, a bounded number of times (a transient error);
//   - otherwise (a periodic save, the retries spent, no time left before
//     --graceful-timeout): the save's error stands and the worker stops.
//
// When the round's workers then stop, for a planned change or by failing,
// the agent says which steps are lost and why: in its log, in the failure
// it reports for the job (whose detail ends up in the job's failure summary
// when its restart budget is spent) and, for a planned change, in the job's
// checkpoint failure record (fleet.CheckpointFailure), which elasticctl
// describe shows.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

const (
	// maxSaveRetries bounds the retries of a planned change's failed save.
	maxSaveRetries = 2
	// saveRetryPause is the pause before the first retry; the n-th waits
	// n times as long.
	saveRetryPause = time.Second
)

// ckptFailure is the last checkpoint_failed report of a round: the step,
// how many times its save failed, and the advice the agent gave last.
type ckptFailure struct {
	round, step int64
	rank        int
	err         string
	tries       int
	action      control.AdviceAction
}

// ckptFailures holds the last round's checkpoint failure.
type ckptFailures struct {
	mu   sync.Mutex
	last *ckptFailure
}

// checkpointFailed records a worker's checkpoint_failed report (a new step
// replaces the round's record; the same step counts one more try) and
// logs it.
func (e *elastic) checkpointFailed(r control.Report) {
	f := &e.ckptFails
	f.mu.Lock()
	if f.last == nil || f.last.round != r.Round || f.last.step != r.Step {
		f.last = &ckptFailure{round: r.Round, step: r.Step, rank: r.Rank, err: r.Error}
	}
	f.last.tries++
	tries := f.last.tries
	f.mu.Unlock()
	e.log.Error("a worker could not save its checkpoint; the step is not committed", "round", r.Round, "rank", r.Rank,
		"step", r.Step, "path", r.Path, "err", r.Error, "try", tries)
}

// ckptFailView is what the agent knows when a worker's save failed.
type ckptFailView struct {
	// Planned: the round's workers agreed on a change (they stop or
	// reconfigure after this save).
	Planned bool
	// InProcess: the change is made in process (--inprocess-resize): the
	// workers that stay keep their state in memory.
	InProcess bool
	// Survivors: workers stay after the change (new world size > 0, not a
	// preemption or shutdown of the whole job).
	Survivors bool
	// Tries is how many times this step's save failed, this one included.
	Tries int
	// TimeLeft is the time left before --graceful-timeout escalates (0:
	// unknown, the change was announced on another node).
	TimeLeft time.Duration
}

// plannedCheckpointFailed decides what a worker whose save failed does,
// and names the rule that decided.
func plannedCheckpointFailed(v ckptFailView) (control.Advice, string) {
	switch {
	case !v.Planned:
		return control.Advice{}, "not during a planned change: the save's error stands"
	case v.InProcess && v.Survivors:
		return control.Advice{Action: control.AdviceGoOn}, "in process: the survivors keep their state in memory and go on without the checkpoint"
	case v.Tries > maxSaveRetries:
		return control.Advice{}, fmt.Sprintf("the save failed %d times: the workers stop without it", v.Tries)
	}
	pause := time.Duration(v.Tries) * saveRetryPause
	if v.TimeLeft > 0 && v.TimeLeft < 2*pause {
		return control.Advice{}, "too little time left before --graceful-timeout to try again: the workers stop without it"
	}
	return control.Advice{Action: control.AdviceRetry, RetryAfter: pause}, "a planned change's failed save is tried again (a transient error)"
}

// adviseFailedSave answers a checkpoint_failed report (control.Advisor):
// it runs after the report was recorded (checkpointFailed).
func (e *elastic) adviseFailedSave(r control.Report) control.Advice {
	v := ckptFailView{Planned: e.stopping.Load() == r.Round, InProcess: e.o.InProcessResize, Survivors: true}
	if ev, err := control.ReadEvent(e.ch.EventPath()); err == nil && ev != nil && ev.Round == r.Round {
		// Announced here: its own words.
		// (A drained node's own workers leave; the survivors elsewhere
		// are in process all the same under --inprocess-resize.)
		v.Planned = v.Planned || ev.Kind != control.MemberLost
		v.Survivors = ev.NewWorldSize > 0 && ev.Kind != control.Preemption && ev.Kind != control.Shutdown
		if !ev.Deadline.IsZero() {
			v.TimeLeft = max(time.Until(ev.Deadline), time.Millisecond)
		}
	}
	f := &e.ckptFails
	f.mu.Lock()
	if f.last != nil && f.last.round == r.Round && f.last.step == r.Step {
		v.Tries = f.last.tries
	}
	a, rule := plannedCheckpointFailed(v)
	if f.last != nil && f.last.round == r.Round && f.last.step == r.Step {
		f.last.action = a.Action
	}
	f.mu.Unlock()
	e.log.Warn("told the worker what to do about its failed save", "round", r.Round, "rank", r.Rank, "step", r.Step,
		"advice", adviceName(a.Action), "retry_after", a.RetryAfter, "rule", rule)
	return a
}

// adviceName names an advice for the log.
func adviceName(a control.AdviceAction) string {
	if a == control.AdviceRaise {
		return "stop"
	}
	return string(a)
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

// ckptLoss is what a round's failed checkpoint cost.
type ckptLoss struct {
	f         ckptFailure
	committed int64 // the last committed step (-1: none)
	text      string
}

// checkpointLoss says, after round r's workers stopped, whether their
// checkpoint failed and what that costs; nil when none failed. kept says
// the workers that stay kept their state in process (told to go on).
func (e *elastic) checkpointLoss(ctx context.Context, r *rendezvous.Round, kept bool) *ckptLoss {
	f := e.failedCheckpoint(r)
	if f == nil {
		return nil
	}
	committed := int64(-1)
	lctx, cancel := context.WithTimeout(detached(ctx), e.opTimeout())
	rec, err := e.store.Latest(lctx)
	cancel()
	if err == nil && rec != nil {
		committed = rec.Step
	}
	what := lostSteps(f.step, committed)
	if kept && f.action == control.AdviceGoOn {
		what = fmt.Sprintf("the survivors went on in process with their state in memory: no step lost (the last committed checkpoint stays step %d)", committed)
	}
	text := fmt.Sprintf("rank %d could not save the checkpoint of step %d (%s); %s", f.rank, f.step, f.err, what)
	if f.tries > 1 {
		text += fmt.Sprintf("; the save was tried %d times", f.tries)
	}
	return &ckptLoss{f: *f, committed: committed, text: text}
}

// sayPlannedLoss says, after a planned change's workers stopped, what the
// change cost when their checkpoint failed (log and job record); the
// workers that stay elsewhere kept their state if they were told to.
func (e *elastic) sayPlannedLoss(ctx context.Context, r *rendezvous.Round) {
	e.sayPlannedOutcome(ctx, r, true)
}

// sayPlannedOutcome is sayPlannedLoss where this node's workers stay:
// kept says they went on in process (not restarted).
func (e *elastic) sayPlannedOutcome(ctx context.Context, r *rendezvous.Round, kept bool) {
	loss := e.checkpointLoss(ctx, r, kept)
	if loss == nil {
		return
	}
	lost := int64(0)
	switch {
	case loss.committed >= loss.f.step:
		e.log.Info("the planned change's checkpoint failed, then was committed on a retry: no step lost", "round", r.Number, "detail", loss.text)
		return
	case kept && loss.f.action == control.AdviceGoOn:
		e.log.Warn("the planned change's checkpoint failed; the survivors keep their state in process", "round", r.Number, "detail", loss.text)
	default:
		lost = loss.f.step - max(loss.committed, 0)
		e.log.Error("the planned change lost steps: its checkpoint failed", "round", r.Number, "detail", loss.text)
	}
	rec := fleet.CheckpointFailure{Round: r.Number, Node: e.node.ID(), Step: loss.f.step, Committed: loss.committed,
		LostSteps: lost, Detail: loss.text, Time: time.Now().UTC()}
	pctx, cancel := context.WithTimeout(detached(ctx), e.opTimeout())
	defer cancel()
	if err := fleet.New(e.cli, e.cfg.Prefix).PutCheckpointFailure(pctx, e.cfg.JobID, rec); err != nil {
		e.log.Warn("could not record the planned change's failed checkpoint in the job's status", "err", err)
	}
}

// failureDetail is the detail of round r's worker failure: the failed
// checkpoint's when one was reported.
func (e *elastic) failureDetail(ctx context.Context, r *rendezvous.Round, detail string) string {
	if loss := e.checkpointLoss(ctx, r, false); loss != nil {
		return detail + ": " + loss.text
	}
	return detail
}

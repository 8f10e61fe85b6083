package elastic

import (
	"context"
	"errors"

	"github.com/hyperpodrun/hyperpodrun/launcher"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// loop is the round loop's I/O: step (machine.go) decides, the methods
// below act, and what came of each act is the next event.
func (e *elastic) loop(ctx context.Context) error {
	var (
		// event is the scaling event being traced: its trace ends when the
		// next workers start; one still open when the agent leaves (a
		// spare, a signal) ends with it.
		event *scaleEvent
		g     *launcher.Group
	)
	defer func() {
		if event != nil {
			event.span.End()
		}
		e.endPending("hyperpodrun left the job")
	}()
	s := loopState{job: e.cfg.JobID, maxRestarts: e.o.MaxRestarts}
	ev := loopEvent{kind: evBegin}
	for {
		from := s.phase
		var act loopAction
		s, act = step(s, ev)
		e.log.Debug("round loop", "phase", from, "event", ev.kind, "next", s.phase, "action", act.kind)
		switch act.kind {
		case actRejoin:
			// The one lease-lost branch: whether the lease went while
			// joining, at the barrier, marking, or under running workers
			// (fenced by watch), a fresh node with a fresh lease rejoins.
			e.log.Warn("lease lost; rejoining with a new lease", "phase", from, "err", ev.err)
			e.killCarry()
			if err := e.newNode(); err != nil {
				return err
			}
			ev = e.joinRound(ctx, event)
		case actJoin:
			ev = e.joinRound(ctx, event)
		case actBarrier:
			ev = e.passBarrier(ctx, event)
		case actMark:
			ev = loopEvent{kind: evMarked}
			if err := e.markRunning(ctx, e.round); err != nil {
				ev = failure(err)
			}
		case actStart:
			g, ev = e.startRound(ctx, s.restarts, event)
			event = nil
		case actWatch:
			var end roundEnd
			end, ev = e.watchRound(ctx, g)
			e.endPending("the round ended before its workers reported")
			g, event = nil, end.next
		case actLeaveOnSignal:
			return e.leaveOnSignal(ctx, act.sig, act.when)
		case actExit:
			var spent budgetSpentError
			if errors.As(act.err, &spent) {
				e.failJob(ctx, act.err)
			}
			if act.leave {
				e.leave(ctx)
			}
			return exitError(act.err)
		}
	}
}

// failure is the event of an I/O step that failed with err: a lost lease
// and a signal are events of their own.
func failure(err error) loopEvent {
	var se signalError
	switch {
	case errors.As(err, &se):
		return loopEvent{kind: evSignal, sig: se.sig}
	case errors.Is(err, rendezvous.ErrLeaseLost):
		return loopEvent{kind: evLeaseLost, err: err}
	}
	return loopEvent{kind: evFailed, err: err}
}

// exitError is the agent's outcome for err: nil, an ExitError as it is,
// anything else exit code 1.
func exitError(err error) error {
	var ee *ExitError
	if err == nil || errors.As(err, &ee) {
		return err
	}
	return &ExitError{1, err}
}

// joinRound waits for the next round including this node and reads the
// job's restart count.
func (e *elastic) joinRound(ctx context.Context, event *scaleEvent) loopEvent {
	if err := e.wipeGuard(ctx, nil); err != nil {
		return loopEvent{kind: evFailed, err: err}
	}
	round, sig, err := e.join(ctx, event)
	var jf *rendezvous.JobFailedError
	switch {
	case sig != 0:
		return loopEvent{kind: evSignal, sig: sig}
	case errors.As(err, &jf):
		return loopEvent{kind: evFailed, err: e.jobFailedElsewhere(jf)}
	case err != nil:
		return failure(err)
	}
	if err := e.wipeGuard(ctx, round); err != nil {
		return loopEvent{kind: evFailed, err: err}
	}
	e.round = round
	e.roundNo.Store(round.Number)
	restarts, err := e.node.Restarts(ctx)
	if err != nil {
		return loopEvent{kind: evFailed, err: err}
	}
	return loopEvent{kind: evJoined, round: round.Number, restarts: restarts}
}

// passBarrier waits at the round's ready barrier: no node starts the
// round's workers until every member has stopped its previous ones (the
// resume checkpoint is final then).
func (e *elastic) passBarrier(ctx context.Context, event *scaleEvent) loopEvent {
	change, err := e.barrier(ctx, e.round, event)
	switch {
	case err != nil:
		return failure(err)
	case change != nil:
		e.log.Info("round superseded before it started", "round", e.round.Number, "reason", change.Reason, "detail", change.Detail)
		return loopEvent{kind: evSuperseded}
	}
	return loopEvent{kind: evBarrierPassed}
}

// startRound hands the round's assignment to the workers kept from the
// previous round (in process) or starts new ones.
func (e *elastic) startRound(ctx context.Context, restarts int, event *scaleEvent) (*launcher.Group, loopEvent) {
	var g *launcher.Group
	var err error
	if e.carry != nil {
		g, err = e.resume(ctx, e.round, restarts, event)
	}
	if g == nil && err == nil {
		g, err = e.start(ctx, e.round, restarts, event)
	}
	if err != nil {
		return nil, loopEvent{kind: evFailed, err: err}
	}
	return g, loopEvent{kind: evStarted}
}

// watchRound watches the round's workers (HEALTHY until watch says how
// they ended) and clears up after them.
func (e *elastic) watchRound(ctx context.Context, g *launcher.Group) (roundEnd, loopEvent) {
	end := e.watch(ctx, g, e.round)
	e.ch.SetRound(0) // the round's workers are gone: believe no one
	e.markStopped(ctx)
	e.closeStore()
	e.log.Debug("round ended", "round", e.round.Number, "workers", end.state, "lease_lost", end.leaseLost)
	if end.leaseLost {
		return end, loopEvent{kind: evLeaseLost}
	}
	return end, loopEvent{kind: evRoundEnded, workers: end.state, err: end.err}
}

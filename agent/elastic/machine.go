package elastic

import (
	"fmt"
	"syscall"

	"github.com/hyperpodrun/hyperpodrun/launcher"
)

// The elastic agent's round loop is one pure function, step(state, event):
// the loop (loop.go) carries out the action step returns (join a round,
// wait at the ready barrier, mark the workers running, start them, watch
// them, rejoin with a fresh lease, leave) and feeds what came of it back as
// the next event. step does no I/O and reads no clock, so every rule below
// is tested by a table (machine_test.go) without etcd and without workers.
//
// The rules, by phase:
//
//   - join: a round that includes this node goes to the barrier, unless the
//     job's restarts spent --max-restarts (counted for the whole job,
//     launcher.BudgetSpent): then the agent fails the job for every node
//     (budgetSpentError), leaves and fails.
//   - barrier: passed goes on to mark the workers running; a round
//     superseded before it started is joined again.
//   - mark: marked starts the workers. start: started watches them.
//   - run: the workers ended: a final state (succeeded, failed) ends the
//     agent with its outcome; any other joins the next round.
//   - any phase: a lost lease (fencing, or etcd that forgot it) rejoins with
//     a fresh lease (one branch for all of them); a signal while no workers
//     run leaves the job (SIGUSR2, a drain, exits 0); an error ends the
//     agent, leaving the job first once it is past joining.

// phase is where the round loop stands.
type phase int

const (
	// phaseJoin: waiting for a round that includes this node.
	phaseJoin phase = iota
	// phaseBarrier: at the round's ready barrier.
	phaseBarrier
	// phaseMark: marking this node's workers of the round running.
	phaseMark
	// phaseStart: starting (or resuming, in process) the round's workers.
	phaseStart
	// phaseRun: the round's workers run (workersHealthy).
	phaseRun
	// phaseDone: the agent is leaving; no event is expected.
	phaseDone
)

func (p phase) String() string {
	switch p {
	case phaseJoin:
		return "join"
	case phaseBarrier:
		return "barrier"
	case phaseMark:
		return "mark"
	case phaseStart:
		return "start"
	case phaseRun:
		return "run"
	case phaseDone:
		return "done"
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// loopState is what step decides on.
type loopState struct {
	phase phase
	// round is the round joined (0: none yet); restarts is the job's
	// restart count read when it was joined.
	round    int64
	restarts int
	// job and maxRestarts are the job's id and --max-restarts.
	job         string
	maxRestarts int
}

// eventKind is what happened.
type eventKind int

const (
	// evBegin: the loop begins.
	evBegin eventKind = iota
	// evJoined: a round including this node formed (round, restarts).
	evJoined
	// evBarrierPassed: every member is ready and no older workers run.
	evBarrierPassed
	// evSuperseded: the round changed before its workers started.
	evSuperseded
	// evMarked: the running marker is written.
	evMarked
	// evStarted: the round's workers run.
	evStarted
	// evRoundEnded: the workers ended (workers; err in a final state).
	evRoundEnded
	// evSignal: a signal arrived while no workers ran (sig).
	evSignal
	// evLeaseLost: this node can no longer prove its lease alive.
	evLeaseLost
	// evFailed: an I/O step failed (err).
	evFailed
)

func (k eventKind) String() string {
	switch k {
	case evBegin:
		return "begin"
	case evJoined:
		return "joined"
	case evBarrierPassed:
		return "barrier-passed"
	case evSuperseded:
		return "superseded"
	case evMarked:
		return "marked"
	case evStarted:
		return "started"
	case evRoundEnded:
		return "round-ended"
	case evSignal:
		return "signal"
	case evLeaseLost:
		return "lease-lost"
	case evFailed:
		return "failed"
	}
	return fmt.Sprintf("eventKind(%d)", int(k))
}

// loopEvent is one event fed to step.
type loopEvent struct {
	kind     eventKind
	round    int64
	restarts int
	workers  workerState
	sig      syscall.Signal
	err      error
}

// actKind is what the loop does next.
type actKind int

const (
	// actJoin: wait for the next round.
	actJoin actKind = iota
	// actRejoin: drop the workers kept for an in-process resize, replace
	// the rendezvous node (a fresh lease), then join.
	actRejoin
	// actBarrier: serve the round's store, arrive at its barrier and wait.
	actBarrier
	// actMark: mark this node's workers of the round running.
	actMark
	// actStart: start (or resume) the round's workers.
	actStart
	// actWatch: watch the workers until they end.
	actWatch
	// actLeaveOnSignal: leave the job for signal sig, received when.
	actLeaveOnSignal
	// actExit: end the agent with err (nil: exit 0), leaving the job
	// first when leave is set.
	actExit
)

func (k actKind) String() string {
	switch k {
	case actJoin:
		return "join"
	case actRejoin:
		return "rejoin"
	case actBarrier:
		return "barrier"
	case actMark:
		return "mark"
	case actStart:
		return "start"
	case actWatch:
		return "watch"
	case actLeaveOnSignal:
		return "leave-on-signal"
	case actExit:
		return "exit"
	}
	return fmt.Sprintf("actKind(%d)", int(k))
}

// loopAction is step's outcome.
type loopAction struct {
	kind  actKind
	sig   syscall.Signal
	when  string
	leave bool
	err   error
}

// budgetSpentError is the error of an agent that found the job's restarts
// spent: the loop then fails the job for every node
// (rendezvous.Node.FailJob) before it leaves, so no node waits for a round
// that will never form.
type budgetSpentError string

func (e budgetSpentError) Error() string { return string(e) }

// step is the round loop's rule book: what to do in state s after ev.
func step(s loopState, ev loopEvent) (loopState, loopAction) {
	if s.phase == phaseDone {
		return s, loopAction{kind: actExit, err: fmt.Errorf("internal: event %s after the agent was done", ev.kind)}
	}
	switch ev.kind {
	case evLeaseLost:
		s.phase = phaseJoin
		return s, loopAction{kind: actRejoin}
	case evSignal:
		when := "while waiting for a round"
		if s.phase != phaseJoin {
			when = "before the round's workers started"
		}
		s.phase = phaseDone
		return s, loopAction{kind: actLeaveOnSignal, sig: ev.sig, when: when}
	case evFailed:
		// A node that has not joined a round has nothing to leave.
		leave := s.phase != phaseJoin
		s.phase = phaseDone
		return s, loopAction{kind: actExit, leave: leave, err: ev.err}
	}
	want, next, act := expected(s.phase)
	switch {
	case ev.kind == evBegin && s.phase == phaseJoin:
		return s, loopAction{kind: actJoin}
	case ev.kind == evSuperseded && s.phase == phaseBarrier:
		s.phase = phaseJoin
		return s, loopAction{kind: actJoin}
	case ev.kind == evRoundEnded && s.phase == phaseRun:
		if ev.workers.final() {
			s.phase = phaseDone
			return s, loopAction{kind: actExit, err: ev.err}
		}
		s.phase = phaseJoin
		return s, loopAction{kind: actJoin}
	case ev.kind != want:
		err := fmt.Errorf("internal: event %s in phase %s", ev.kind, s.phase)
		s.phase = phaseDone
		return s, loopAction{kind: actExit, leave: true, err: err}
	case ev.kind == evJoined:
		s.round, s.restarts = ev.round, ev.restarts
		if launcher.BudgetSpent(ev.restarts, s.maxRestarts) {
			s.phase = phaseDone
			return s, loopAction{kind: actExit, leave: true, err: budgetSpentError(fmt.Sprintf("job %q failed: %d restart(s) exceed --max-restarts %d (counted for the whole job)", s.job, ev.restarts, s.maxRestarts))}
		}
	}
	s.phase = next
	return s, loopAction{kind: act}
}

// expected is the event that moves phase on, the phase it moves to and
// the action taken there.
func expected(p phase) (eventKind, phase, actKind) {
	switch p {
	case phaseJoin:
		return evJoined, phaseBarrier, actBarrier
	case phaseBarrier:
		return evBarrierPassed, phaseMark, actMark
	case phaseMark:
		return evMarked, phaseStart, actStart
	case phaseStart:
		return evStarted, phaseRun, actWatch
	}
	return evRoundEnded, phaseJoin, actJoin
}

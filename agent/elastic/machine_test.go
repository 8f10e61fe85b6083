package elastic

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

// The round loop's rules, tested on step alone: no etcd, no workers.

func TestStep(t *testing.T) {
	boom := errors.New("boom")
	at := func(p phase) loopState {
		return loopState{phase: p, round: 7, restarts: 1, job: "j", maxRestarts: 3}
	}
	for _, tc := range []struct {
		rule      string
		s         loopState
		ev        loopEvent
		wantPhase phase
		want      loopAction
		errHas    string
	}{
		{"begin: join a round", loopState{job: "j", maxRestarts: 3}, loopEvent{kind: evBegin},
			phaseJoin, loopAction{kind: actJoin}, ""},
		{"joined within the budget: wait at the barrier", at(phaseJoin), loopEvent{kind: evJoined, round: 8, restarts: 3},
			phaseBarrier, loopAction{kind: actBarrier}, ""},
		{"joined past the budget: leave and fail", at(phaseJoin), loopEvent{kind: evJoined, round: 8, restarts: 4},
			phaseDone, loopAction{kind: actExit, leave: true}, "4 restart(s) exceed --max-restarts 3"},
		{"budget of zero: the first restart fails the job", loopState{job: "j"}, loopEvent{kind: evJoined, round: 2, restarts: 1},
			phaseDone, loopAction{kind: actExit, leave: true}, "exceed --max-restarts 0"},
		{"barrier passed: mark the workers running", at(phaseBarrier), loopEvent{kind: evBarrierPassed},
			phaseMark, loopAction{kind: actMark}, ""},
		{"superseded at the barrier: join again", at(phaseBarrier), loopEvent{kind: evSuperseded},
			phaseJoin, loopAction{kind: actJoin}, ""},
		{"marked: start the workers", at(phaseMark), loopEvent{kind: evMarked},
			phaseStart, loopAction{kind: actStart}, ""},
		{"started: watch them", at(phaseStart), loopEvent{kind: evStarted},
			phaseRun, loopAction{kind: actWatch}, ""},
		{"workers stopped for a change: join the next round", at(phaseRun), loopEvent{kind: evRoundEnded, workers: workersStopped},
			phaseJoin, loopAction{kind: actJoin}, ""},
		{"worker failed and reported: join the next round", at(phaseRun), loopEvent{kind: evRoundEnded, workers: workersUnhealthy},
			phaseJoin, loopAction{kind: actJoin}, ""},
		{"workers succeeded: exit 0", at(phaseRun), loopEvent{kind: evRoundEnded, workers: workersSucceeded},
			phaseDone, loopAction{kind: actExit}, ""},
		{"agent failed in watch: exit with its error, no second leave", at(phaseRun), loopEvent{kind: evRoundEnded, workers: workersFailed, err: boom},
			phaseDone, loopAction{kind: actExit}, "boom"},
		{"lease lost while joining: rejoin", at(phaseJoin), loopEvent{kind: evLeaseLost},
			phaseJoin, loopAction{kind: actRejoin}, ""},
		{"lease lost at the barrier: rejoin", at(phaseBarrier), loopEvent{kind: evLeaseLost},
			phaseJoin, loopAction{kind: actRejoin}, ""},
		{"lease lost marking: rejoin", at(phaseMark), loopEvent{kind: evLeaseLost},
			phaseJoin, loopAction{kind: actRejoin}, ""},
		{"lease lost under running workers (fenced): rejoin", at(phaseRun), loopEvent{kind: evLeaseLost},
			phaseJoin, loopAction{kind: actRejoin}, ""},
		{"signal while waiting for a round: leave", at(phaseJoin), loopEvent{kind: evSignal, sig: syscall.SIGTERM},
			phaseDone, loopAction{kind: actLeaveOnSignal, sig: syscall.SIGTERM, when: "while waiting for a round"}, ""},
		{"drain at the barrier: leave", at(phaseBarrier), loopEvent{kind: evSignal, sig: syscall.SIGUSR2},
			phaseDone, loopAction{kind: actLeaveOnSignal, sig: syscall.SIGUSR2, when: "before the round's workers started"}, ""},
		{"join failed: exit without leaving", at(phaseJoin), loopEvent{kind: evFailed, err: boom},
			phaseDone, loopAction{kind: actExit}, "boom"},
		{"barrier failed: leave and exit", at(phaseBarrier), loopEvent{kind: evFailed, err: boom},
			phaseDone, loopAction{kind: actExit, leave: true}, "boom"},
		{"marking failed: leave and exit", at(phaseMark), loopEvent{kind: evFailed, err: boom},
			phaseDone, loopAction{kind: actExit, leave: true}, "boom"},
		{"start failed: leave and exit", at(phaseStart), loopEvent{kind: evFailed, err: boom},
			phaseDone, loopAction{kind: actExit, leave: true}, "boom"},
		{"an event out of its phase ends the agent, never a panic", at(phaseJoin), loopEvent{kind: evStarted},
			phaseDone, loopAction{kind: actExit, leave: true}, "internal: event started in phase join"},
		{"nothing after done", at(phaseDone), loopEvent{kind: evBegin},
			phaseDone, loopAction{kind: actExit}, "after the agent was done"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			s, act := step(tc.s, tc.ev)
			if s.phase != tc.wantPhase {
				t.Errorf("phase = %s, want %s", s.phase, tc.wantPhase)
			}
			err := act.err
			act.err = nil
			if act != tc.want {
				t.Errorf("action = %+v, want %+v", act, tc.want)
			}
			switch {
			case tc.errHas == "" && err != nil:
				t.Errorf("err = %v, want none", err)
			case tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)):
				t.Errorf("err = %v, want one saying %q", err, tc.errHas)
			}
		})
	}
}

// A whole round, then a lost node's round, then success: the events a loop
// feeds step in order, and the actions it gets back.
func TestStepWalksARoundToSuccess(t *testing.T) {
	s := loopState{job: "j", maxRestarts: 1}
	walk := []struct {
		ev   loopEvent
		want actKind
	}{
		{loopEvent{kind: evBegin}, actJoin},
		{loopEvent{kind: evJoined, round: 1}, actBarrier},
		{loopEvent{kind: evBarrierPassed}, actMark},
		{loopEvent{kind: evMarked}, actStart},
		{loopEvent{kind: evStarted}, actWatch},
		{loopEvent{kind: evRoundEnded, workers: workersUnhealthy}, actJoin},
		{loopEvent{kind: evJoined, round: 2, restarts: 1}, actBarrier},
		{loopEvent{kind: evLeaseLost}, actRejoin},
		{loopEvent{kind: evJoined, round: 3, restarts: 1}, actBarrier},
		{loopEvent{kind: evBarrierPassed}, actMark},
		{loopEvent{kind: evMarked}, actStart},
		{loopEvent{kind: evStarted}, actWatch},
		{loopEvent{kind: evRoundEnded, workers: workersSucceeded}, actExit},
	}
	for i, w := range walk {
		var act loopAction
		s, act = step(s, w.ev)
		if act.kind != w.want || act.err != nil {
			t.Fatalf("step %d (%s): action %s err %v, want %s", i, w.ev.kind, act.kind, act.err, w.want)
		}
	}
	if s.round != 3 || s.restarts != 1 {
		t.Fatalf("state after the walk = %+v, want round 3 with 1 restart", s)
	}
}

// Restarts spent: the exit fails the job for every node (the loop calls
// FailJob on a budgetSpentError); any other failure does not.
func TestStepBudgetSpentFailsTheJobForEveryNode(t *testing.T) {
	_, act := step(loopState{phase: phaseJoin, job: "j", maxRestarts: 1}, loopEvent{kind: evJoined, round: 3, restarts: 2})
	var spent budgetSpentError
	if act.kind != actExit || !errors.As(act.err, &spent) {
		t.Fatalf("budget spent: action %s err %v, want exit with a budgetSpentError", act.kind, act.err)
	}
	_, act = step(loopState{phase: phaseBarrier, job: "j"}, loopEvent{kind: evFailed, err: errors.New("boom")})
	if errors.As(act.err, &spent) {
		t.Fatalf("a failed barrier would fail the whole job: %v", act.err)
	}
}

package jobrunner

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/launcher"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// How the end of a run is judged: a drain, a success (the job's, or only
// this node's part of it), or a node failure that is restarted after a
// backoff, shown as Restarting (a problem record with the count and the
// last error), and that fails the job when its restart budget is spent or
// its hyperpodrun keeps failing on this node (judgeFailure).

// restartLater schedules a restart of a job's hyperpodrun after its
// backoff; a run that lasted HealthyAfter starts the backoff over.
func (r *Runner) restartLater(job, why string, ran time.Duration, attrs ...any) {
	r.scheduleRestart(job, why, r.countFailure(job, ran), attrs...)
}

// countFailure counts a failure of a job's run that lasted ran and
// returns the job's consecutive failures on this node: a run that lasted
// HealthyAfter starts the count over.
func (r *Runner) countFailure(job string, ran time.Duration) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	rt := r.retryOf(job)
	if ran >= r.cfg.HealthyAfter {
		rt.failures = 0
	}
	rt.failures++
	return rt.failures
}

// scheduleRestart restarts a job's hyperpodrun after the backoff of its
// n-th consecutive failure.
func (r *Runner) scheduleRestart(job, why string, n int, attrs ...any) {
	r.mu.Lock()
	rt := r.retryOf(job)
	d := Backoff(n, r.cfg.BackoffBase, r.cfg.BackoffMax)
	rt.notBefore = r.cfg.Clock.Now().Add(d)
	// A new timer rather than Reset: a fake clock's AfterFunc timer
	// fires only once (k8s.io/utils/clock/testing).
	rt.timer.Stop()
	rt.timer = r.cfg.Clock.AfterFunc(d, r.poke)
	r.mu.Unlock()
	r.log.Warn("node failure: restarting the job's hyperpodrun after a backoff while the job is placed on this node",
		append([]any{"job", job, "why", why, "backoff", d, "consecutive_failures", n}, attrs...)...)
}

// exited judges a run's end. Drained: nothing to do. Exit 0: the job
// finished training (Succeeded). Any other end (a non-zero exit, a signal,
// an error) is a node failure, restarted after a backoff while the job is
// placed here (with a problem record saying so, its count and its last
// error: elasticctl get jobs shows Restarting), unless judgeFailure says
// the job is Failed: its global restart budget is spent, or its
// hyperpodrun keeps exiting on this node (a crash loop) more times in a
// row than maxRestarts.
func (r *Runner) exited(job string, err error, draining bool, ran time.Duration, maxRestarts int) {
	// Once judged, a job that left the node gives its uid back.
	defer r.poke()
	if draining || err == nil {
		r.forget(job)
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
	defer cancel()
	if draining {
		r.log.Info("job drained off this node", "job", job, "err", err)
		return
	}
	// The job's own keys are read as the job (asjob.go).
	js, closeJS, jerr := r.asJob(ctx, job)
	if jerr != nil {
		r.log.Warn("cannot read the job's rendezvous as the job", "job", job, "err", jerr)
		js, closeJS = r.st, func() {}
	}
	defer closeJS()
	if err == nil {
		r.clearProblemOf(job)
		r.finishedHere(ctx, js, job, "its workers succeeded")
		return
	}
	if done, ferr := rendezvous.JobFinished(ctx, js.Cli, r.st.Keys.Prefix(), job); ferr == nil && done {
		// A node that joined after every other node finished is refused
		// (exit 1, as torchrun's closed rendezvous): not a node failure.
		r.forget(job)
		r.finishedHere(ctx, js, job, "the job had already finished when it joined")
		return
	}
	why := describeExit(err)
	if strings.Contains(why, fleet.JobRecordsLost) {
		// The job's hyperpodrun found etcd lost the job's records before
		// this agent did: not a node failure, and never restarted into the
		// emptied etcd (it would train from step 0 unseen). The agent's own
		// data-loss handling names the job on the node's record.
		r.forget(job)
		r.mu.Lock()
		r.lostData = append(r.lostData, job)
		r.mu.Unlock()
		r.log.Error("the job's hyperpodrun found that etcd lost the job's records; not restarting it: resubmit the job", "job", job, "why", why)
		return
	}
	n, problem, rerr := js.Restarts(ctx, job)
	if problem != nil {
		r.log.Warn("malformed restart count", "job", job, "err", problem)
	}
	failures := r.countFailure(job, ran)
	switch judgeFailure(n, rerr == nil, failures, maxRestarts) {
	case ruleBudgetSpent:
		msg := fmt.Sprintf("hyperpodrun %s; the job's %d restart(s) exceed maxRestarts %d (counted for the whole job)", why, n, maxRestarts)
		r.log.Warn("job failed: its restart budget is spent", "job", job, "why", why, "restarts", n, "max_restarts", maxRestarts)
		r.failHere(ctx, job, msg)
		return
	case ruleCrashLoop:
		msg := fmt.Sprintf("hyperpodrun failed %d time(s) in a row on node %s, each run ending within %s, more than maxRestarts %d; last: %s",
			failures, r.node.Name, r.cfg.HealthyAfter, maxRestarts, why)
		r.log.Warn("job failed: its hyperpodrun keeps failing on this node", "job", job, "why", why, "failures", failures, "max_restarts", maxRestarts)
		r.failHere(ctx, job, msg)
		return
	}
	r.restartingProblem(job, failures, maxRestarts, why)
	if rerr != nil {
		r.scheduleRestart(job, why, failures, "restart_count_unknown", rerr.Error())
		return
	}
	r.scheduleRestart(job, why, failures, "restarts", n, "max_restarts", maxRestarts)
}

// Rules of judgeFailure.
const (
	ruleRestart     = "restart"
	ruleBudgetSpent = "budget-spent"
	ruleCrashLoop   = "crash-loop"
)

// judgeFailure decides what a node failure of a job leads to, given the
// job's global restart count (as hyperpodrun counts it; known is false
// when it could not be read), the job's consecutive failures on this node
// (this one included) and the job's maxRestarts. Rules:
//
//   - budget-spent: the global count exceeds maxRestarts (hyperpodrun's
//     own rule): Failed;
//   - crash-loop: its hyperpodrun failed more than maxRestarts times in a
//     row on this node, each run shorter than HealthyAfter: Failed (a
//     hyperpodrun that cannot even join its rendezvous never moves the
//     global count, and was restarted forever);
//   - restart: anything else: restart after a backoff.
func judgeFailure(globalRestarts int64, known bool, nodeFailures int, maxRestarts int) string {
	switch {
	case known && launcher.BudgetSpent(int(globalRestarts), maxRestarts):
		return ruleBudgetSpent
	case launcher.BudgetSpent(nodeFailures, maxRestarts):
		return ruleCrashLoop
	}
	return ruleRestart
}

// failHere marks a job Failed from this node (msg: why) and does not
// start it here again while it stays placed.
func (r *Runner) failHere(ctx context.Context, job, msg string) {
	r.forget(job)
	r.mu.Lock()
	r.doneHere[job] = true
	r.mu.Unlock()
	r.clearProblemOf(job)
	if err := r.st.MarkFinished(ctx, job, fleet.Finish{Outcome: fleet.Failed, Node: r.node.Name, Message: clipMessage(msg), Time: time.Now().UTC()}); err != nil {
		r.log.Error("cannot record the job's failure", "job", job, "err", err)
	}
}

// restartingProblem records that the job's hyperpodrun keeps failing on
// this node: how many times in a row, and how the last run ended.
func (r *Runner) restartingProblem(job string, failures, maxRestarts int, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
	defer cancel()
	why = clipMessage(why)
	msg := fmt.Sprintf("restarting on node %s: hyperpodrun failed %d time(s) in a row (maxRestarts %d); last: %s", r.node.Name, failures, maxRestarts, why)
	if err := r.st.PutProblem(ctx, fleet.Problem{Job: job, Node: r.node.Name, Message: msg, Restarts: failures, LastError: why, Time: time.Now().UTC()}); err != nil {
		r.log.Warn("cannot record the job's restarts on this node", "job", job, "err", err)
		return
	}
	r.noteProblem(job, true)
}

// noteProblem remembers that this runner wrote a problem record for job
// (restarting: a crash loop's).
func (r *Runner) noteProblem(job string, restarting bool) {
	r.mu.Lock()
	r.problems[job] = restarting
	r.mu.Unlock()
}

// started handles a job's problem record once a run of it started (a
// process, or a container): a crash loop's record goes only once the run
// has lasted HealthyAfter (until then get jobs keeps showing Restarting);
// any other record (what kept it from starting) goes at once. The caller
// holds r.mu.
func (r *Runner) started(job string, p *proc) {
	if r.problems[job] {
		p.healthy = time.AfterFunc(r.cfg.HealthyAfter, func() {
			r.mu.Lock()
			still := r.jobs[job] == p
			r.mu.Unlock()
			if still {
				r.clearProblemOf(job)
			}
		})
	} else if _, had := r.problems[job]; had {
		r.wg.Add(1)
		go func() { defer r.wg.Done(); r.clearProblemOf(job) }()
	}
}

// clearProblemOf removes the problem record this runner wrote for job, if
// it wrote one.
func (r *Runner) clearProblemOf(job string) {
	r.mu.Lock()
	_, had := r.problems[job]
	delete(r.problems, job)
	r.mu.Unlock()
	if had {
		r.clearProblem(job)
	}
}

// clipMessage bounds a message (a last line of output) put in a record.
func clipMessage(s string) string {
	const max = 512
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// finishedHere records that the job's hyperpodrun on this node is done:
// it is not started here again while the job stays placed. The job itself
// succeeded only when no node is left in its rendezvous (each node leaves
// it before its hyperpodrun exits, so the last one to exit sees none): a
// node whose ranks finish first must not end the job for the others.
// js reads as the job (asJob).
func (r *Runner) finishedHere(ctx context.Context, js *fleet.Store, job, why string) {
	r.mu.Lock()
	r.doneHere[job] = true
	r.mu.Unlock()
	left, err := js.Members(ctx, job)
	switch {
	case err != nil:
		r.log.Warn("this node's part of the job is done; cannot tell whether other nodes still train", "job", job, "why", why, "err", err)
	case left > 0:
		r.log.Info("this node's part of the job is done; the job goes on on other nodes", "job", job, "why", why, "nodes_left", left)
	default:
		r.log.Info("job finished: no node is left in its rendezvous", "job", job, "why", why)
		if err := r.st.MarkFinished(ctx, job, fleet.Finish{Outcome: fleet.Succeeded, Node: r.node.Name, Time: time.Now().UTC()}); err != nil {
			r.log.Error("cannot record the job's success", "job", job, "err", err)
		}
	}
}

// describeExit says how a hyperpodrun ended.
func describeExit(err error) string {
	var re *runError
	if errors.As(err, &re) {
		return describeExit(re.err) + ": " + re.output
	}
	var ce *containerExit
	if errors.As(err, &ce) {
		return "(in its container) " + ce.Error()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "was killed by " + ws.Signal().String()
		}
		return fmt.Sprintf("exited with status %d", ee.ExitCode())
	}
	return "failed: " + err.Error()
}

package elastic

// Hang detection (--hang-timeout, issue 24): the workers' Python helper
// sends a heartbeat on the control channel from elastic_event_detected()
// (throttled, see checkpoint/control.ReportHeartbeat); a worker whose
// heartbeats stop for the hang timeout is hung (a stuck collective, a
// deadlock): the agent has every worker of this node dump its Python
// stacks (faulthandler, on hangStacksSignal) into the log directory, stops
// them and reports the failure, so the job restarts from its last
// committed checkpoint, counted, long before torch's collective timeout.
// A worker that never sent a heartbeat is not watched (its loop does not
// call the helper), nor are workers saving for a planned change.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/launcher"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// DefaultHangTimeout is --hang-timeout's default: a third of torch's
// 30-minute default collective timeout (gloo, and the default process
// group), so a stuck collective costs 10 minutes, not 30, and long enough
// for what a loop commonly does between two steps without calling the
// helper (a periodic checkpoint save, an evaluation pass of a few minutes).
const DefaultHangTimeout = 10 * time.Minute

// hangStacksSignal makes a worker's helper write every thread's Python
// stack to its stacks file (faulthandler.register). SIGUSR2: the elastic
// signal is SIGUSR1, and hyperpodrun forwards neither to its workers.
const hangStacksSignal = syscall.SIGUSR2

// stacksWait bounds the wait for the workers' stack dumps.
const stacksWait = 2 * time.Second

// hangView is what the hang decision looks at.
type hangView struct {
	// Timeout is --hang-timeout (0: not watched).
	Timeout time.Duration
	// Now is the time of the check.
	Now time.Time
	// Planned: the round's workers are stopping for a planned change (they
	// checkpoint; --graceful-timeout bounds them).
	Planned bool
	// Beats are the current round's heartbeats.
	Beats []control.Heartbeat
}

// hangVerdict is the hang decision: the hung workers (none: all is well)
// and the rule that decided.
type hangVerdict struct {
	Hung []control.Heartbeat
	Rule string
}

// Rules of hungWorkers.
const (
	ruleHangDisabled    = "disabled: --hang-timeout 0"
	ruleHangPlanned     = "planned change under way: the workers checkpoint"
	ruleHangNoHeartbeat = "no heartbeat yet: the clock starts at a worker's first"
	ruleHangProgressing = "every worker sent a heartbeat within the hang timeout"
	ruleHangHung        = "a worker sent no heartbeat for the hang timeout"
)

// hungWorkers decides which workers are hung: those whose last heartbeat
// is Timeout old or older.
func hungWorkers(v hangView) hangVerdict {
	switch {
	case v.Timeout <= 0:
		return hangVerdict{Rule: ruleHangDisabled}
	case v.Planned:
		return hangVerdict{Rule: ruleHangPlanned}
	case len(v.Beats) == 0:
		return hangVerdict{Rule: ruleHangNoHeartbeat}
	}
	var hung []control.Heartbeat
	for _, b := range v.Beats {
		if v.Now.Sub(b.Last) >= v.Timeout {
			hung = append(hung, b)
		}
	}
	if len(hung) == 0 {
		return hangVerdict{Rule: ruleHangProgressing}
	}
	return hangVerdict{Hung: hung, Rule: ruleHangHung}
}

// stalled says whether, when the round is stopped by a failure elsewhere,
// this node's workers are worth a stack dump: one of them sent no
// heartbeat for half the hang timeout (they are likely stuck in the same
// collective as the hung worker another node found).
func stalled(v hangView) bool {
	if v.Timeout <= 0 || v.Planned {
		return false
	}
	for _, b := range v.Beats {
		if v.Now.Sub(b.Last) >= v.Timeout/2 {
			return true
		}
	}
	return false
}

// heartbeatInterval is the least time between two heartbeats of a worker:
// a tenth of the timeout, between 50ms and 30s.
func heartbeatInterval(timeout time.Duration) time.Duration {
	return min(max(timeout/10, 50*time.Millisecond), 30*time.Second)
}

// hangPoll is how often the agent checks the heartbeats.
func hangPoll(timeout time.Duration) time.Duration {
	return min(max(timeout/20, 20*time.Millisecond), 5*time.Second)
}

// hangEnv adds the hang detection's variables to a round's worker
// environment: the timeout, the heartbeat interval and where to dump the
// stacks (<log dir>/attempt_<n>/stacks, made here).
func (e *elastic) hangEnv(env map[string]string, attempt int) { hangEnvFor(e.o, e.log, env, attempt) }

// hangEnvFor is hangEnv for the options o.
func hangEnvFor(o Options, log *slog.Logger, env map[string]string, attempt int) {
	t := o.HangTimeout
	if t <= 0 {
		return
	}
	env[control.EnvHangTimeout] = strconv.FormatFloat(t.Seconds(), 'f', -1, 64)
	env[control.EnvHeartbeatInterval] = strconv.FormatFloat(heartbeatInterval(t).Seconds(), 'f', -1, 64)
	env[control.EnvStacksSignal] = strconv.Itoa(int(hangStacksSignal))
	if o.Spec.LogDir == "" {
		return
	}
	dir := filepath.Join(o.Spec.LogDir, "attempt_"+strconv.Itoa(attempt), "stacks")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Warn("no stack dumps on a hang: cannot create their directory", "dir", dir, "err", err)
		return
	}
	env[control.EnvStacksDir] = dir
}

// hangView is the hang decision's input now, for round r's workers g.
func (e *elastic) hangView(g *launcher.Group, r *rendezvous.Round) hangView {
	return hangView{Timeout: e.o.HangTimeout, Now: time.Now(), Planned: e.stopping.Load() == r.Number, Beats: liveBeats(e.ch, g)}
}

// liveBeats are the heartbeats of ch sent by g's live workers (a worker's
// process group is its pid): none of an earlier attempt's.
func liveBeats(ch *control.Channel, g *launcher.Group) []control.Heartbeat {
	groups := map[int]bool{}
	for _, pid := range g.PIDs() {
		groups[pid] = true
	}
	var out []control.Heartbeat
	for _, b := range ch.Heartbeats() {
		if pgid, err := syscall.Getpgid(b.PID); err == nil && groups[pgid] {
			out = append(out, b)
		}
	}
	return out
}

// watchHang checks the round's heartbeats until ctx ends; the channel gets
// the verdict once a worker is hung. Without a hang timeout it never does.
func (e *elastic) watchHang(ctx context.Context, g *launcher.Group, r *rendezvous.Round) <-chan hangVerdict {
	return watchHangWith(ctx, e.o.HangTimeout, func() hangView { return e.hangView(g, r) })
}

// watchHangWith checks view every hangPoll(timeout) until ctx ends or a
// worker is hung.
func watchHangWith(ctx context.Context, timeout time.Duration, view func() hangView) <-chan hangVerdict {
	out := make(chan hangVerdict, 1)
	if timeout <= 0 {
		return out
	}
	go func() {
		t := time.NewTicker(hangPoll(timeout))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if v := hungWorkers(view()); len(v.Hung) > 0 {
				out <- v
				return
			}
		}
	}()
	return out
}

// hangDetail names the hung ranks and the timeout.
func hangDetail(v hangVerdict, timeout time.Duration) string {
	ranks := make([]string, 0, len(v.Hung))
	for _, b := range v.Hung {
		ranks = append(ranks, strconv.Itoa(b.Rank))
	}
	return fmt.Sprintf("rank %s made no progress for %s (--hang-timeout)", strings.Join(ranks, ","), timeout)
}

// hung ends a round whose worker hung: stacks dumped, workers stopped, the
// failure reported (the job restarts from its last committed checkpoint,
// and the restart counts).
func (e *elastic) hung(ctx context.Context, g *launcher.Group, r *rendezvous.Round, v hangVerdict) roundEnd {
	files := dumpStacks(e.ch, g, e.log)
	detail := hangDetail(v, e.o.HangTimeout)
	e.log.Error("workers hung: no heartbeat within --hang-timeout; stacks dumped, stopping the workers", "round", r.Number,
		"detail", detail, "hang_timeout", e.o.HangTimeout, "stacks", strings.Join(files, ","))
	g.Stop(e.o.ShutdownSignal, e.o.ShutdownTimeout)
	summary := fmt.Sprintf("hyperpodrun: %s on node %s; Python stacks in %s\n", detail, e.node.ID(), strings.Join(files, ", "))
	e.printSummary(summary)
	n, err := e.node.ReportFailure(ctx, r, detail, summary)
	if err != nil {
		return failedWith(&ExitError{1, fmt.Errorf("report the hung workers: %w", err)})
	}
	e.log.Warn("hung workers count as a failure; the job restarts at the next round", "detail", detail, "job_restarts", n, "max_restarts", e.o.MaxRestarts)
	return roundEnd{state: workersUnhealthy}
}

// dumpIfStalled dumps this node's workers' stacks before they are stopped
// for a failure elsewhere when they look stuck too (stalled).
func (e *elastic) dumpIfStalled(g *launcher.Group, r *rendezvous.Round) {
	if !stalled(e.hangView(g, r)) {
		return
	}
	if files := dumpStacks(e.ch, g, e.log); len(files) > 0 {
		e.log.Warn("workers made no progress for half the hang timeout before the round failed; stacks dumped", "round", r.Number, "stacks", strings.Join(files, ","))
	}
}

// dumpStacks has every worker of g that sent a heartbeat on ch with a
// stacks file dump its Python stacks there, and waits (stacksWait at most)
// until each file has grown. It returns the files written.
func dumpStacks(ch *control.Channel, g *launcher.Group, log *slog.Logger) []string {
	type dump struct {
		file string
		size int64
	}
	var pending []dump
	for _, b := range liveBeats(ch, g) {
		if b.Stacks == "" {
			continue
		}
		d := dump{file: b.Stacks}
		if fi, err := os.Stat(b.Stacks); err == nil {
			d.size = fi.Size()
		}
		if err := syscall.Kill(b.PID, hangStacksSignal); err != nil {
			log.Warn("cannot ask a worker for its stacks", "pid", b.PID, "err", err)
			continue
		}
		pending = append(pending, d)
	}
	var written []string
	deadline := time.Now().Add(stacksWait)
	for len(pending) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		left := pending[:0]
		for _, d := range pending {
			if fi, err := os.Stat(d.file); err == nil && fi.Size() > d.size {
				written = append(written, d.file)
				continue
			}
			left = append(left, d)
		}
		pending = left
	}
	// faulthandler writes in a few calls: give the last lines a moment.
	if len(written) > 0 {
		time.Sleep(50 * time.Millisecond)
	}
	return written
}

// staticHang is the hang watch of a --standalone attempt.
type staticHang struct {
	verdict <-chan hangVerdict
	stop    context.CancelFunc
	ch      *control.Channel
	o       Options
	last    hangVerdict
}

// watchStaticHang watches the heartbeats of g's workers on ch (nil: no
// watch, the static backend has no control channel).
func watchStaticHang(ctx context.Context, o Options, ch *control.Channel, g *launcher.Group) *staticHang {
	wctx, cancel := context.WithCancel(ctx)
	h := &staticHang{stop: cancel, ch: ch, o: o}
	if ch == nil {
		return h
	}
	in := watchHangWith(wctx, o.HangTimeout, func() hangView {
		return hangView{Timeout: o.HangTimeout, Now: time.Now(), Beats: liveBeats(ch, g)}
	})
	out := make(chan hangVerdict, 1)
	go func() {
		select {
		case v := <-in:
			h.last = v
			out <- v
		case <-wctx.Done():
		}
	}()
	h.verdict = out
	return h
}

// stopHung dumps the stacks of a hung attempt's workers, stops them and
// returns the attempt's result with the hang as its root cause.
func (h *staticHang) stopHung(g *launcher.Group, log *slog.Logger) launcher.Result {
	files := dumpStacks(h.ch, g, log)
	detail := hangDetail(h.last, h.o.HangTimeout)
	log.Error("workers hung: no heartbeat within --hang-timeout; stacks dumped, restarting all local workers",
		"detail", detail, "stacks", strings.Join(files, ","))
	g.Stop(h.o.ShutdownSignal, h.o.ShutdownTimeout)
	return g.Result()
}

package elastic

// Hang detection (--hang-timeout, issue 24): the workers' Python helper
// sends a heartbeat on the control channel from elastic_event_detected()
// (throttled, see checkpoint/control.ReportHeartbeat); a worker whose
// heartbeats stop for the hang timeout is hung (a stuck collective, a
// deadlock): the agent has every worker of this node dump its Python
// stacks (faulthandler, on hangStacksSignal) into the log directory, stops
// them and reports the failure, so the job restarts from its last
// committed checkpoint, counted, long before torch's collective timeout.
// Workers saving for a planned change are not watched.
//
// Start-up (--hang-startup-timeout, as NVRx's initial heartbeat timeout): a
// worker that sent no heartbeat yet in its round is hung once the start-up
// timeout has passed since the round's workers were started, but only when
// its loop is known to call the helper: a worker of the same local rank on
// this node sent heartbeats in an earlier round (or attempt) of this
// hyperpodrun. A loop that never calls the helper is never taken for hung,
// and neither is the first round's start-up (its workers may import,
// download and load for as long as they need); a restarted round's is
// (a worker stuck in init_process_group, or stopped before its first step).

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

// DefaultHangStartupTimeout is --hang-startup-timeout's default: as
// --hang-timeout's. It bounds a restarted round's start-up (workers start,
// import torch, init_process_group, load the last checkpoint): minutes on
// a large job, the order of an evaluation pass the hang timeout already
// allows for; and a worker stuck in that start-up is found as soon as one
// stuck in a step.
const DefaultHangStartupTimeout = DefaultHangTimeout

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
	// StartupTimeout is --hang-startup-timeout (0: start-up not watched).
	StartupTimeout time.Duration
	// Started is when the round's workers were started (or given the round).
	Started time.Time
	// Silent are the round's live workers that sent no heartbeat yet.
	Silent []silentWorker
}

// silentWorker is a live worker of the round that sent no heartbeat yet.
type silentWorker struct {
	// PID is the worker's process (group).
	PID int
	// Rank is its global rank; LocalRank its rank on this node.
	Rank, LocalRank int
	// Known: the worker of this local rank sent heartbeats in an earlier
	// round or attempt of this hyperpodrun (its loop calls the helper).
	Known bool
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
	ruleHangNoHeartbeat = "no heartbeat yet and none from an earlier round: the loop may not call the helper, not watched"
	ruleHangProgressing = "every worker sent a heartbeat within the hang timeout"
	ruleHangHung        = "a worker sent no heartbeat for the hang timeout"
	ruleStartupOff      = "no heartbeat yet, start-up not watched: --hang-startup-timeout 0"
	ruleStartupStarting = "a worker that called the helper in an earlier round has not sent its first heartbeat yet, within the start-up timeout"
	ruleStartupHung     = "a worker that called the helper in an earlier round sent no heartbeat within the start-up timeout of its round"
)

// hungWorkers decides which workers are hung: those whose last heartbeat
// is Timeout old or older, and those that sent none StartupTimeout after
// the round's start although their loop is known to call the helper (a
// silent worker is named by a Heartbeat with its rank and pid, Count 0).
func hungWorkers(v hangView) hangVerdict {
	switch {
	case v.Timeout <= 0:
		return hangVerdict{Rule: ruleHangDisabled}
	case v.Planned:
		return hangVerdict{Rule: ruleHangPlanned}
	}
	var hung []control.Heartbeat
	for _, b := range v.Beats {
		if v.Now.Sub(b.Last) >= v.Timeout {
			hung = append(hung, b)
		}
	}
	if len(hung) > 0 {
		return hangVerdict{Hung: hung, Rule: ruleHangHung}
	}
	known := knownSilent(v)
	switch {
	case len(known) == 0 && len(v.Beats) > 0:
		return hangVerdict{Rule: ruleHangProgressing}
	case len(known) == 0:
		return hangVerdict{Rule: ruleHangNoHeartbeat}
	case v.StartupTimeout <= 0:
		return hangVerdict{Rule: ruleStartupOff}
	case v.Now.Sub(v.Started) < v.StartupTimeout:
		return hangVerdict{Rule: ruleStartupStarting}
	}
	return hangVerdict{Hung: known, Rule: ruleStartupHung}
}

// stalled says whether, when the round is stopped by a failure elsewhere,
// this node's workers are worth a stack dump: one of them sent no
// heartbeat for half the hang timeout (they are likely stuck in the same
// collective as the hung worker another node found), or one known to call
// the helper sent none yet for half the start-up timeout.
func stalled(v hangView) bool {
	if v.Timeout <= 0 || v.Planned {
		return false
	}
	for _, b := range v.Beats {
		if v.Now.Sub(b.Last) >= v.Timeout/2 {
			return true
		}
	}
	return len(knownSilent(v)) > 0 && v.StartupTimeout > 0 && v.Now.Sub(v.Started) >= v.StartupTimeout/2
}

// knownSilent are v's silent workers known to call the helper, each named
// by a Heartbeat with its rank and pid (Count 0).
func knownSilent(v hangView) []control.Heartbeat {
	var out []control.Heartbeat
	for _, s := range v.Silent {
		if s.Known {
			out = append(out, control.Heartbeat{Rank: s.Rank, PID: s.PID})
		}
	}
	return out
}

// hangWatchEvery is how often the hang watch checks the heartbeats under
// o: hangPoll of the shorter of the hang and start-up timeouts.
func hangWatchEvery(o Options) time.Duration {
	t := o.HangTimeout
	if o.HangStartupTimeout > 0 {
		t = min(t, o.HangStartupTimeout)
	}
	return hangPoll(t)
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

// hangMemory is what the hang watch remembers across rounds: the local
// ranks whose workers sent heartbeats (their loop calls the helper), and
// when the watched round's workers started.
type hangMemory struct {
	mu      sync.Mutex
	beat    map[int]bool
	started time.Time
}

// start records that the watched round's workers start now.
func (m *hangMemory) start() {
	m.mu.Lock()
	m.started = time.Now()
	m.mu.Unlock()
}

// roundStart is when the watched round's workers started.
func (m *hangMemory) roundStart() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.started
}

// remember records the local ranks of beats (global ranks; base is the
// global rank of local rank 0).
func (m *hangMemory) remember(beats []control.Heartbeat, base int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.beat == nil {
		m.beat = map[int]bool{}
	}
	for _, b := range beats {
		m.beat[b.Rank-base] = true
	}
}

// known says whether local rank lr's workers sent heartbeats before.
func (m *hangMemory) known(lr int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.beat[lr]
}

// hangView is the hang decision's input now, for round r's workers g.
func (e *elastic) hangView(g *launcher.Group, r *rendezvous.Round) hangView {
	base := r.Self.BaseRank
	beats, silent := roundWorkers(e.ch, g, e.o.Spec.NProcPerNode, base, e.hangs.known)
	e.hangs.remember(beats, base)
	return hangView{Timeout: e.o.HangTimeout, Now: time.Now(), Planned: e.stopping.Load() == r.Number, Beats: beats,
		StartupTimeout: e.o.HangStartupTimeout, Started: e.hangs.roundStart(), Silent: silent}
}

// liveBeats are the heartbeats of ch sent by g's live workers (a worker's
// process group is its pid): none of an earlier attempt's.
func liveBeats(ch *control.Channel, g *launcher.Group) []control.Heartbeat {
	beats, _ := roundWorkers(ch, g, 0, 0, nil)
	return beats
}

// roundWorkers splits g's live workers into those that sent heartbeats on
// ch (their heartbeats) and the silent rest. nproc is the group's size and
// base the global rank of its local rank 0; a silent worker is Known when
// known says its local rank's workers sent heartbeats before (never when
// a worker has exited: the live workers' local ranks are then unknown).
func roundWorkers(ch *control.Channel, g *launcher.Group, nproc, base int, known func(lr int) bool) ([]control.Heartbeat, []silentWorker) {
	pids := g.PIDs()
	beaten := make(map[int]bool, len(pids))
	for _, pid := range pids {
		beaten[pid] = false
	}
	var beats []control.Heartbeat
	for _, b := range ch.Heartbeats() {
		if pgid, err := syscall.Getpgid(b.PID); err == nil {
			if _, ok := beaten[pgid]; ok {
				beats = append(beats, b)
				beaten[pgid] = true
			}
		}
	}
	var silent []silentWorker
	for i, pid := range pids { // in local rank order
		if beaten[pid] {
			continue
		}
		s := silentWorker{PID: pid, Rank: -1, LocalRank: -1}
		if len(pids) == nproc {
			s.LocalRank, s.Rank = i, base+i
			s.Known = known != nil && known(i)
		}
		silent = append(silent, s)
	}
	return beats, silent
}

// watchHang checks the round's heartbeats until ctx ends; the channel gets
// the verdict once a worker is hung. Without a hang timeout it never does.
// The start-up clock starts now (the round's workers were just started,
// or given the round).
func (e *elastic) watchHang(ctx context.Context, g *launcher.Group, r *rendezvous.Round) <-chan hangVerdict {
	e.hangs.start()
	return watchHangWith(ctx, e.o, func() hangView { return e.hangView(g, r) })
}

// watchHangWith checks view every hangWatchEvery(o) until ctx ends or a
// worker is hung.
func watchHangWith(ctx context.Context, o Options, view func() hangView) <-chan hangVerdict {
	out := make(chan hangVerdict, 1)
	if o.HangTimeout <= 0 {
		return out
	}
	go func() {
		t := time.NewTicker(hangWatchEvery(o))
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

// hangDetail names the hung ranks and the timeout that found them.
func hangDetail(v hangVerdict, o Options) string {
	ranks := make([]string, 0, len(v.Hung))
	for _, b := range v.Hung {
		ranks = append(ranks, strconv.Itoa(b.Rank))
	}
	if v.Rule == ruleStartupHung {
		return fmt.Sprintf("rank %s sent no heartbeat within %s of the round's start although its loop called the helper before (--hang-startup-timeout)",
			strings.Join(ranks, ","), o.HangStartupTimeout)
	}
	return fmt.Sprintf("rank %s made no progress for %s (--hang-timeout)", strings.Join(ranks, ","), o.HangTimeout)
}

// hangTimeoutFlag is the flag whose timeout found v's hang.
func hangTimeoutFlag(v hangVerdict) string {
	if v.Rule == ruleStartupHung {
		return "--hang-startup-timeout"
	}
	return "--hang-timeout"
}

// hangTargets are the workers to ask for their stacks: every live worker
// of g that sent a heartbeat on ch (with the stacks file it named), and the
// silent ones of hung (Count 0) whose helper opened a stacks file under
// logDir (it does at import, see hyperpodrun_elastic).
func hangTargets(ch *control.Channel, g *launcher.Group, hung []control.Heartbeat, logDir string) []control.Heartbeat {
	targets := liveBeats(ch, g)
	for _, b := range hung {
		if b.Count > 0 {
			continue
		}
		if f := silentStacksFile(logDir, b.PID); f != "" {
			b.Stacks = f
			targets = append(targets, b)
		}
	}
	return targets
}

// silentStacksFile is the stacks file the helper of worker pid opened
// under the run's log directory (<logDir>/attempt_*/stacks/
// stacks_rank*_pid<pid>.txt, the newest), "" if none.
func silentStacksFile(logDir string, pid int) string {
	if logDir == "" || pid <= 0 {
		return ""
	}
	files, _ := filepath.Glob(filepath.Join(logDir, "attempt_*", "stacks", "stacks_rank*_pid"+strconv.Itoa(pid)+".txt"))
	newest, at := "", time.Time{}
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && fi.ModTime().After(at) {
			newest, at = f, fi.ModTime()
		}
	}
	return newest
}

// hung ends a round whose worker hung: stacks dumped, workers stopped, the
// failure reported (the job restarts from its last committed checkpoint,
// and the restart counts).
func (e *elastic) hung(ctx context.Context, g *launcher.Group, r *rendezvous.Round, v hangVerdict) roundEnd {
	files := dumpStacks(hangTargets(e.ch, g, v.Hung, e.o.Spec.LogDir), e.log)
	detail := hangDetail(v, e.o)
	e.log.Error("workers hung: no heartbeat within "+hangTimeoutFlag(v)+"; stacks dumped, stopping the workers", "round", r.Number,
		"detail", detail, "hang_timeout", e.o.HangTimeout, "hang_startup_timeout", e.o.HangStartupTimeout, "stacks", strings.Join(files, ","))
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
	v := e.hangView(g, r)
	if !stalled(v) {
		return
	}
	if files := dumpStacks(hangTargets(e.ch, g, knownSilent(v), e.o.Spec.LogDir), e.log); len(files) > 0 {
		e.log.Warn("workers made no progress for half the hang timeout (or the start-up timeout) before the round failed; stacks dumped", "round", r.Number, "stacks", strings.Join(files, ","))
	}
}

// dumpStacks has every target with a stacks file dump its Python stacks
// there, and waits (stacksWait at most) until each file has grown. It
// returns the files written.
func dumpStacks(targets []control.Heartbeat, log *slog.Logger) []string {
	type dump struct {
		file string
		size int64
	}
	var pending []dump
	for _, b := range targets {
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
	started := time.Now()
	in := watchHangWith(wctx, o, func() hangView {
		// The channel keeps every attempt's heartbeats (no rounds): the
		// local ranks that sent any are known to call the helper.
		seen := map[int]bool{}
		for _, b := range ch.Heartbeats() {
			seen[b.Rank] = true
		}
		beats, silent := roundWorkers(ch, g, o.Spec.NProcPerNode, 0, func(lr int) bool { return seen[lr] })
		return hangView{Timeout: o.HangTimeout, Now: time.Now(), Beats: beats,
			StartupTimeout: o.HangStartupTimeout, Started: started, Silent: silent}
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
	files := dumpStacks(hangTargets(h.ch, g, h.last.Hung, h.o.Spec.LogDir), log)
	detail := hangDetail(h.last, h.o)
	log.Error("workers hung: no heartbeat within "+hangTimeoutFlag(h.last)+"; stacks dumped, restarting all local workers",
		"detail", detail, "stacks", strings.Join(files, ","))
	g.Stop(h.o.ShutdownSignal, h.o.ShutdownTimeout)
	return g.Result()
}

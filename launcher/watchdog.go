package launcher

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The watchdog keeps fencing true when the agent itself cannot act: a
// SIGSTOPped or wedged hyperpodrun can neither notice that its lease is
// lost nor kill its workers, yet another node may be given their ranks once
// the lease expires. So the agent re-executes its own binary as a small
// watchdog process (its own process group, so a stop of the agent's group
// does not stop it) and tells it, over a pipe, which process groups to
// guard and until when: a deadline on CLOCK_MONOTONIC, which is the same
// clock in every process. Each time the agent proves its lease alive it
// moves the deadline (Renew). When the deadline passes while it guards
// groups, the watchdog SIGKILLs them; when the pipe reaches EOF (the agent
// died, by any signal), it SIGKILLs them and exits.
//
// The protocol is one ASCII line per message on the watchdog's stdin:
//
//	d <ns>     the deadline, CLOCK_MONOTONIC nanoseconds
//	g <pgid>   guard a process group
//	r <pgid>   release it (its worker exited)
//	w <base64> the agent's will (SetWill), "w -" to clear it
//
// When the agent dies with a will set, the watchdog kills the guarded
// groups, waits until none of their processes is left, and then hands the
// will to the program's OnAgentDeath hook: the elastic agent's revokes its
// rendezvous lease, so the other nodes need not wait for it to expire (the
// workers it fenced are provably gone).
//
// Before firing, the watchdog reads whatever the pipe still holds, so a
// renewal written before the deadline always counts; the agent therefore
// knows exactly when the watchdog may have fired (Expired).

// watchdogArg is the hidden first argument that makes the program a
// watchdog (see WatchdogMain).
const watchdogArg = "__hyperpodrun-watchdog"

// watchdogExe is the executable re-executed as the watchdog.
const watchdogExe = "/proc/self/exe"

var watchdogCapable atomic.Bool

// agentDeathHook is OnAgentDeath's hook.
var agentDeathHook func(will []byte)

// OnAgentDeath sets what the watchdog does with the agent's will (SetWill)
// once the agent died and the guarded groups are gone. Call it before
// WatchdogMain. The hook runs in the watchdog process and should return
// within a few seconds.
func OnAgentDeath(hook func(will []byte)) { agentDeathHook = hook }

// maxWill bounds the will (encoded, one line).
const maxWill = 48 << 10

// WatchdogMain must be called first in the main function of a program that
// starts workers under a Watchdog (and in TestMain of tests that do). When
// the process was started as a watchdog it runs it and exits; otherwise it
// records that this executable can be re-executed as one, and returns.
func WatchdogMain() {
	if len(os.Args) > 1 && os.Args[1] == watchdogArg {
		os.Exit(runWatchdog(os.Stdin.Fd(), slog.New(slog.NewTextHandler(os.Stderr, nil))))
	}
	watchdogCapable.Store(true)
}

// WatchdogAvailable reports whether WatchdogMain was called, so that
// StartWatchdog can re-execute this program.
func WatchdogAvailable() bool { return watchdogCapable.Load() }

// Watchdog is the agent's handle on its watchdog process.
type Watchdog struct {
	pid    int
	exited chan struct{}

	// pending is the latest deadline asked for (monotonic ns, 0 none);
	// wake tells the writer goroutine about it.
	pending atomic.Int64
	wake    chan struct{}
	done    chan struct{}

	mu      sync.Mutex // serialises writes and guards the fields below
	pipe    *os.File
	written int64 // the deadline the watchdog has (may not have read yet)
	err     error // first write error: the watchdog is gone
	closed  bool
	// lapsed: since the last Reset, a deadline passed before the next one
	// was written, so the watchdog may have fired.
	lapsed bool
}

// StartWatchdog re-executes this program as a watchdog process. It guards
// nothing until Guard, and fires only once a deadline was given (Renew).
// WatchdogMain must have been called.
func StartWatchdog() (*Watchdog, error) {
	if !WatchdogAvailable() {
		return nil, errors.New("watchdog: unavailable: the program did not call launcher.WatchdogMain")
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("watchdog: create pipe: %w", err)
	}
	defer r.Close()
	attr := &syscall.ProcAttr{
		// No worker variables (RANK...): the watchdog is not a worker.
		Env:   []string{"GOMAXPROCS=1"},
		Files: []uintptr{r.Fd(), os.Stderr.Fd(), os.Stderr.Fd()},
		// Its own process group: a signal to the agent's group (a stop, a
		// terminal's ^C) does not reach it.
		Sys: &syscall.SysProcAttr{Setpgid: true},
	}
	reap.mu.Lock()
	pid, err := syscall.ForkExec(watchdogExe, []string{"hyperpodrun", watchdogArg, strconv.Itoa(os.Getpid())}, attr)
	reap.mu.Unlock()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("watchdog: start %s: %w", watchdogExe, err)
	}
	wd := &Watchdog{pid: pid, exited: make(chan struct{}), pipe: w, wake: make(chan struct{}, 1), done: make(chan struct{})}
	exit := reap.wait(pid)
	go func() { <-exit; close(wd.exited) }()
	go wd.writer()
	return wd, nil
}

// PID returns the watchdog's process id.
func (w *Watchdog) PID() int { return w.pid }

// Exited is closed when the watchdog process has exited.
func (w *Watchdog) Exited() <-chan struct{} { return w.exited }

// Alive reports whether the watchdog runs and its pipe works.
func (w *Watchdog) Alive() bool {
	select {
	case <-w.exited:
		return false
	default:
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err == nil && !w.closed
}

// Renew moves the deadline to t: guarded groups are killed once t passes
// unless Renew is called again first. It never blocks (it is called from
// the lease keepalive path); a goroutine writes the deadline.
func (w *Watchdog) Renew(t time.Time) {
	w.pending.Store(monoAt(t))
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Guard puts process group pgid under the watchdog. An error means the
// watchdog is gone: the group is not guarded.
func (w *Watchdog) Guard(pgid int) error {
	if pgid <= 1 {
		return fmt.Errorf("watchdog: refusing to guard process group %d", pgid)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// A deadline asked for but not written yet goes first.
	if err := w.flushLocked(); err != nil {
		return err
	}
	return w.writeLocked("g " + strconv.Itoa(pgid) + "\n")
}

// Release takes process group pgid from the watchdog (its worker exited).
func (w *Watchdog) Release(pgid int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writeLocked("r " + strconv.Itoa(pgid) + "\n")
}

// SetWill gives the watchdog what to hand to the OnAgentDeath hook if the
// agent dies (its pipe closes without Disarm); nil clears it.
func (w *Watchdog) SetWill(will []byte) error {
	msg := "w -\n"
	if will != nil {
		enc := base64.StdEncoding.EncodeToString(will)
		if len(enc) > maxWill {
			return fmt.Errorf("watchdog: will of %d bytes is too long", len(will))
		}
		msg = "w " + enc + "\n"
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writeLocked(msg)
}

// Reset forgets that a deadline lapsed: call it when a new worker group
// starts, so Expired speaks of that group only.
func (w *Watchdog) Reset() {
	w.mu.Lock()
	w.lapsed = false
	w.mu.Unlock()
}

// Expired reports whether the watchdog may have killed the groups it
// guarded since the last Reset: a deadline it had passed before a later
// one was written, or the current one has passed. The agent reads a
// worker group's death as fencing, not as a worker failure, when it is.
func (w *Watchdog) Expired() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lapsed || (w.written != 0 && monoNow() >= w.written)
}

// Close closes the pipe: the watchdog kills whatever it still guards and
// exits (the agent's will is withdrawn first: this is not its death).
// Close waits for it up to 2s, then SIGKILLs it.
func (w *Watchdog) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.exited
		return nil
	}
	w.writeLocked("w -\n")
	w.closed = true
	err := w.pipe.Close()
	w.mu.Unlock()
	close(w.done)
	select {
	case <-w.exited:
	case <-time.After(2 * time.Second):
		syscall.Kill(w.pid, syscall.SIGKILL)
		<-w.exited
	}
	if err != nil {
		return fmt.Errorf("watchdog: close pipe: %w", err)
	}
	return nil
}

// writer writes renewed deadlines until Close.
func (w *Watchdog) writer() {
	for {
		select {
		case <-w.done:
			return
		case <-w.wake:
		}
		w.mu.Lock()
		w.flushLocked()
		w.mu.Unlock()
	}
}

// flushLocked writes the pending deadline if the watchdog does not have it.
func (w *Watchdog) flushLocked() error {
	d := w.pending.Load()
	if d == 0 || d == w.written {
		return w.err
	}
	if err := w.writeLocked("d " + strconv.FormatInt(d, 10) + "\n"); err != nil {
		return err
	}
	// The write is complete: the watchdog reads it before it can act on
	// the previous deadline unless that one had already passed.
	if w.written != 0 && monoNow() >= w.written {
		w.lapsed = true
	}
	w.written = d
	return nil
}

func (w *Watchdog) writeLocked(msg string) error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return errors.New("watchdog: closed")
	}
	if _, err := w.pipe.WriteString(msg); err != nil {
		w.err = fmt.Errorf("watchdog: write: %w", err)
		return w.err
	}
	return nil
}

// monoNow is CLOCK_MONOTONIC in nanoseconds: the same clock in every
// process on the machine (Go's time.Now cannot be compared across
// processes).
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// Cannot fail on Linux with a valid clock id and pointer.
		return 0
	}
	return ts.Nano()
}

// monoAt converts t to CLOCK_MONOTONIC nanoseconds (t's own monotonic
// reading is used when it has one).
func monoAt(t time.Time) int64 {
	d := monoNow() + int64(time.Until(t))
	return max(d, 1)
}

// runWatchdog is the watchdog process: it reads messages from fd and kills
// the guarded process groups when the deadline passes or fd reaches EOF.
// It returns the exit code.
func runWatchdog(fd uintptr, log *slog.Logger) int {
	// Terminal signals are the agent's to handle, not ours.
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	agent := os.Getppid()
	if len(os.Args) > 2 {
		agent, _ = strconv.Atoi(os.Args[2])
	}
	s := &watchdogState{log: log.With("watchdog_pid", os.Getpid(), "agent_pid", agent), guarded: map[int]bool{}}
	var (
		buf     = make([]byte, 4096)
		partial []byte
	)
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(pfd, s.pollTimeout())
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			s.killAll("poll failed: " + err.Error())
			return 1
		}
		if n > 0 {
			// Read what the pipe holds before acting on the deadline.
			r, err := unix.Read(int(fd), buf)
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			if r <= 0 {
				s.agentGone(err)
				return 0
			}
			partial = append(partial, buf[:r]...)
			for {
				i := bytes.IndexByte(partial, '\n')
				if i < 0 {
					break
				}
				s.handle(partial[:i])
				partial = partial[i+1:]
			}
			if len(partial) > maxWill+16 {
				partial = partial[:0] // no message is this long
			}
			continue
		}
		if s.deadline != 0 && len(s.guarded) > 0 && monoNow() >= s.deadline {
			late := time.Duration(monoNow() - s.deadline)
			s.killAll(fmt.Sprintf("the agent did not prove its lease alive in time (deadline passed %s ago); it may be stopped or wedged", late.Round(time.Millisecond)))
		}
	}
}

// watchdogState is what the watchdog process knows: the agent's deadline,
// the process groups it guards and the agent's will.
type watchdogState struct {
	log      *slog.Logger
	deadline int64 // 0: none
	guarded  map[int]bool
	will     []byte
}

// pollTimeout is how long to wait for the agent's next message: until the
// deadline while there is one and workers to guard, else forever (-1).
func (s *watchdogState) pollTimeout() int {
	if s.deadline == 0 || len(s.guarded) == 0 {
		return -1
	}
	rem := s.deadline - monoNow()
	if rem <= 0 {
		return 0
	}
	return int((rem + int64(time.Millisecond) - 1) / int64(time.Millisecond))
}

// killAll kills every guarded process group.
func (s *watchdogState) killAll(why string) {
	if len(s.guarded) == 0 {
		return
	}
	pgids := make([]int, 0, len(s.guarded))
	for pgid := range s.guarded {
		syscall.Kill(-pgid, syscall.SIGKILL)
		pgids = append(pgids, pgid)
	}
	clear(s.guarded)
	s.log.Error("hyperpodrun watchdog: killed the workers' process groups (fencing)", "why", why, "pgids", pgids)
}

// agentGone handles the end of the agent's pipe (readErr: the read's error,
// nil at EOF): it kills the guarded groups and, once they are gone after a
// clean EOF, runs the agent's will.
func (s *watchdogState) agentGone(readErr error) {
	why := "the agent exited (its pipe closed)"
	if readErr != nil && !errors.Is(readErr, io.EOF) {
		why = "reading the agent's pipe failed: " + readErr.Error()
	}
	pgids := maps.Clone(s.guarded)
	s.killAll(why)
	if s.will != nil && readErr == nil && agentDeathHook != nil && groupsGone(pgids, 3*time.Second) {
		agentDeathHook(s.will)
	}
}

// handle applies one message from the agent: w (the will, base64, or -),
// d (the deadline), g (guard a process group), r (release one).
func (s *watchdogState) handle(line []byte) {
	op, arg, ok := bytes.Cut(bytes.TrimSpace(line), []byte{' '})
	if !ok || len(op) != 1 {
		s.log.Warn("hyperpodrun watchdog: malformed message", "msg", string(line))
		return
	}
	if op[0] == 'w' {
		if string(arg) == "-" {
			s.will = nil
			return
		}
		b, err := base64.StdEncoding.DecodeString(string(arg))
		if err != nil {
			s.log.Warn("hyperpodrun watchdog: malformed will")
			return
		}
		s.will = b
		return
	}
	n, err := strconv.ParseInt(string(arg), 10, 64)
	if err != nil || n <= 0 {
		s.log.Warn("hyperpodrun watchdog: malformed message", "msg", string(line))
		return
	}
	switch op[0] {
	case 'd':
		s.deadline = n
	case 'g':
		if n > 1 && n <= 1<<22 {
			s.guarded[int(n)] = true
		}
	case 'r':
		delete(s.guarded, int(n))
	default:
		s.log.Warn("hyperpodrun watchdog: unknown message", "msg", string(line))
	}
}

// groupsGone waits up to timeout until no live process is left in any of
// the process groups and reports whether they all went. A zombie counts as
// gone: it runs no code and holds no socket, and its reaper (the dead
// agent's: init, or whoever adopted it) may take its time.
func groupsGone(pgids map[int]bool, timeout time.Duration) bool {
	if len(pgids) == 0 {
		return true
	}
	deadline := time.Now().Add(timeout)
	for {
		if !liveInGroups(pgids) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// liveInGroups reports whether a process that is not a zombie belongs to
// one of the process groups (from /proc/<pid>/stat: state, then pgrp).
func liveInGroups(pgids map[int]bool) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true // cannot tell: not gone
	}
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 3 || string(f[0]) == "Z" || string(f[0]) == "X" {
			continue
		}
		if pg, err := strconv.Atoi(string(f[2])); err == nil && pgids[pg] {
			return true
		}
	}
	return false
}

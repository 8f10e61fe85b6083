package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// exitInfo is a reaped child's status and resource usage.
type exitInfo struct {
	status syscall.WaitStatus
	rusage syscall.Rusage
}

// reaper hands exit statuses to the goroutines waiting for them. By default
// each worker is waited for by pid. After EnableSubreaper it reaps every
// child (wait4(-1)): orphaned grandchildren of workers are re-parented to us
// (or we are PID 1 in a container) and must be reaped too, or they linger as
// zombies.
type reaper struct {
	mu      sync.Mutex
	all     bool
	waiters map[int]chan exitInfo
	early   map[int]exitInfo // reaped before anyone asked
}

var reap = &reaper{waiters: map[int]chan exitInfo{}, early: map[int]exitInfo{}}

// EnableSubreaper makes this process the reaper of its orphaned descendants
// (PR_SET_CHILD_SUBREAPER; as PID 1 it is already) and starts reaping every
// child. Call it once, before starting workers, from a program's main: it
// takes over all child reaping in the process, so code that waits on its
// own children with os/exec must not run in the same process.
func EnableSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil && os.Getpid() != 1 {
		return err
	}
	reap.mu.Lock()
	if reap.all {
		reap.mu.Unlock()
		return nil
	}
	reap.all = true
	reap.mu.Unlock()
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		for {
			reap.reapAll()
			<-ch
		}
	}()
	return nil
}

// reapAll collects every exited child without blocking.
func (r *reaper) reapAll() {
	for {
		var ws syscall.WaitStatus
		var ru syscall.Rusage
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, &ru)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		r.deliver(pid, exitInfo{ws, ru})
	}
}

func (r *reaper) deliver(pid int, info exitInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.waiters[pid]; ok {
		delete(r.waiters, pid)
		ch <- info
		return
	}
	// A worker that exits before wait registers it, or an orphan. Orphans
	// are never claimed; keep the map small by remembering only those whose
	// pid we might still be asked for (bounded by live worker count).
	if len(r.early) < 4096 {
		r.early[pid] = info
	}
}

// wait returns a channel that receives pid's exit status once.
func (r *reaper) wait(pid int) <-chan exitInfo {
	ch := make(chan exitInfo, 1)
	r.mu.Lock()
	all := r.all
	if all {
		if info, ok := r.early[pid]; ok {
			delete(r.early, pid)
			ch <- info
		} else {
			r.waiters[pid] = ch
		}
	}
	r.mu.Unlock()
	if !all {
		go func() {
			for {
				var ws syscall.WaitStatus
				var ru syscall.Rusage
				_, err := syscall.Wait4(pid, &ws, 0, &ru)
				if errors.Is(err, syscall.EINTR) {
					continue
				}
				ch <- exitInfo{ws, ru}
				return
			}
		}()
	}
	return ch
}

// KillOrphans SIGKILLs every remaining child of this process that is not in
// keep: the descendants that outlived their worker (re-parented to us as
// subreaper), so none survives hyperpodrun. It returns once none of them is
// alive (a SIGKILLed process lives on until the kernel schedules its exit,
// which on a loaded machine was long enough to be seen running after
// hyperpodrun had exited) and none was re-parented to us meanwhile (a
// killed orphan's own children), or after 5 s. It returns how many it
// killed.
func KillOrphans(keep map[int]bool) int {
	self := os.Getpid()
	killed := map[int]bool{}
	deadline := time.Now().Add(5 * time.Second)
	for {
		live := 0
		for _, pid := range ChildPIDs(self) {
			if keep[pid] {
				continue
			}
			live++
			if !killed[pid] && syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed[pid] = true
			}
		}
		if live == 0 || time.Now().After(deadline) {
			return len(killed)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ChildPIDs lists the live (non-zombie) children of parent by scanning /proc.
func ChildPIDs(parent int) []int {
	matches, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		// Format: pid (comm) state ppid ...; comm may hold spaces and ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil && ppid == parent {
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(m))); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// Run runs one command to completion with the caller's stdio, through the
// same reaper as workers (safe after EnableSubreaper, unlike os/exec). It
// stops the command with SIGTERM, then SIGKILL, if ctx ends first.
func Run(ctx context.Context, argv []string, env []string) error {
	if len(argv) == 0 {
		return errors.New("run: empty command")
	}
	path, err := lookPath(argv[0])
	if err != nil {
		return err
	}
	if env == nil {
		env = os.Environ()
	}
	attr := &syscall.ProcAttr{
		Env:   env,
		Files: []uintptr{os.Stdin.Fd(), os.Stdout.Fd(), os.Stderr.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	}
	reap.mu.Lock()
	pid, err := syscall.ForkExec(path, argv, attr)
	reap.mu.Unlock()
	if err != nil {
		return fmt.Errorf("start %s: %w", path, err)
	}
	ch := reap.wait(pid)
	var info exitInfo
	select {
	case info = <-ch:
	case <-ctx.Done():
		syscall.Kill(-pid, syscall.SIGTERM)
		select {
		case info = <-ch:
		case <-time.After(5 * time.Second):
			syscall.Kill(-pid, syscall.SIGKILL)
			info = <-ch
		}
	}
	switch ws := info.status; {
	case ws.Signaled():
		return fmt.Errorf("%s killed by %s", argv[0], SignalName(ws.Signal()))
	case ws.ExitStatus() != 0:
		return fmt.Errorf("%s exited with code %d", argv[0], ws.ExitStatus())
	}
	return nil
}

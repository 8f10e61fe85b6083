package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// child is one process the soak started (etcd, a coordinator, a node
// agent), in its own process group so Ctrl-C reaches only the soak.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// pid is the child's process id.
func (c *child) pid() int { return c.cmd.Process.Pid }

// exited reports whether the child has exited (and was waited for).
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// wait waits for the child to exit or ctx to end.
func (c *child) wait(ctx context.Context) error {
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s (pid %d) did not exit: %w", c.name, c.pid(), ctx.Err())
	}
}

// supervisor starts the soak's children with the soak's mark in their
// environment, logs their output to files, and knows which processes are
// its own children (the soak is a child subreaper: orphans of the tree are
// reparented to it, and it reaps the ones that are not its children).
type supervisor struct {
	log    *slog.Logger
	logDir string
	env    []string

	mu       sync.Mutex
	children map[int]*child
	all      []*child
	lines    func(name, line string)
}

func newSupervisor(log *slog.Logger, logDir string, env []string, lines func(name, line string)) *supervisor {
	return &supervisor{log: log, logDir: logDir, env: env, children: map[int]*child{}, lines: lines}
}

// start runs bin with args. Its stdout and stderr go to <logDir>/<name>.log;
// each stdout line is also handed to the supervisor's line callback.
func (s *supervisor) start(name, bin string, args ...string) (*child, error) {
	f, err := os.OpenFile(filepath.Join(s.logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	fmt.Fprintf(f, "==== %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), s.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = f
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	// The lock is held across Start so the reaper never mistakes a
	// just-started child that exits at once for an orphan.
	s.mu.Lock()
	err = cmd.Start()
	if err == nil {
		s.children[cmd.Process.Pid] = c
		s.all = append(s.all, c)
	}
	s.mu.Unlock()
	if err != nil {
		f.Close()
		pw.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(f, line)
			if s.lines != nil {
				s.lines(name, line)
			}
		}
		io.Copy(io.Discard, pr)
	}()
	go func() {
		err := cmd.Wait()
		pw.Close()
		fmt.Fprintf(f, "==== %s exited: %v\n", time.Now().Format(time.RFC3339Nano), err)
		f.Close()
		s.mu.Lock()
		delete(s.children, cmd.Process.Pid)
		s.mu.Unlock()
		close(c.done)
	}()
	s.log.Debug("started", "name", name, "pid", cmd.Process.Pid)
	return c, nil
}

// isChild reports whether pid is a child the supervisor started and has
// not yet waited for.
func (s *supervisor) isChild(pid int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.children[pid] != nil
}

// reapOrphans waits for zombies reparented to the soak that are not its own
// children (their parents died; the soak is their subreaper).
func (s *supervisor) reapOrphans(self int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range listPIDs() {
		if s.children[p] != nil {
			continue
		}
		st, err := readStat(p)
		if err != nil || st.ppid != self || st.state != 'Z' {
			continue
		}
		var ws syscall.WaitStatus
		syscall.Wait4(p, &ws, syscall.WNOHANG, nil)
	}
}

// stop asks a child to stop (SIGTERM to its process group), then SIGKILLs
// the group after grace, and waits for it.
func (s *supervisor) stop(c *child, grace time.Duration) {
	if c.exited() {
		return
	}
	syscall.Kill(-c.pid(), syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
		return
	case <-t.C:
	}
	s.log.Warn("did not stop in time; SIGKILL", "name", c.name, "pid", c.pid(), "grace", grace)
	syscall.Kill(-c.pid(), syscall.SIGKILL)
	<-c.done
}

// live lists the children not yet exited, newest first.
func (s *supervisor) live() []*child {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*child
	for i := len(s.all) - 1; i >= 0; i-- {
		if !s.all[i].exited() {
			out = append(out, s.all[i])
		}
	}
	return out
}

// procStat is what the soak reads of /proc/<pid>/stat.
type procStat struct {
	state     byte
	ppid      int
	pgrp      int
	startTime uint64 // clock ticks after boot
}

func listPIDs() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	out := make([]int, 0, len(ents))
	for _, e := range ents {
		if p, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, p)
		}
	}
	sort.Ints(out)
	return out
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return procStat{}, errors.New("short stat")
	}
	ppid, _ := strconv.Atoi(f[1])
	pgrp, _ := strconv.Atoi(f[2])
	start, _ := strconv.ParseUint(f[19], 10, 64)
	return procStat{state: f[0][0], ppid: ppid, pgrp: pgrp, startTime: start}, nil
}

// readEnviron returns a process's environment as a map ("" values kept).
func readEnviron(pid int) (map[string]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, kv := range strings.Split(string(b), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env, nil
}

func readCmdline(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// setSubreaper makes the soak the reaper of its orphaned descendants, so an
// orphan of the tree is seen (its parent becomes the soak) and can be
// cleaned up, instead of vanishing under PID 1.
func setSubreaper() error {
	const prSetChildSubreaper = 36
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); e != 0 {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", e)
	}
	return nil
}

// output runs a short-lived command (elasticctl) as a registered child, so
// the orphan reaper leaves its exit status to cmd.Wait, and returns its
// standard output.
func (s *supervisor) output(cmd *exec.Cmd) ([]byte, error) {
	var out strings.Builder
	cmd.Stdout = &out
	s.mu.Lock()
	err := cmd.Start()
	var pid int
	if err == nil {
		pid = cmd.Process.Pid
		s.children[pid] = &child{name: filepath.Base(cmd.Path), cmd: cmd}
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	err = cmd.Wait()
	s.mu.Lock()
	delete(s.children, pid)
	s.mu.Unlock()
	return []byte(out.String()), err
}

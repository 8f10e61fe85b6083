package jobrunner

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Containment keeps every process of one run of a job's hyperpodrun
// together, so that all of them die when that hyperpodrun does: its
// workers, and their descendants even when they changed process group or
// session (daemonized).
//
// Where the node has a writable cgroup v2 hierarchy, each run gets its own
// cgroup, hyperpodrun is cloned straight into it (CLONE_INTO_CGROUP, so
// nothing it forks can start outside), and when hyperpodrun exits the whole
// cgroup is killed (cgroup.kill, or freeze + SIGKILL of each member on
// kernels without it) and removed.
//
// Elsewhere the runner falls back to the process tree: the agent becomes a
// child subreaper (orphans of a job are reparented to it, not to init), and
// every process that carries the run's marker in its environment
// (MarkerEnv, inherited from hyperpodrun) or lives in hyperpodrun's session
// is SIGKILLed, repeatedly until none is left; the orphans reparented to
// the agent are reaped. A descendant that both left the session and
// scrubbed its environment escapes the fallback; it cannot escape a cgroup.
type containment struct {
	log *slog.Logger
	// cgroupBase is the cgroup v2 directory under which runs get their
	// cgroups; "" when no cgroup is usable.
	cgroupBase string

	mu sync.Mutex
	// adopted are orphans of our runs reparented to this process (the
	// subreaper), to be reaped once they exit.
	adopted map[int]bool
}

// MarkerEnv is set in the environment of each run of a job's hyperpodrun
// (and so of its workers and their descendants) to a value unique to the
// run: the fallback finds the run's processes by it.
const MarkerEnv = "HYPERPODRUN_AGENT_RUN"

// NoCgroup, as Config.CgroupParent, makes the runner contain jobs without
// cgroups (the subreaper fallback).
const NoCgroup = "none"

var (
	subreaperOnce sync.Once
	subreaping    atomic.Bool // this process is a child subreaper
)

// newContainment picks how runs are contained: under parent (a cgroup v2
// directory; "" finds the agent's own cgroup on the cgroup2 mount; NoCgroup
// never uses cgroups), else the subreaper fallback.
func newContainment(parent string, log *slog.Logger) *containment {
	c := &containment{log: log, adopted: map[int]bool{}}
	if parent != NoCgroup {
		base, err := cgroupBase(parent)
		if err == nil {
			c.cgroupBase = base
			log.Info("jobs are contained in cgroups", "cgroup", base)
			return c
		}
		log.Info("no usable cgroup v2: jobs are contained by process tree (subreaper)", "err", err)
	}
	c.subreaper()
	return c
}

// subreaper makes this process the child subreaper of its descendants
// (once): the fallback then finds and reaps a run's orphans.
func (c *containment) subreaper() {
	subreaperOnce.Do(func() {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			c.log.Warn("cannot become a child subreaper: orphans of jobs go to init", "err", err)
			return
		}
		subreaping.Store(true)
	})
}

// cgroupBase makes (or finds) the directory under which this agent process
// makes its runs' cgroups: parent, or the agent's own cgroup on the
// cgroup2 mount, plus "hyperpod-agent-<pid>".
func cgroupBase(parent string) (string, error) {
	if parent == "" {
		mnt, err := cgroup2Mount()
		if err != nil {
			return "", err
		}
		self, err := ownCgroup()
		if err != nil {
			return "", err
		}
		parent = filepath.Join(mnt, self)
	}
	if _, err := os.Stat(filepath.Join(parent, "cgroup.procs")); err != nil {
		return "", fmt.Errorf("%s is not a cgroup v2 directory: %w", parent, err)
	}
	base := filepath.Join(parent, "hyperpod-agent-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(base, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("make cgroup %s: %w", base, err)
	}
	return base, nil
}

// cgroup2Mount returns where the cgroup v2 hierarchy is mounted.
func cgroup2Mount() (string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read mountinfo: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint options... - fstype source super
		pre, post, ok := strings.Cut(line, " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		if f := strings.Fields(pre); len(f) >= 5 {
			return unescapeMount(f[4]), nil
		}
	}
	return "", errors.New("no cgroup2 mount")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownCgroup returns this process's cgroup v2 path ("0::<path>").
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("read own cgroup: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("this process has no cgroup v2 path")
}

// box is one run's containment.
type box struct {
	c      *containment
	marker string   // MarkerEnv's value for the run
	cg     string   // the run's cgroup directory, "" if none
	fd     *os.File // cg, opened for CLONE_INTO_CGROUP
	leader int      // hyperpodrun's pid
}

// open prepares a run's containment; name is unique to the run.
func (c *containment) open(name string) *box {
	b := &box{c: c, marker: name}
	if c.cgroupBase == "" {
		return b
	}
	cg := filepath.Join(c.cgroupBase, name)
	if err := os.Mkdir(cg, 0o755); err != nil {
		c.log.Warn("cannot make the run's cgroup: contained by process tree", "cgroup", cg, "err", err)
		c.subreaper()
		return b
	}
	fd, err := os.Open(cg)
	if err != nil {
		c.log.Warn("cannot open the run's cgroup: contained by process tree", "cgroup", cg, "err", err)
		os.Remove(cg)
		c.subreaper()
		return b
	}
	b.cg, b.fd = cg, fd
	return b
}

// apply makes the process start inside the run's cgroup.
func (b *box) apply(attr *syscall.SysProcAttr) {
	if b.fd != nil {
		attr.UseCgroupFD = true
		attr.CgroupFD = int(b.fd.Fd())
	}
}

// noCloneIntoCgroup drops CLONE_INTO_CGROUP (a kernel or seccomp profile
// without clone3): hyperpodrun is moved into its cgroup just after it
// starts instead (see started).
func (b *box) noCloneIntoCgroup(attr *syscall.SysProcAttr) {
	attr.UseCgroupFD, attr.CgroupFD = false, 0
	if b.fd != nil {
		b.fd.Close()
		b.fd = nil
	}
}

// started records hyperpodrun's pid; where it was not cloned into its
// cgroup it is moved there now (before it has started any worker: it forks
// them only after a rendezvous round).
func (b *box) started(pid int, cloned bool) {
	b.leader = pid
	if b.fd != nil {
		b.fd.Close()
		b.fd = nil
	}
	if b.cg == "" || cloned {
		return
	}
	if err := os.WriteFile(filepath.Join(b.cg, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		b.c.log.Warn("cannot move hyperpodrun into its cgroup: contained by process tree", "cgroup", b.cg, "err", err)
		os.Remove(b.cg)
		b.cg = ""
		b.c.subreaper()
	}
}

// abandon releases a run that never started.
func (b *box) abandon() {
	if b.fd != nil {
		b.fd.Close()
		b.fd = nil
	}
	if b.cg != "" {
		os.Remove(b.cg)
	}
}

// killTimeout bounds how long the end of a run waits for its processes to
// be gone.
const killTimeout = 10 * time.Second

// kill SIGKILLs every process of the run that is still alive and waits
// (up to killTimeout) for them to be gone, then removes the run's cgroup.
// It is called once hyperpodrun has exited but before it is reaped, so its
// pid (and session id) cannot be reused meanwhile.
func (b *box) kill() error {
	if b.cg != "" {
		// Under a subreaper (the fallback is on for other runs) the
		// killed orphans are this process's to reap.
		var members map[int]bool
		if subreaping.Load() {
			members = cgroupMembers(b.cg, b.leader)
		}
		err := killCgroup(b.cg)
		if err == nil {
			b.c.mu.Lock()
			b.c.reap(members)
			b.c.mu.Unlock()
			return nil
		}
		b.c.log.Warn("cannot kill the run's cgroup: falling back to the process tree", "cgroup", b.cg, "err", err)
		b.c.subreaper()
	}
	return b.c.killTree(b.leader, b.marker)
}

// killCgroup kills every process in cg, waits until it is empty and
// removes it.
func killCgroup(cg string) error {
	deadline := time.Now().Add(killTimeout)
	err := os.WriteFile(filepath.Join(cg, "cgroup.kill"), []byte("1"), 0o644)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kill cgroup %s: %w", cg, err)
	}
	legacy := err != nil // a kernel before 5.14: freeze, kill each, thaw
	for {
		if legacy {
			if err := killMembers(cg); err != nil {
				return err
			}
		}
		populated, err := cgroupPopulated(cg)
		if err != nil {
			return err
		}
		if !populated {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still has processes after %v", cg, killTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// An emptied cgroup can take a moment to become removable.
	for {
		err := os.Remove(cg)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", cg, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// killMembers freezes cg (so nothing forks meanwhile), SIGKILLs each of
// its processes and thaws it (the frozen killed processes die on thaw).
func killMembers(cg string) error {
	freeze := filepath.Join(cg, "cgroup.freeze")
	frozen := os.WriteFile(freeze, []byte("1"), 0o644) == nil
	b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("list cgroup %s: %w", cg, err)
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if frozen {
		os.WriteFile(freeze, []byte("0"), 0o644)
	}
	return nil
}

// cgroupMembers lists the processes in cg but leader.
func cgroupMembers(cg string, leader int) map[int]bool {
	out := map[int]bool{}
	b, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != leader {
			out[pid] = true
		}
	}
	return out
}

// cgroupPopulated reads whether cg (or a cgroup below it) has a process.
func cgroupPopulated(cg string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(cg, "cgroup.events"))
	if err != nil {
		return false, fmt.Errorf("read %s/cgroup.events: %w", cg, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "populated "); ok {
			return v != "0", nil
		}
	}
	return false, fmt.Errorf("%s/cgroup.events has no populated line", cg)
}

// close removes the agent's cgroup directory (it fails harmlessly while
// another runner of this process still has runs in it).
func (c *containment) close() {
	if c.cgroupBase != "" {
		os.Remove(c.cgroupBase)
	}
}

// procInfo is what the fallback reads of a process.
type procInfo struct {
	pid, ppid, sid int
	zombie         bool
}

// readProc reads /proc/<pid>/stat.
func readProc(pid int) (procInfo, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procInfo{}, false
	}
	// pid (comm) state ppid pgrp session ...; comm may hold spaces and ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procInfo{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 {
		return procInfo{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	sid, _ := strconv.Atoi(f[3])
	return procInfo{pid: pid, ppid: ppid, sid: sid, zombie: f[0] == "Z" || f[0] == "X"}, true
}

// hasMarker reports whether pid's environment holds MarkerEnv=marker.
func hasMarker(pid int, marker string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	want := []byte(MarkerEnv + "=" + marker)
	for _, kv := range bytes.Split(b, []byte{0}) {
		if bytes.Equal(kv, want) {
			return true
		}
	}
	return false
}

// pids lists every process.
func pids() []int {
	ents, _ := os.ReadDir("/proc")
	out := make([]int, 0, len(ents))
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// killTree is the fallback: it SIGKILLs every live process in leader's
// session or carrying marker, until a scan finds none (up to
// killTimeout), and reaps those reparented to this process.
func (c *containment) killTree(leader int, marker string) error {
	self := os.Getpid()
	deadline := time.Now().Add(killTimeout)
	killed := map[int]bool{}
	for {
		found := 0
		for _, pid := range pids() {
			if pid == self || pid == leader {
				continue
			}
			p, ok := readProc(pid)
			if !ok || p.zombie {
				continue
			}
			if p.sid == leader || hasMarker(pid, marker) {
				syscall.Kill(pid, syscall.SIGKILL)
				killed[pid] = true
				found++
			}
		}
		c.mu.Lock()
		c.reap(killed)
		c.mu.Unlock()
		if found == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d process(es) of the run still alive after %v", found, killTimeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The last ones killed may not yet be zombies of ours; reap them too.
	for len(killed) > 0 && time.Now().Before(deadline) {
		c.mu.Lock()
		c.reap(killed)
		c.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// reap waits for the processes of pids that are children of this process
// (orphans of a run, reparented to the subreaper) once they have exited,
// and forgets those that are gone, here and in c.adopted. The caller holds
// c.mu: every orphan is reaped through here, never twice.
func (c *containment) reap(pids map[int]bool) {
	self := os.Getpid()
	for pid := range pids {
		p, ok := readProc(pid)
		switch {
		case !ok || p.ppid != self && p.zombie:
			delete(pids, pid) // gone, or someone else's to reap
		case p.ppid == self && p.zombie:
			var ws unix.WaitStatus
			if got, _ := unix.Wait4(pid, &ws, unix.WNOHANG, nil); got == pid {
				delete(pids, pid)
				delete(c.adopted, pid)
			}
		}
	}
}

// adopt notes the orphans of a run (marker) now children of this process,
// and reaps the adopted ones that exited: an orphan that exits while its
// job still runs does not stay a zombie of the agent. Only the fallback
// needs this: without the subreaper orphans go to init.
func (c *containment) adopt(markers []string) {
	if !subreaping.Load() {
		return
	}
	self := os.Getpid()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, pid := range pids() {
		if c.adopted[pid] {
			continue
		}
		p, ok := readProc(pid)
		if !ok || p.ppid != self || p.zombie {
			continue
		}
		for _, m := range markers {
			if hasMarker(pid, m) {
				c.adopted[pid] = true
				break
			}
		}
	}
	c.reap(c.adopted)
}

// waitExited blocks until pid has exited, without reaping it: its pid and
// session id stay reserved while the rest of its run is killed.
func waitExited(pid int) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

package ctrdtest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The start and cleanup of a private containerd, shared with package
// kubetest's kubelets: a test that stopped half-way must leave no container process,
// mount or directory behind. A container outlives containerd and its
// shim, so its processes are found and killed by their ancestry.

// ContainerProcesses lists the processes of the containers of a private
// containerd whose directories are under dir: each shim (a process whose
// command line names containerd-shim and a path under dir, its socket's)
// and all its descendants,
// the containers' processes.
func ContainerProcesses(dir string) []int {
	children := map[int][]int{}
	var shims []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok {
			children[st.ppid] = append(children[st.ppid], pid)
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil &&
			strings.Contains(string(b), "containerd-shim") && strings.Contains(string(b), dir+"/") {
			shims = append(shims, pid)
		}
	}
	var out []int
	var walk func(int)
	walk = func(p int) {
		out = append(out, p)
		for _, c := range children[p] {
			walk(c)
		}
	}
	for _, s := range shims {
		walk(s)
	}
	return out
}

// KillContainers SIGKILLs ContainerProcesses(dir) (a container whose init
// dies takes every process of its PID namespace with it, while one whose
// shim alone dies would run on) and returns the processes it killed.
func KillContainers(dir string) []int {
	procs := ContainerProcesses(dir)
	for _, p := range procs {
		syscall.Kill(p, syscall.SIGKILL)
	}
	return procs
}

// Survivors waits up to within for procs to be gone (or zombies) and
// returns those still alive then (none: nil).
func Survivors(procs []int, within time.Duration) []int {
	deadline := time.Now().Add(within)
	for {
		left := alive(procs)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// alive are the pids of procs that still exist and are not zombies.
func alive(procs []int) []int {
	var out []int
	for _, p := range procs {
		if st, ok := readStat(p); ok && st.state != "Z" {
			out = append(out, p)
		}
	}
	return out
}

type procStat struct {
	state string
	ppid  int
}

// readStat reads a process's state and parent from /proc/<pid>/stat.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, false
	}
	// pid (comm) state ppid ...: comm may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procStat{}, false
	}
	var st procStat
	if _, err := fmt.Sscanf(string(b[i+1:]), " %s %d", &st.state, &st.ppid); err != nil {
		return procStat{}, false
	}
	return st, true
}

// UnmountUnder lazily unmounts every mount below dir, deepest first: what
// a killed shim left mounted (a container's rootfs), before dir is
// removed.
func UnmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mounts = append(mounts, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, m := range mounts {
		syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// WaitForSocket waits up to within for a daemon's unix socket (a
// containerd's address) to accept a connection. It fails when the daemon
// exits first (exited is closed) or the time passes.
func WaitForSocket(address string, exited <-chan struct{}, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		if c, err := net.Dial("unix", address); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before %s answered", address)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("socket %s did not answer in %v", address, within)
		}
	}
}

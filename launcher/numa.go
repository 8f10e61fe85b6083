package launcher

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// NUMA binding modes of torch 2.x's --numa-binding.
const (
	NUMANode        = "node"         // the CPUs of the rank's NUMA node
	NUMASocket      = "socket"       // the CPUs of every node of the rank's socket
	NUMAExclusive   = "exclusive"    // a disjoint share of the node's CPUs per rank
	NUMACoreComplex = "core-complex" // the CPUs sharing one L3 cache (AMD CCX) in the node
)

// SysfsRoot is where the CPU and NUMA topology is read from
// (<root>/devices/system/node, <root>/devices/system/cpu). Tests point it at
// a fixture.
var SysfsRoot = "/sys"

// ParseNUMABinding checks a --numa-binding value; "" means no binding.
func ParseNUMABinding(v string) (string, error) {
	switch v = strings.ToLower(strings.TrimSpace(v)); v {
	case "", NUMANode, NUMASocket, NUMAExclusive, NUMACoreComplex:
		return v, nil
	case "core_complex":
		return NUMACoreComplex, nil
	}
	return "", fmt.Errorf("--numa-binding %q: choose node, socket, exclusive or core-complex", v)
}

// numaNode is one NUMA node: its id and CPUs.
type numaNode struct {
	id   int
	cpus []int
}

// NUMAPlan returns, for each of nproc local ranks, the CPUs it is bound to
// and its NUMA node. Ranks are spread over the nodes in order, in equal
// contiguous blocks (ranks 0-3 on node 0 and 4-7 on node 1 for 8 ranks on 2
// nodes: the usual GPU-to-socket layout).
func NUMAPlan(mode string, nproc int) (cpus [][]int, nodes []int, err error) {
	topo, err := readNodes()
	if err != nil {
		return nil, nil, err
	}
	cpus = make([][]int, nproc)
	nodes = make([]int, nproc)
	onNode := map[int][]int{} // node index -> local ranks on it
	for lr := 0; lr < nproc; lr++ {
		ni := lr * len(topo) / nproc
		onNode[ni] = append(onNode[ni], lr)
		nodes[lr] = topo[ni].id
	}
	for ni, ranks := range onNode {
		n := topo[ni]
		for i, lr := range ranks {
			switch mode {
			case NUMANode:
				cpus[lr] = n.cpus
			case NUMASocket:
				cpus[lr] = socketCPUs(topo, n)
			case NUMAExclusive:
				if len(n.cpus) < len(ranks) {
					return nil, nil, fmt.Errorf("--numa-binding exclusive: NUMA node %d has %d CPUs for %d local ranks; use --numa-binding node", n.id, len(n.cpus), len(ranks))
				}
				per := len(n.cpus) / len(ranks)
				cpus[lr] = n.cpus[i*per : (i+1)*per]
			case NUMACoreComplex:
				groups := l3Groups(n.cpus)
				cpus[lr] = groups[i%len(groups)]
			default:
				return nil, nil, fmt.Errorf("--numa-binding %q: choose node, socket, exclusive or core-complex", mode)
			}
		}
	}
	return cpus, nodes, nil
}

func readNodes() ([]numaNode, error) {
	dirs, _ := filepath.Glob(filepath.Join(SysfsRoot, "devices/system/node/node[0-9]*"))
	var out []numaNode
	for _, d := range dirs {
		id, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "node"))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "cpulist"))
		if err != nil {
			continue
		}
		cpus, err := parseCPUList(string(b))
		if err != nil {
			return nil, fmt.Errorf("numa topology %s: %w", d, err)
		}
		if len(cpus) > 0 {
			out = append(out, numaNode{id, cpus})
		}
	}
	if len(out) == 0 {
		// No NUMA sysfs (a kernel without CONFIG_NUMA): one node, every online CPU.
		b, err := os.ReadFile(filepath.Join(SysfsRoot, "devices/system/cpu/online"))
		if err != nil {
			return nil, fmt.Errorf("--numa-binding: no NUMA topology under %s/devices/system: %w", SysfsRoot, err)
		}
		cpus, err := parseCPUList(string(b))
		if err != nil || len(cpus) == 0 {
			return nil, fmt.Errorf("--numa-binding: cannot read the online CPUs: %v", err)
		}
		out = []numaNode{{0, cpus}}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out, nil
}

func cpuFile(cpu int, rel string) string {
	b, err := os.ReadFile(filepath.Join(SysfsRoot, "devices/system/cpu", "cpu"+strconv.Itoa(cpu), rel))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// socketCPUs is every CPU of the nodes on n's physical package.
func socketCPUs(topo []numaNode, n numaNode) []int {
	pkg := cpuFile(n.cpus[0], "topology/physical_package_id")
	if pkg == "" {
		return n.cpus
	}
	var out []int
	for _, m := range topo {
		if cpuFile(m.cpus[0], "topology/physical_package_id") == pkg {
			out = append(out, m.cpus...)
		}
	}
	sort.Ints(out)
	return out
}

// l3Groups splits cpus by shared L3 cache; one group when unknown.
func l3Groups(cpus []int) [][]int {
	seen := map[string]bool{}
	in := map[int]bool{}
	for _, c := range cpus {
		in[c] = true
	}
	var groups [][]int
	for _, c := range cpus {
		l := cpuFile(c, "cache/index3/shared_cpu_list")
		if l == "" {
			return [][]int{cpus}
		}
		if seen[l] {
			continue
		}
		seen[l] = true
		g, err := parseCPUList(l)
		if err != nil {
			return [][]int{cpus}
		}
		var mine []int
		for _, x := range g {
			if in[x] {
				mine = append(mine, x)
			}
		}
		if len(mine) > 0 {
			groups = append(groups, mine)
		}
	}
	if len(groups) == 0 {
		return [][]int{cpus}
	}
	return groups
}

// parseCPUList parses the kernel's list format: "0-3,8,10-11".
func parseCPUList(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		if part == "" {
			continue
		}
		lo, hi, ranged := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("cpu list %q: %w", s, err)
		}
		b := a
		if ranged {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out, nil
}

// formatCPUList renders CPUs in the kernel's list format.
func formatCPUList(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, strconv.Itoa(cpus[i])+"-"+strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// numactlPath is numactl on PATH, or "" (then sched_setaffinity is used).
func numactlPath() string {
	p, err := exec.LookPath("numactl")
	if err != nil {
		return ""
	}
	return p
}

// forkExecBound runs fork, which starts a process, with this thread's CPU
// affinity set to cpus: the child inherits it from the forking thread, so
// the worker is bound before its first instruction (no window in which it
// could start threads on other CPUs). The thread's mask is restored after.
func forkExecBound(cpus []int, fork func() (int, error)) (int, error) {
	runtime.LockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		return 0, fmt.Errorf("numa binding: read this thread's CPU affinity: %w", err)
	}
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		runtime.UnlockOSThread()
		return 0, fmt.Errorf("numa binding: bind to CPUs %s: %w", formatCPUList(cpus), err)
	}
	pid, err := fork()
	if unix.SchedSetaffinity(0, &old) == nil {
		runtime.UnlockOSThread()
	}
	// Else the thread stays locked to this goroutine: no other goroutine
	// ever runs on the narrowed mask.
	return pid, err
}

package launcher

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// fakeTopology writes a 2-socket, 4-node sysfs: nodes 0,1 on socket 0 and
// 2,3 on socket 1, 4 CPUs per node, an L3 cache per pair of CPUs.
func fakeTopology(t *testing.T) {
	t.Helper()
	root := t.TempDir()
	w := func(rel, v string) {
		p := filepath.Join(root, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for n := 0; n < 4; n++ {
		w("devices/system/node/node"+itoa(n)+"/cpulist", itoa(4*n)+"-"+itoa(4*n+3))
		for c := 4 * n; c < 4*n+4; c++ {
			cpu := "devices/system/cpu/cpu" + itoa(c)
			w(cpu+"/topology/physical_package_id", itoa(n/2))
			lo := c - c%2
			w(cpu+"/cache/index3/shared_cpu_list", itoa(lo)+"-"+itoa(lo+1))
		}
	}
	old := SysfsRoot
	SysfsRoot = root
	t.Cleanup(func() { SysfsRoot = old })
}

func itoa(i int) string { return formatCPUList([]int{i}) }

func TestNUMAPlanModes(t *testing.T) {
	fakeTopology(t)
	for _, tc := range []struct {
		mode  string
		nproc int
		want  [][]int
		nodes []int
	}{
		{NUMANode, 4, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}, []int{0, 1, 2, 3}},
		{NUMASocket, 2, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}, []int{0, 2}},
		{NUMAExclusive, 8, [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}, []int{0, 0, 1, 1, 2, 2, 3, 3}},
		{NUMACoreComplex, 8, [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}, []int{0, 0, 1, 1, 2, 2, 3, 3}},
	} {
		got, nodes, err := NUMAPlan(tc.mode, tc.nproc)
		if err != nil {
			t.Fatalf("%s: %v", tc.mode, err)
		}
		if !reflect.DeepEqual(got, tc.want) || !reflect.DeepEqual(nodes, tc.nodes) {
			t.Errorf("%s x%d: cpus %v nodes %v, want %v %v", tc.mode, tc.nproc, got, nodes, tc.want, tc.nodes)
		}
	}
	if _, _, err := NUMAPlan(NUMAExclusive, 32); err == nil {
		t.Error("exclusive with more ranks than CPUs per node: no error")
	}
	if _, err := ParseNUMABinding("rack"); err == nil {
		t.Error("ParseNUMABinding accepted rack")
	}
}

func TestCPUListRoundTrip(t *testing.T) {
	c, err := parseCPUList("0-3,8,10-11")
	if err != nil || formatCPUList(c) != "0-3,8,10-11" {
		t.Errorf("%v %v %q", c, err, formatCPUList(c))
	}
}

// Without numactl, a worker is bound by the forking thread's affinity: the
// child starts on the given CPUs, and no thread of ours keeps the narrow mask.
func TestForkExecBoundWithoutNumactl(t *testing.T) {
	out := filepath.Join(t.TempDir(), "status")
	var cmd *exec.Cmd
	pid, err := forkExecBound([]int{0}, func() (int, error) {
		cmd = exec.Command("/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status > "+out)
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	})
	if err != nil || pid <= 0 {
		t.Fatalf("forkExecBound: pid %d, %v", pid, err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out)
	if got := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(b)), "Cpus_allowed_list:")); got != "0" {
		t.Errorf("child's CPUs %q, want 0", got)
	}
	tasks, _ := filepath.Glob("/proc/self/task/*/status")
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "Cpus_allowed_list:") && runtime.NumCPU() > 1 && strings.TrimSpace(strings.TrimPrefix(l, "Cpus_allowed_list:")) == "0" {
				t.Errorf("%s kept the narrowed mask: %s", f, l)
			}
		}
	}
}

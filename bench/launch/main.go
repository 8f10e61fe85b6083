// Command launch measures launching 4 no-op workers (--no-python /bin/true)
// with hyperpodrun and with torchrun in the same run: median wall time and
// peak RSS (largest process of each launcher's tree, from wait4), and prints
// BENCH lines with torchrun as the anchor.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"syscall"
	"time"
)

func main() {
	hpr := flag.String("hyperpodrun", "bin/hyperpodrun", "hyperpodrun binary")
	python := flag.String("python", "/usr/bin/python3", "Python with torch, for torchrun")
	runs := flag.Int("runs", 15, "hyperpodrun runs")
	trRuns := flag.Int("torchrun-runs", 5, "torchrun runs")
	flag.Parse()

	_, file, _, _ := runtime.Caller(0)
	shim := filepath.Join(filepath.Dir(file), "..", "torchrun", "torchrun_py311.py")
	logs, _ := os.MkdirTemp("", "launch-bench-")
	defer os.RemoveAll(logs)

	hw, hr, err := measure(*runs, *hpr, "--standalone", "--nproc-per-node", "4", "--log-dir", logs, "--no-python", "/bin/true")
	if err != nil {
		fmt.Fprintf(os.Stderr, "hyperpodrun: %v\n", err)
		os.Exit(1)
	}
	tw, tr, err := measure(*trRuns, *python, shim, "--standalone", "--nproc_per_node", "4", "--log_dir", logs, "--no_python", "/bin/true")
	if err != nil {
		fmt.Printf("# torchrun could not run (%v): no anchor\n", err)
		fmt.Printf("BENCH launch4_wall_hyperpodrun %.4f s target=0.092\n", hw.Seconds())
		fmt.Printf("BENCH launch4_peak_rss_hyperpodrun %.1f MiB target=25\n", hr)
		return
	}
	fmt.Printf("# 4 no-op workers (--no-python /bin/true), median of %d (hyperpodrun) and %d (torchrun) runs\n", *runs, *trRuns)
	fmt.Printf("BENCH launch4_wall_hyperpodrun %.4f s anchor=%.3f target=%.4f\n", hw.Seconds(), tw.Seconds(), tw.Seconds()/20)
	fmt.Printf("BENCH launch4_wall_ratio %.1f x anchor=1 target=20\n", tw.Seconds()/hw.Seconds())
	fmt.Printf("BENCH launch4_peak_rss_hyperpodrun %.1f MiB anchor=%.1f target=25\n", hr, tr)
}

// measure runs argv n times and returns the median wall time and the
// median peak RSS in MiB.
func measure(n int, argv ...string) (time.Duration, float64, error) {
	var walls []time.Duration
	var rss []float64
	for i := 0; i < n; i++ {
		cmd := exec.Command(argv[0], argv[1:]...)
		start := time.Now()
		out, err := cmd.CombinedOutput()
		if err != nil {
			return 0, 0, fmt.Errorf("%v: %v\n%s", argv, err, out)
		}
		walls = append(walls, time.Since(start))
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		rss = append(rss, float64(ru.Maxrss)/1024)
	}
	sort.Slice(walls, func(i, j int) bool { return walls[i] < walls[j] })
	sort.Float64s(rss)
	return walls[n/2], rss[n/2], nil
}

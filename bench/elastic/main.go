// Command elastic measures hyperpodrun's elastic behaviour with real
// PyTorch DDP (gloo) on three nodes on this machine, against embedded etcd:
//
//   - recovery: one node SIGKILLed, seconds until a survivor logs a step at
//     world size 2 (torchrun with its etcd backend: 39 s here, DESIGN.md);
//   - scale-up: a third node starts next to two, seconds until a step at
//     world size 3 (torchrun: 11.3 s here);
//   - resize overhead: target 3 -> 2 written to etcd, time until all new
//     workers are started, minus the workers' own checkpoint+exit time
//     (logged by each agent) - the agent's own overhead (target 200 ms);
//   - issue 14, with --inprocess-resize, each against the process-restart
//     path measured in the same run (anchor=): planned resize downtime
//     (target 3 -> 2: the last step at world size 3 to the first at 2),
//     node SIGKILLed -> survivors stepping again, node added -> first step
//     at the larger size, and the survivors' downtime when a node is added
//     (their last step at 2 to the first at 3): in process the joining node
//     prewarms its workers (they import torch before it registers), so the
//     survivors stop only once the new worker is ready.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/testcluster"
)

func main() {
	hpr := flag.String("hyperpodrun", "bin/hyperpodrun", "hyperpodrun binary")
	runs := flag.Int("runs", 5, "runs per figure (median reported)")
	anchors := flag.Bool("torchrun", true, "also measure torchrun (etcd rendezvous) as the anchor, once")
	inprocess := flag.Bool("inprocess", true, "also measure --inprocess-resize (issue 14) against the restart path")
	flag.Parse()
	py := testcluster.TorchPython()
	if py == "" {
		fmt.Println("# bench/elastic skipped: PyTorch is not installed (apt-get install python3-torch)")
		return
	}
	if _, err := os.Stat(*hpr); err != nil {
		fail("hyperpodrun binary %s: %v (run make build)", *hpr, err)
	}
	ctx := context.Background()
	srv, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		fail("%v", err)
	}
	defer srv.Close()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "examples", "pytorch", "train_elastic.py")

	var rec, up, over []float64
	var own []float64
	var down, ipDown, ipRec, ipUp, upDown, ipUpDown []float64
	prewarmed := 0
	ep := srv.Endpoints[0]
	for i := 0; i < *runs; i++ {
		rec = append(rec, recovery(*hpr, py, script, ep, fmt.Sprintf("rec%d", i)))
		u, d := scaleUpDowntime(*hpr, py, script, ep, fmt.Sprintf("up%d", i))
		up, upDown = append(up, u), append(upDown, d)
		o, w := resizeOverhead(*hpr, py, script, ep, fmt.Sprintf("rs%d", i))
		over, own = append(over, o), append(own, w)
		if *inprocess {
			down = append(down, resizeDowntime(*hpr, py, script, ep, fmt.Sprintf("dt%d", i)))
			ipDown = append(ipDown, resizeDowntime(*hpr, py, script, ep, fmt.Sprintf("ipdt%d", i), inprocessFlag))
			ipRec = append(ipRec, recovery(*hpr, py, script, ep, fmt.Sprintf("iprec%d", i), inprocessFlag))
			u, d := scaleUpDowntime(*hpr, py, script, ep, fmt.Sprintf("ipup%d", i), inprocessFlag)
			ipUp, ipUpDown = append(ipUp, u), append(ipUpDown, d)
			if lastPrewarmed {
				prewarmed++
			}
		}
	}
	recAnchor, upAnchor, source := 39.0, 11.3, "torchrun with its etcd backend, measured here (DESIGN.md)"
	if *anchors {
		if r, u, err := torchrunAnchors(py, script); err != nil {
			fmt.Printf("# torchrun anchors not measured (%v): using DESIGN.md's\n", err)
		} else {
			recAnchor, upAnchor, source = r, u, "torchrun (torch's etcd rendezvous on etcd 3.4 --enable-v2), measured in this run"
		}
	}
	fmt.Printf("# real PyTorch DDP (gloo), 3 nodes of 1 worker on one machine, median of %d runs; anchors: %s\n", *runs, source)
	// Restarts vary by about 1 s: torch's TCPStore client retries its
	// connect on a 1 s grid, so a worker that comes up before rank 0's
	// store is listening waits for the next try.
	fmt.Printf("# samples (s): recovery %s; scale-up %s\n", samples(rec), samples(up))
	fmt.Printf("BENCH recovery_sigkill_to_step_ws2 %.2f s anchor=%.1f target=5\n", median(rec), recAnchor)
	fmt.Printf("BENCH scaleup_start_to_step_ws3 %.2f s anchor=%.1f target=4\n", median(up), upAnchor)
	fmt.Printf("# resize 3->2: workers' own checkpoint+exit %.0f ms (median), excluded from the overhead\n", median(own))
	fmt.Printf("BENCH resize_agent_overhead %.0f ms target=200\n", median(over))
	if *inprocess {
		fmt.Printf("# issue 14, --inprocess-resize against the process-restart path in this run (anchor=), median of %d [min-max]:\n", *runs)
		fmt.Printf("#   planned resize 3->2 downtime: in process %s; restart %s\n", spread(ipDown), spread(down))
		fmt.Printf("#   node SIGKILLed -> step at ws 2: in process %s; restart %s\n", spread(ipRec), spread(rec))
		fmt.Printf("#   node added -> step at ws 3: in process %s; restart %s\n", spread(ipUp), spread(up))
		fmt.Printf("#   node added: survivors' last step at ws 2 -> first at ws 3: in process (joining node prewarmed in %d of %d runs) %s; restart %s\n",
			prewarmed, *runs, spread(ipUpDown), spread(upDown))
		fmt.Printf("BENCH inprocess_resize_downtime_ws3_to_ws2 %.2f s anchor=%.2f target=1\n", median(ipDown), median(down))
		fmt.Printf("BENCH inprocess_recovery_sigkill_to_step_ws2 %.2f s anchor=%.2f target=1.5\n", median(ipRec), median(rec))
		fmt.Printf("BENCH inprocess_scaleup_start_to_step_ws3 %.2f s anchor=%.2f target=2\n", median(ipUp), median(up))
		// A scale-up is a planned resize too. In process the joining node's
		// workers start (Python, import torch) before it registers, so the
		// survivors no longer wait for them; the restart path's do.
		fmt.Printf("BENCH inprocess_scaleup_downtime_ws2_to_ws3 %.2f s anchor=%.2f target=1\n", median(ipUpDown), median(upDown))
	}
}

// inprocessFlag is hyperpodrun's flag for issue 14's in-process resize.
const inprocessFlag = "--inprocess-resize"

// spread renders samples as "median [min-max] (a b c ...)".
func spread(xs []float64) string {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return fmt.Sprintf("%.2f s [%.2f-%.2f] (%s)", median(xs), s[0], s[len(s)-1], samples(xs))
}

// resizeDowntime writes target 3 -> 2 and returns the seconds from the
// last step at world size 3 to the first at world size 2 (rank 0's step
// lines, whichever node prints them).
func resizeDowntime(hpr, py, script, ep, job string, extra ...string) float64 {
	c := cluster(hpr, py, script, ep, job, extra...)
	defer c.KillAll()
	startAll(c, "a", "b", "c")
	must(c.WaitStep(120*time.Second, time.Time{}, func(s testcluster.Step) bool { return s.World == 3 && s.Step >= 8 }))
	t0 := time.Now()
	if err := setTarget(ep, job, 2); err != nil {
		fail("%v", err)
	}
	first := must(c.WaitStep(60*time.Second, t0, func(s testcluster.Step) bool { return s.World == 2 }))
	var last time.Time
	for _, s := range c.Steps() {
		if s.World == 3 && s.At.Before(first.At) && s.At.After(last) {
			last = s.At
		}
	}
	return first.At.Sub(last).Seconds()
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench/elastic: "+format+"\n", a...)
	os.Exit(1)
}

func samples(xs []float64) string {
	var b strings.Builder
	for i, x := range xs {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%.2f", x)
	}
	return b.String()
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func cluster(hpr, py, script, ep, job string, extra ...string) *testcluster.Cluster {
	ckpt, _ := os.MkdirTemp("", "bench-ckpt-")
	fmt.Fprintf(os.Stderr, "# %s\n", job)
	args := append([]string{"--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "etcd", "--rdzv-endpoint", ep,
		"--rdzv-id", job, "--rdzv-conf", "last_call_timeout=1", "--graceful-timeout", "20",
		"--local-addr", "127.0.0.1"}, extra...)
	args = append(args, script, "--steps", "100000", "--ckpt-dir", ckpt, "--ckpt-every", "5", "--step-time", "0.05")
	current = testcluster.New(hpr, []string{"PYTHON_EXEC=" + py}, args...)
	return current
}

// current is the cluster being measured, for its logs on failure.
var current *testcluster.Cluster

func must[T any](v T, err error) T {
	if err != nil {
		if current != nil {
			for n, l := range current.Logs() {
				fmt.Fprintf(os.Stderr, "---- %s ----\n%s", n, tail(l, 40))
			}
		}
		fail("%v", err)
	}
	return v
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func startAll(c *testcluster.Cluster, names ...string) {
	for _, n := range names {
		if err := c.Start(n); err != nil {
			fail("%v", err)
		}
	}
}

func recovery(hpr, py, script, ep, job string, extra ...string) float64 {
	c := cluster(hpr, py, script, ep, job, extra...)
	defer c.KillAll()
	startAll(c, "a", "b", "c")
	must(c.WaitStep(120*time.Second, time.Time{}, func(s testcluster.Step) bool { return s.World == 3 && s.Step >= 8 }))
	killed := time.Now()
	c.Kill("c")
	s := must(c.WaitStep(60*time.Second, killed, func(s testcluster.Step) bool { return s.World == 2 }))
	return s.At.Sub(killed).Seconds()
}

// scaleUpDowntime starts a third node next to two and returns the seconds
// from its start to the first step at world size 3, and the survivors'
// downtime: their last step at world size 2 to that first step.
func scaleUpDowntime(hpr, py, script, ep, job string, extra ...string) (float64, float64) {
	c := cluster(hpr, py, script, ep, job, extra...)
	defer c.KillAll()
	startAll(c, "a", "b")
	must(c.WaitStep(120*time.Second, time.Time{}, func(s testcluster.Step) bool { return s.World == 2 && s.Step >= 8 }))
	started := time.Now()
	startAll(c, "c")
	s := must(c.WaitStep(60*time.Second, started, func(s testcluster.Step) bool { return s.World == 3 }))
	var last time.Time
	for _, x := range c.Steps() {
		if x.World == 2 && x.At.Before(s.At) && x.At.After(last) {
			last = x.At
		}
	}
	lastPrewarmed = false
	for _, l := range c.Lines() {
		if l.Node == "c" && strings.Contains(l.Text, `msg="assigning the prewarmed workers their first round"`) {
			lastPrewarmed = true
		}
	}
	return s.At.Sub(started).Seconds(), s.At.Sub(last).Seconds()
}

// lastPrewarmed says whether the node added by the last scaleUpDowntime
// started its workers before it registered (in process: prewarm).
var lastPrewarmed bool

var tookRE = regexp.MustCompile(`msg="workers stopped for the change".* took_ms=(\d+)`)

// resizeOverhead returns the agent's overhead and the workers' own time, in ms.
func resizeOverhead(hpr, py, script, ep, job string) (float64, float64) {
	c := cluster(hpr, py, script, ep, job)
	defer c.KillAll()
	startAll(c, "a", "b", "c")
	must(c.WaitStep(120*time.Second, time.Time{}, func(s testcluster.Step) bool { return s.World == 3 && s.Step >= 8 }))
	t0 := time.Now()
	if err := setTarget(ep, job, 2); err != nil {
		fail("%v", err)
	}
	must(c.WaitStep(60*time.Second, t0, func(s testcluster.Step) bool { return s.World == 2 }))
	// Only nodes that run in the new round are on the critical path: the
	// node dropped by the shrink also waits for its workers, off the path.
	took := map[string]float64{}
	starts := map[string]time.Time{}
	for _, l := range c.Lines() {
		if l.At.Before(t0) {
			continue
		}
		if m := tookRE.FindStringSubmatch(l.Text); m != nil {
			ms, _ := strconv.ParseFloat(m[1], 64)
			took[l.Node] = ms
		}
		if strings.Contains(l.Text, `msg="starting workers"`) && strings.Contains(l.Text, "world_size=2") {
			starts[l.Node] = l.At
		}
	}
	var workersOwn float64
	var lastStart time.Time
	for n, at := range starts {
		workersOwn = max(workersOwn, took[n])
		if at.After(lastStart) {
			lastStart = at
		}
	}
	total := float64(lastStart.Sub(t0).Milliseconds())
	return total - workersOwn, workersOwn
}

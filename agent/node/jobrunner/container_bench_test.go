package jobrunner

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/agent/node/containers"
	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/internal/ctrdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// BenchmarkContainerRuntime prints the figures (make bench runs it
// with -benchtime=1x):
//   - container_start_to_first_step: from the desired record placing a job
//     on the node to its first training step, containerd runtime (image
//     present), median of 5, beside the process runtime measured the same
//     way in the same run (anchor); target: at most 300 ms more;
//   - container_pull_200mb: pulling and unpacking a 200 MB image from the
//     loopback registry, median of 3.
func BenchmarkContainerRuntime(b *testing.B) {
	ctrd := ctrdtest.StartContainerd(b)
	reg := ctrdtest.StartRegistry(b)
	hpr, worker := staticBinariesTB(b)
	files, err := ctrdtest.BusyboxFiles()
	if err != nil {
		b.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	image, err := reg.Push(ctx, "bench/worker", "v1", ctrdtest.Image{Files: append(files, ctrdtest.File{Path: "bin/worker", Source: worker, Mode: 0o755})})
	if err != nil {
		b.Fatal(err)
	}
	rt, err := containers.Connect(ctx, containers.Config{Address: ctrd.Address, CDIDirs: []string{b.TempDir()}})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	if _, err := rt.Pull(ctx, image); err != nil { // present: the figure is the start, not the pull
		b.Fatal(err)
	}
	srv, cli := etcdtest.Start(b)
	st := fleet.New(cli, "")
	out := &syncBuf{}
	tmp, _ := os.MkdirTemp("", "hpa")
	defer os.RemoveAll(tmp)
	r := New(Config{Hyperpodrun: hpr, Endpoints: srv.Endpoints, Output: out, TempDir: tmp, LogDir: b.TempDir(), AllowRootJobs: true,
		Containers: rt, ContainerHyperpodrun: hpr})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(rctx, nodeagent.Node{Name: "n", Prefix: "/hyperpodrun", Client: cli}); close(done) }()
	defer func() { stop(); <-done }()

	measure := func(name string, run fleet.RunSpec) time.Duration {
		b.Helper()
		if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: name, Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1}, Run: run}); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := st.Place(ctx, fleet.Desired{Allocation: policy.Allocation{Job: name, Size: 1, Nodes: []string{"n"}}, Generation: 1}); err != nil {
			b.Fatal(err)
		}
		want := "n/" + name + " step=1 "
		for !strings.Contains(out.String(), want) {
			if time.Since(start) > time.Minute {
				b.Fatalf("%s: no first step in 1m:\n%s", name, out.String())
			}
			time.Sleep(2 * time.Millisecond)
		}
		took := time.Since(start)
		// Let it finish, and wait for its run (container) to be gone.
		for {
			fin, _, _ := st.Finished(ctx)
			r.mu.Lock()
			_, running := r.jobs[name]
			r.mu.Unlock()
			if _, ok := fin[name]; ok && !running {
				break
			}
			if time.Since(start) > 2*time.Minute {
				b.Fatalf("%s did not finish", name)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return took
	}
	args := []string{"--steps", "3", "--step-time", "1ms"}
	var proc, ctr []time.Duration
	for i := range 5 {
		proc = append(proc, measure(fmt.Sprintf("p%d", i), fleet.RunSpec{Script: worker, NoPython: true, Args: args}))
		ctr = append(ctr, measure(fmt.Sprintf("c%d", i), fleet.RunSpec{Image: image, Script: "/bin/worker", NoPython: true, Args: args}))
	}
	pm, cm := median(proc), median(ctr)
	fmt.Printf("BENCH container_start_to_first_step %.0f ms anchor=%.0f target=%.0f\n", ms(cm), ms(pm), ms(pm)+300)
	fmt.Printf("BENCH container_start_overhead %.0f ms target=300\n", ms(cm-pm))

	// A 200 MB image (one incompressible layer), pulled and unpacked.
	big, err := reg.Push(ctx, "bench/big", "v1", ctrdtest.Image{Files: files, Pad: 200 << 20})
	if err != nil {
		b.Fatal(err)
	}
	var pulls []time.Duration
	for range 3 {
		if err := rt.RemoveImage(ctx, big); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if _, err := rt.Pull(ctx, big); err != nil {
			b.Fatal(err)
		}
		pulls = append(pulls, time.Since(start))
	}
	fmt.Printf("BENCH container_pull_200mb %.2f s\n", median(pulls).Seconds())
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration{}, d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

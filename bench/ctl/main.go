// Command ctl measures elasticctl's wall time on a large fleet: 'get jobs'
// with 10,000 jobs, 'describe job' with 26,000 events in the history, and
// the submit of a 2,000-job file (parse, checks and write), each as a
// separate elasticctl process against an embedded etcd: the median of
// -runs runs after one untimed run (which loads the binary into the page
// cache, as any command run before has). The load average is printed
// with the figures: on a busy machine they are wall times of a share of it.
// A pending job's describe (queue place among 5,000 pending jobs) is shown
// too, without a target.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench/ctl: "+format+"\n", a...)
	os.Exit(1)
}

func main() {
	bin := flag.String("elasticctl", "bin/elasticctl", "elasticctl binary")
	runs := flag.Int("runs", 9, "runs per figure (median reported), after one untimed run")
	jobs := flag.Int("jobs", 10000, "jobs in the fleet")
	events := flag.Int("events", 26000, "events in the history")
	hold := flag.Bool("hold", false, "populate, print the etcd endpoint, and wait for Ctrl-C (to profile elasticctl against it)")
	flag.Parse()
	limit := 10 * time.Minute
	if *hold {
		limit = 24 * time.Hour
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	srv, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		fail("%v", err)
	}
	defer srv.Close()
	cli, err := srv.Client()
	if err != nil {
		fail("%v", err)
	}
	defer cli.Close()
	st := fleet.New(cli, "")
	if err := populate(ctx, st, *jobs, *events); err != nil {
		fail("populate: %v", err)
	}
	ep := srv.Endpoints[0]
	if *hold {
		fmt.Printf("etcd at %s with %d jobs and %d events; Ctrl-C ends\n", ep, *jobs, *events)
		sig, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		<-sig.Done()
		return
	}
	ctl := func(args ...string) time.Duration {
		start := time.Now()
		out, err := exec.CommandContext(ctx, *bin, append([]string{"--etcd-endpoints", ep}, args...)...).CombinedOutput()
		if err != nil {
			fail("elasticctl %v: %v\n%s", args, err, out)
		}
		return time.Since(start)
	}
	median := func(f func(i int) time.Duration) float64 {
		f(*runs) // untimed
		var ds []time.Duration
		for i := range *runs {
			ds = append(ds, f(i))
		}
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Microseconds()) / 1000
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("# bench/ctl: load average %s on %d CPUs\n", strings.Join(strings.Fields(string(b))[:3], " "), runtime.NumCPU())
	}
	fmt.Printf("BENCH elasticctl_get_jobs_10k %.0f ms target=300\n", median(func(int) time.Duration { return ctl("get", "jobs") }))
	fmt.Printf("BENCH elasticctl_describe_job_26k_events %.0f ms target=100\n", median(func(int) time.Duration { return ctl("describe", "job", "job-00042") }))
	// A pending job's describe also finds its place in the queue among the
	// cohort's 5,000 pending jobs and estimates its wait.
	fmt.Printf("BENCH elasticctl_describe_pending_job_10k_jobs %.0f ms\n", median(func(int) time.Duration { return ctl("describe", "job", "job-00043") }))
	dir, err := os.MkdirTemp("", "bench-ctl-")
	if err != nil {
		fail("%v", err)
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "jobs.yaml")
	var b strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&b, "---\nname: file-job-%d\nteam: team-%d\nflavor: nvidia-h100-80gb\nperNode: {accelerators: 8}\nmaxNodes: 1\nrun:\n  script: train.py\n", i, i%5)
	}
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		fail("%v", err)
	}
	// Each run submits the file under a fresh prefix (with the teams):
	// parse, checks, and the write of 2,000 jobs.
	fmt.Printf("BENCH elasticctl_parse_2000_jobs %.0f ms target=1000\n", median(func(i int) time.Duration {
		prefix := fmt.Sprintf("/parse-%d", i)
		ps := fleet.New(cli, prefix)
		for t := range 5 {
			if err := ps.PutTeam(ctx, api.Team{Name: fmt.Sprintf("team-%d", t), Quotas: []api.FlavorQuota{{Flavor: "nvidia-h100-80gb", Nominal: 64}}}); err != nil {
				fail("%v", err)
			}
		}
		return ctl("--etcd-prefix", prefix, "submit", "-f", file)
	}))
}

// populate writes teams, jobs (half running, half pending, with desired
// records and statuses) and events (job-00042 has a long history).
func populate(ctx context.Context, st *fleet.Store, jobs, events int) error {
	var ops []clientv3.Op
	flush := func(force bool) error {
		if len(ops) < fleet.MaxTxnOps && !force || len(ops) == 0 {
			return nil
		}
		_, err := st.Cli.Txn(ctx).Then(ops...).Commit()
		ops = ops[:0]
		return err
	}
	put := func(key string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		ops = append(ops, clientv3.OpPut(key, string(b)))
		return flush(false)
	}
	for t := range 5 {
		if err := put(st.Keys.Team(fmt.Sprintf("team-%d", t)), api.Team{Name: fmt.Sprintf("team-%d", t), Quotas: []api.FlavorQuota{{Flavor: "nvidia-h100-80gb", Nominal: 800}}}); err != nil {
			return err
		}
	}
	base := time.Now().Add(-48 * time.Hour)
	for i := range jobs {
		name := fmt.Sprintf("job-%05d", i)
		team := fmt.Sprintf("team-%d", i%5)
		sub := base.Add(time.Duration(i) * time.Second)
		spec := fleet.JobSpec{Job: api.Job{Name: name, Team: team, Flavor: "nvidia-h100-80gb", PerNode: api.Resources{Accelerators: 8},
			MinNodes: 1, MaxNodes: 4, Elastic: true, SubmitTime: sub}, Run: fleet.RunSpec{Script: "train.py"}}
		if err := put(st.Keys.Spec(team, name), spec); err != nil {
			return err
		}
		r := api.Reason{Job: name, Team: team, Kind: api.KindPending, Code: api.CodeNoCapacity,
			Message: "quota allows it but no nodes are free: the team uses 800 of nominal 800 on nvidia-h100-80gb; the fleet has no free node with 8 accelerators"}
		if i%2 == 0 {
			r = api.Reason{Job: name, Team: team, Kind: api.KindRunning, Code: api.CodeWithinQuota, Message: "running within the team's nominal quota", FromSize: 1, ToSize: 1}
			d := fleet.Desired{Allocation: api.Allocation{Job: name, Team: team, Flavor: "nvidia-h100-80gb", Size: 1, Nodes: []string{fmt.Sprintf("node-%d", i)},
				AcceleratorsPerNode: 8, Since: sub.Add(time.Minute), LastResize: sub.Add(time.Minute)}, Generation: 1, Message: r.Message}
			if err := put(st.Keys.Desired(name), d); err != nil {
				return err
			}
			if i%4 == 0 {
				continue // runs as admitted: no status record (fleet.ImpliedStatus)
			}
		}
		if err := put(st.Keys.Status(name), fleet.Status{Reason: r, Time: sub, Since: sub}); err != nil {
			return err
		}
	}
	for i := range events {
		job := fmt.Sprintf("job-%05d", i%jobs)
		if i%500 == 0 {
			job = "job-00042"
		}
		e := fleet.Event{Time: base.Add(time.Hour + time.Duration(i)*100*time.Millisecond), Reason: api.Reason{Job: job, Kind: api.KindPending, Code: api.CodeNoCapacity, Message: "no nodes are free"}}
		if err := put(st.Keys.Event(e.Time, e.Job), e); err != nil {
			return err
		}
	}
	return flush(true)
}

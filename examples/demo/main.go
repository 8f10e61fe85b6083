// Command demo is the main demo, on an embedded etcd with no setup: the
// coordinator, four node agents with fixture inventories (8 x H100 each),
// two teams and real training workers (PyTorch DDP if installed, else the
// bundled worker). A low-priority elastic job of team research grows into
// the idle fleet; a high-priority job of team prod arrives and takes its
// quota back by shrinking the elastic job through the sync signal (checkpoint,
// no lost step); when prod finishes, the elastic job grows back. It prints a
// timeline and the fleet's utilization.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/agent/jobrunner"
	"github.com/hyperpodrun/hyperpodrun/agent/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

const (
	flavor      = "nvidia-h100-80gb"
	gpusPerNode = 8
	nodes       = 4
)

func main() {
	hpr := flag.String("hyperpodrun", "bin/hyperpodrun", "hyperpodrun binary")
	workerBin := flag.String("worker", "bin/worker", "bundled worker (used without PyTorch)")
	python := flag.String("python", "", "Python with torch (default: $PYTHON_EXEC, else /usr/bin/python3)")
	auth := flag.Bool("auth", true, "turn etcd auth on: every party connects as its own user (docs/security.md); -auth=false runs without")
	flag.Parse()
	res, err := scenario(options{hyperpodrun: *hpr, worker: *workerBin, python: *python, auth: *auth, out: os.Stdout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	if res.lost > 0 {
		os.Exit(1)
	}
}

type options struct {
	hyperpodrun, worker, python string
	// auth turns etcd auth on (elasticctl auth bootstrap): the
	// coordinator, the agents and each team connect as their own users,
	// and every job gets its own.
	auth bool
	out  io.Writer
}

// result is what the scenario observed.
type result struct {
	// sizes are the elastic job's world sizes in the order they trained at.
	sizes          []int
	steps          int
	lost, repeated int
	utilization    float64
	prodFinished   bool
	history        []fleet.Event
	// refused holds etcd's answers to the attacks tried with auth on.
	refused []error
}

// timeline prints events with the time since the demo started.
type timeline struct {
	out   io.Writer
	start time.Time
	mu    sync.Mutex
}

func (t *timeline) say(format string, a ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.out, "[%6.1fs] %s\n", time.Since(t.start).Seconds(), fmt.Sprintf(format, a...))
}

var stepRE = regexp.MustCompile(`^(\S+)/(\S+) (?:\[default0\]:)?step=(\d+) world_size=(\d+) loss=([0-9.]+)`)

// progress follows rank 0's step lines of every job.
type progress struct {
	tl    *timeline
	mu    sync.Mutex
	sizes map[string][]int
	world map[string]int
	steps map[string][]int
	last  map[string]string
}

func (p *progress) Write(b []byte) (int, error) {
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		m := stepRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		job := m[2]
		step, _ := strconv.Atoi(m[3])
		world, _ := strconv.Atoi(m[4])
		p.mu.Lock()
		if p.world[job] != world {
			p.sizes[job] = append(p.sizes[job], world)
			p.tl.say("%-12s training at world size %d (step %d, loss %s)", job, world, step, m[5])
			p.world[job] = world
		} else if step%25 == 0 {
			p.tl.say("%-12s step %d at world size %d, loss %s", job, step, world, m[5])
		}
		p.steps[job] = append(p.steps[job], step)
		p.last[job] = m[5]
		p.mu.Unlock()
	}
	return len(b), nil
}

func (p *progress) at(job string) (world, steps int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.steps[job]
	if len(s) > 0 {
		steps = s[len(s)-1]
	}
	return p.world[job], steps
}

func scenario(o options) (*result, error) {
	hpr, workerBin, python := &o.hyperpodrun, &o.worker, &o.python
	for _, b := range []*string{hpr, workerBin} {
		abs, err := filepath.Abs(*b)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(abs); err != nil {
			return nil, fmt.Errorf("%s not found: run 'make build' first (make demo does)", *b)
		}
		*b = abs
	}
	tl := &timeline{out: o.out, start: time.Now()}
	// The demo promises to finish in under two minutes (about 25 s here);
	// past that it stops with an error rather than run on.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	work, err := os.MkdirTemp("", "hyperpodrun-demo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	srv, err := etcdembed.Start(ctx, etcdembed.Options{Dir: filepath.Join(work, "etcd")})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	cli, err := srv.Client()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	st := fleet.New(cli, "")
	tl.say("embedded etcd at %s", srv.Endpoints[0])

	// Training: PyTorch DDP when installed, else the bundled worker.
	py := *python
	if py == "" {
		py = os.Getenv("PYTHON_EXEC")
	}
	if py == "" {
		py = "/usr/bin/python3"
	}
	repo, _ := os.Getwd()
	sweepRun := fleet.RunSpec{Script: *workerBin, NoPython: true, Args: []string{"--steps", "100000", "--step-time", "100ms", "--ckpt-dir", filepath.Join(work, "ckpt-sweep")}, GracefulTimeoutSeconds: 20}
	prodRun := fleet.RunSpec{Script: *workerBin, NoPython: true, Args: []string{"--steps", "60", "--step-time", "100ms", "--ckpt-dir", filepath.Join(work, "ckpt-prod")}, GracefulTimeoutSeconds: 20}
	if exec.Command(py, "-c", "import torch.distributed").Run() == nil {
		script := filepath.Join(repo, "examples", "pytorch", "train_elastic.py")
		sweepRun = fleet.RunSpec{Script: script, Python: py, Args: []string{"--steps", "100000", "--step-time", "0.1", "--ckpt-every", "20", "--ckpt-dir", filepath.Join(work, "ckpt-sweep")}, GracefulTimeoutSeconds: 20}
		prodRun = fleet.RunSpec{Script: script, Python: py, Args: []string{"--steps", "60", "--step-time", "0.1", "--ckpt-every", "20", "--ckpt-dir", filepath.Join(work, "ckpt-prod")}, GracefulTimeoutSeconds: 20}
		tl.say("workers: real PyTorch DDP (gloo on CPU) via %s", py)
	} else {
		tl.say("PyTorch is not installed for %s: 'apt-get install python3-torch' on Debian for real DDP; using the bundled worker", py)
	}

	// Two teams with 16 GPUs (2 nodes) of nominal quota each.
	for _, t := range []policy.Team{
		{Name: "research", Weight: 1, Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 16}}},
		{Name: "prod", Weight: 1, Preemption: policy.PreemptLowerPriority, Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 16}}},
	} {
		if err := st.PutTeam(ctx, t); err != nil {
			return nil, err
		}
	}
	tl.say("teams: research and prod, 16 x %s of nominal quota each (fleet: %d nodes x %d GPUs)", flavor, nodes, gpusPerNode)

	// With auth on, every party below connects as its own etcd user.
	agentCli, coordCli, teamStore := cli, cli, map[string]*fleet.Store{"research": st, "prod": st}
	if o.auth {
		pwDir := filepath.Join(work, "passwords")
		if _, err := etcdauth.Bootstrap(ctx, cli, st.Keys, []string{"research", "prod"}, pwDir); err != nil {
			return nil, err
		}
		as := func(user string) (*clientv3.Client, error) {
			pw, err := etcdconn.ReadPassword(filepath.Join(pwDir, user+".password"), "", "demo")
			if err != nil {
				return nil, err
			}
			return etcdconn.Connect(ctx, etcdconn.Options{Endpoints: srv.Endpoints, User: user, Password: pw})
		}
		var clis []*clientv3.Client
		defer func() {
			for _, c := range clis {
				c.Close()
			}
		}()
		for _, u := range []struct {
			user string
			cli  **clientv3.Client
		}{{etcdauth.AgentUser, &agentCli}, {etcdauth.CoordinatorUser, &coordCli}} {
			c, err := as(u.user)
			if err != nil {
				return nil, err
			}
			clis = append(clis, c)
			*u.cli = c
		}
		for team := range teamStore {
			c, err := as(etcdauth.TeamRole(team))
			if err != nil {
				return nil, err
			}
			clis = append(clis, c)
			teamStore[team] = fleet.New(c, "")
		}
		// The demo itself watches as an admin.
		admin, err := as(etcdauth.AdminUser)
		if err != nil {
			return nil, err
		}
		clis = append(clis, admin)
		cli, st = admin, fleet.New(admin, "")
		tl.say("etcd auth on: the coordinator, the agents and each team connect as their own users; each job gets its own (docs/security.md)")
	}

	prog := &progress{tl: tl, sizes: map[string][]int{}, world: map[string]int{}, steps: map[string][]int{}, last: map[string]string{}}
	var wg sync.WaitGroup
	actx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	var agents []*nodeagent.Agent
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("node-%d", i)
		runner := jobrunner.New(jobrunner.Config{Hyperpodrun: *hpr, Endpoints: srv.Endpoints, LogDir: filepath.Join(work, "logs"),
			RdzvConf: "last_call_timeout=1", Output: prog, Logger: quiet,
			// The demo's jobs run as the user who runs the demo, root included
			// (hyperpod-agent --allow-root-jobs); a fleet gives --job-user.
			AllowRootJobs: true})
		a, err := nodeagent.New(agentCli, nodeagent.Config{NodeName: name, Discover: fixture(name), Workloads: runner, Logger: quiet, LeaseTTL: 5 * time.Second})
		if err != nil {
			return nil, err
		}
		agents = append(agents, a)
		wg.Add(1)
		go func() { defer wg.Done(); a.Run(actx) }()
	}
	tl.say("4 node agents registered their fixture inventories (8 x H100 each)")

	// Coordinator: the demo's stable period is short so it fits in a minute.
	util := &utilization{total: nodes * gpusPerNode}
	co := coordinator.New(coordCli, coordinator.Config{Resync: 500 * time.Millisecond, Logger: quiet, JobCredentials: o.auth,
		Engine:     policy.Config{MinStablePeriod: 5 * time.Second},
		OnDecision: func(d policy.Decision) { util.record(d) }})
	wg.Add(1)
	go func() { defer wg.Done(); co.Run(actx) }()
	go followEvents(actx, cli, st, tl)

	submit := func(j fleet.JobSpec) error {
		j.SubmitTime = time.Now().UTC()
		return teamStore[j.Team].SubmitJob(ctx, j)
	}
	low, high := "low", "high"
	tl.say("submit: research-sweep (team research, priority low, elastic 1..4 nodes x 8 GPUs)")
	if err := submit(fleet.JobSpec{Job: policy.Job{Name: "sweep", Team: "research", PriorityClass: low, Flavor: flavor,
		PerNode: policy.Resources{Accelerators: gpusPerNode}, MinNodes: 1, MaxNodes: 4, Elastic: true}, Run: sweepRun}); err != nil {
		return nil, err
	}
	if err := waitUntil(ctx, func() bool { w, s := prog.at("sweep"); return w == 4 && s >= 30 }); err != nil {
		return nil, fmt.Errorf("sweep never trained at 4 nodes: %w", err)
	}
	tl.say("submit: prod (team prod, priority high, 2 nodes x 8 GPUs, 60 steps)")
	if err := submit(fleet.JobSpec{Job: policy.Job{Name: "prod", Team: "prod", PriorityClass: high, Flavor: flavor,
		PerNode: policy.Resources{Accelerators: gpusPerNode}, MinNodes: 2, MaxNodes: 2}, Run: prodRun}); err != nil {
		return nil, err
	}
	if err := waitUntil(ctx, func() bool { f, _, _ := st.Finished(ctx); _, ok := f["prod"]; return ok }); err != nil {
		return nil, fmt.Errorf("prod never finished: %w", err)
	}
	res := &result{prodFinished: true}
	if o.auth {
		// What a team may not do: resize another team's job.
		_, err := teamStore["prod"].UpdateJob(ctx, "sweep", func(j *fleet.JobSpec) error { j.MaxNodes = 1; return nil })
		tl.say("team prod tries to shrink research's sweep to 1 node: %v", err)
		res.refused = append(res.refused, err)
	}
	tl.say("prod finished: its nodes are idle again")
	if err := waitUntil(ctx, func() bool { w, _ := prog.at("sweep"); return w == 4 }); err != nil {
		return nil, fmt.Errorf("sweep never grew back: %w", err)
	}
	_, s0 := prog.at("sweep")
	waitUntil(ctx, func() bool { _, s := prog.at("sweep"); return s >= s0+20 })
	res.history, _, _ = st.Events(ctx, "sweep")
	teamStore["research"].DeleteJob(ctx, "sweep")
	for _, a := range agents {
		dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
		a.Drain(dctx)
		dcancel()
	}
	stopAgents()
	wg.Wait()

	prog.mu.Lock()
	steps := append([]int(nil), prog.steps["sweep"]...)
	res.sizes = append([]int(nil), prog.sizes["sweep"]...)
	prog.mu.Unlock()
	res.lost, res.repeated = checkSteps(steps)
	res.steps = len(steps)
	res.utilization = util.percent()
	w := o.out
	fmt.Fprintln(w)
	fmt.Fprintln(w, "== why the elastic job changed size (elasticctl describe job sweep)")
	for _, e := range res.history {
		line := fmt.Sprintf("%s %d -> %d nodes: %s", e.Kind, e.FromSize, e.ToSize, e.Message)
		if len(e.For) > 0 {
			line += fmt.Sprintf(" [for %s of team %s]", strings.Join(e.For, ","), e.ForTeam)
		}
		fmt.Fprintf(w, "  %s  %s\n", e.Time.Format("15:04:05"), line)
	}
	fmt.Fprintln(w, "== summary")
	fmt.Fprintf(w, "research-sweep trained at world sizes %v: %d optimizer steps, %d lost, %d repeated (planned changes checkpoint through the sync signal)\n", res.sizes, res.steps, res.lost, res.repeated)
	fmt.Fprintf(w, "fleet GPU allocation while jobs ran: %.1f%% of %d GPUs (allocated GPU-seconds / capacity)\n", res.utilization, nodes*gpusPerNode)
	fmt.Fprintf(w, "demo took %.1fs\n", time.Since(tl.start).Seconds())
	return res, nil
}

// checkSteps counts steps missing from, and repeated in, a 1..N sequence.
func checkSteps(steps []int) (lost, repeated int) {
	seen := map[int]int{}
	top := 0
	for _, s := range steps {
		seen[s]++
		top = max(top, s)
	}
	for i := 1; i <= top; i++ {
		switch {
		case seen[i] == 0:
			lost++
		case seen[i] > 1:
			repeated += seen[i] - 1
		}
	}
	return
}

func waitUntil(ctx context.Context, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// fixture returns a node's inventory: 8 healthy H100s.
func fixture(name string) func(context.Context) (*devices.Inventory, error) {
	return func(context.Context) (*devices.Inventory, error) {
		inv := &devices.Inventory{Node: name, Flavor: flavor, Flavors: []string{flavor}, VCPUs: 192, MemoryBytes: 2 << 40, UpdatedAt: time.Now().UTC()}
		for g := 0; g < gpusPerNode; g++ {
			inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNVIDIA, Index: g, Name: "NVIDIA H100 80GB HBM3",
				Flavor: flavor, UUID: fmt.Sprintf("GPU-%s-%d", name, g), Minor: g, MemoryBytes: 80 << 30, Healthy: true})
		}
		return inv, nil
	}
}

// utilization integrates allocated GPUs over time from the decisions.
type utilization struct {
	mu         sync.Mutex
	total      int
	last       time.Time
	used       int
	usedSec    float64
	elapsedSec float64
}

func (u *utilization) record(d policy.Decision) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	if !u.last.IsZero() && u.used > 0 {
		dt := now.Sub(u.last).Seconds()
		u.usedSec += dt * float64(u.used)
		u.elapsedSec += dt
	}
	u.last = now
	u.used = 0
	for _, a := range d.Allocations {
		u.used += a.Size * a.AcceleratorsPerNode
	}
}

func (u *utilization) percent() float64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.elapsedSec == 0 {
		return 0
	}
	return 100 * u.usedSec / (u.elapsedSec * float64(u.total))
}

// followEvents prints the coordinator's decisions as they happen.
func followEvents(ctx context.Context, cli *clientv3.Client, st *fleet.Store, tl *timeline) {
	for w := range cli.Watch(ctx, st.Keys.EventsPrefix(), clientv3.WithPrefix(), clientv3.WithFilterDelete()) {
		evs := w.Events
		sort.Slice(evs, func(i, j int) bool { return string(evs[i].Kv.Key) < string(evs[j].Kv.Key) })
		for _, ev := range evs {
			var e fleet.Event
			if err := json.Unmarshal(ev.Kv.Value, &e); err != nil {
				continue
			}
			if e.Kind == policy.KindPending && e.Code == "" {
				continue
			}
			line := fmt.Sprintf("coordinator: %s %s", e.Job, e.Kind)
			if e.FromSize != e.ToSize {
				line += fmt.Sprintf(" %d -> %d nodes", e.FromSize, e.ToSize)
			}
			tl.say("%s: %s", line, e.Message)
		}
	}
}

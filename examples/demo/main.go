// Command demo is the main demo, on an embedded etcd with no setup: the
// coordinator, four node agents with fixture inventories (8 x H100 each),
// two teams and real training workers (PyTorch DDP if installed, else the
// bundled worker). A low-priority elastic job of team research grows into
// the idle fleet; a high-priority job of team prod arrives and takes its
// quota back by shrinking the elastic job through the sync signal (checkpoint,
// no lost step); when prod finishes, the elastic job grows back. It prints a
// timeline and the fleet's utilization.
//
// Isolation (issue 22, -isolation, on by default): each node agent connects
// to etcd as its own node user (hyperpod-node-<node>), and, when the demo
// runs as root, each job runs as its own uid from the coordinator's
// --job-uid-range. What a job reads (hyperpodrun, the worker, the training
// script) is copied into a 0755 directory of the demo's work directory, and
// the jobs write their checkpoints under a sticky world-writable directory
// (1777, like /tmp or a shared scratch file system), each job in a
// directory it creates itself. A user other than root cannot change uid:
// then the jobs run as that user, as the demo says in its first lines.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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

	"github.com/hyperpodrun/hyperpodrun/agent/node/jobrunner"
	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
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
	isolation := flag.Bool("isolation", true, "each node agent as its own etcd user (with -auth) and, as root, each job as its own uid; -isolation=false: one shared agent user, jobs as the demo's user")
	flag.Parse()
	res, err := scenario(options{hyperpodrun: *hpr, worker: *workerBin, python: *python, auth: *auth, isolation: *isolation, out: os.Stdout})
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
	// isolation gives each node agent its own etcd user (with auth) and,
	// when the demo runs as root, each job its own uid (issue 22).
	isolation bool
	out       io.Writer
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
	// nodeRefused is etcd's answer to node-0's agent registering node-9
	// (with per-node users; nil when not tried).
	nodeRefused error
	// uids are the jobs' uids (their desired records'; 0: none) and procs
	// how many processes /proc showed running as each while both trained.
	uids  map[string]uint32
	procs map[string]int
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
	id := identities(o.isolation, o.auth, os.Geteuid())
	tl.say("%s", id.jobsLine)
	tl.say("%s", id.agentsLine)

	work, err := os.MkdirTemp("", "hyperpodrun-demo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	// Jobs running as their own uids traverse the work directory (to their
	// run directories, what they read and their checkpoints) but cannot
	// list it; the etcd data and the passwords below stay 0700.
	if err := os.Chmod(work, 0o711); err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	ckptDir := filepath.Join(work, "ckpt")
	if err := makeStickyDir(ckptDir); err != nil {
		return nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	repo, _ := os.Getwd()
	script := filepath.Join(repo, "examples", "pytorch", "train_elastic.py")
	if id.perJobUIDs {
		// What the jobs read, reachable by any uid: a 0755 copy.
		shared, err := shareReadOnly(filepath.Join(work, "shared"), *hpr, *workerBin, script)
		if err != nil {
			return nil, err
		}
		*hpr, *workerBin, script = shared[0], shared[1], shared[2]
	}
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
	// Each job creates its own checkpoint directory under the sticky one.
	sweepRun := fleet.RunSpec{Script: *workerBin, NoPython: true, Args: []string{"--steps", "100000", "--step-time", "100ms", "--ckpt-dir", filepath.Join(ckptDir, "sweep")}, GracefulTimeoutSeconds: 20}
	prodRun := fleet.RunSpec{Script: *workerBin, NoPython: true, Args: []string{"--steps", "60", "--step-time", "100ms", "--ckpt-dir", filepath.Join(ckptDir, "prod")}, GracefulTimeoutSeconds: 20}
	if exec.Command(py, "-c", "import torch.distributed").Run() == nil {
		sweepRun = fleet.RunSpec{Script: script, Python: py, Args: []string{"--steps", "100000", "--step-time", "0.1", "--ckpt-every", "20", "--ckpt-dir", filepath.Join(ckptDir, "sweep")}, GracefulTimeoutSeconds: 20}
		prodRun = fleet.RunSpec{Script: script, Python: py, Args: []string{"--steps", "60", "--step-time", "0.1", "--ckpt-every", "20", "--ckpt-dir", filepath.Join(ckptDir, "prod")}, GracefulTimeoutSeconds: 20}
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
	nodeNames := make([]string, nodes)
	agentClis := make([]*clientv3.Client, nodes)
	for i := range nodeNames {
		nodeNames[i] = fmt.Sprintf("node-%d", i)
		agentClis[i] = cli
	}
	coordCli, teamStore := cli, map[string]*fleet.Store{"research": st, "prod": st}
	if o.auth {
		pwDir := filepath.Join(work, "passwords")
		parties := etcdauth.Parties{Teams: []string{"research", "prod"}}
		if id.nodeUsers {
			parties.Nodes = nodeNames
		}
		if _, err := etcdauth.BootstrapFleet(ctx, cli, st.Keys, parties, pwDir); err != nil {
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
		users := []struct {
			user string
			cli  **clientv3.Client
		}{{etcdauth.CoordinatorUser, &coordCli}}
		for i := range agentClis {
			user := etcdauth.AgentUser
			if id.nodeUsers {
				user = etcdauth.NodeRole(nodeNames[i])
			}
			users = append(users, struct {
				user string
				cli  **clientv3.Client
			}{user, &agentClis[i]})
		}
		for _, u := range users {
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
	res := &result{uids: map[string]uint32{}, procs: map[string]int{}}
	if o.auth && id.nodeUsers {
		// What a node's agent may not do: speak for another node.
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := agentClis[0].Put(wctx, st.Keys.Node("node-9"), `{"node":"node-9"}`)
		wcancel()
		tl.say("node-0's agent (etcd user %s) tries to register a node-9: %v", etcdauth.NodeRole("node-0"), err)
		res.nodeRefused = err
	}

	prog := &progress{tl: tl, sizes: map[string][]int{}, world: map[string]int{}, steps: map[string][]int{}, last: map[string]string{}}
	var wg sync.WaitGroup
	actx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	var agents []*nodeagent.Agent
	for i, name := range nodeNames {
		rc := jobrunner.Config{Hyperpodrun: *hpr, Endpoints: srv.Endpoints, LogDir: filepath.Join(work, "logs"),
			TempDir: filepath.Join(work, "run"), RdzvConf: "last_call_timeout=1", Output: prog, Logger: quiet}
		if id.perJobUIDs {
			// hyperpod-agent --job-uid-range: each job as the uid the
			// coordinator gave it.
			rc.UIDRange = id.agentRange
		} else {
			// The jobs run as the user who runs the demo, root included
			// (hyperpod-agent --allow-root-jobs).
			rc.AllowRootJobs = true
		}
		runner := jobrunner.New(rc)
		a, err := nodeagent.New(agentClis[i], nodeagent.Config{NodeName: name, Discover: fixture(name), Workloads: runner, Logger: quiet, LeaseTTL: 5 * time.Second})
		if err != nil {
			return nil, err
		}
		agents = append(agents, a)
		wg.Add(1)
		go func() { defer wg.Done(); a.Run(actx) }()
	}
	// The jobs are submitted once every node is in etcd: an agent logs in
	// as its own user and registers under two leases, which takes a moment,
	// and a job submitted before would be admitted on the nodes there are.
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	err = waitUntil(rctx, func() bool { inv, _, err := st.Nodes(rctx); return err == nil && len(inv) == nodes })
	rcancel()
	if err != nil {
		return nil, fmt.Errorf("the %d node agents did not register within 30s: %w", nodes, err)
	}
	tl.say("4 node agents registered their fixture inventories (8 x H100 each)")

	// Coordinator: the demo's stable period is short so it fits in a minute.
	util := &utilization{total: nodes * gpusPerNode}
	co := coordinator.New(coordCli, coordinator.Config{Resync: 500 * time.Millisecond, Logger: quiet, JobCredentials: o.auth,
		JobUIDFirst: id.coordFirst, JobUIDLast: id.coordLast,
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
	if err := waitUntil(ctx, func() bool { w, _ := prog.at("prod"); return w == 2 }); err != nil {
		return nil, fmt.Errorf("prod never trained: %w", err)
	}
	// Who the two jobs run as, from their desired records and /proc.
	byUID := procsByUID()
	for _, job := range []string{"sweep", "prod"} {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		d, err := st.Desired(rctx, job)
		rcancel()
		if err != nil {
			return nil, fmt.Errorf("read %s's desired record: %w", job, err)
		}
		if d != nil && d.UID != 0 {
			res.uids[job] = d.UID
			res.procs[job] = byUID[d.UID]
		}
	}
	if id.perJobUIDs {
		tl.say("identities: sweep runs as uid %d (%d processes), prod as uid %d (%d processes): each job its own uid, neither can read, write or signal the other's",
			res.uids["sweep"], res.procs["sweep"], res.uids["prod"], res.procs["prod"])
	}
	if err := waitUntil(ctx, func() bool { f, _, _ := st.Finished(ctx); _, ok := f["prod"]; return ok }); err != nil {
		return nil, fmt.Errorf("prod never finished: %w", err)
	}
	res.prodFinished = true
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

// identityPlan is who the demo's parties and jobs run as.
type identityPlan struct {
	// perJobUIDs: each job runs as its own uid (the coordinator's
	// --job-uid-range, the agents' --job-uid-range); else as the demo's
	// user (--allow-root-jobs when that is root).
	perJobUIDs bool
	agentRange jobrunner.UIDRange
	// coordFirst and coordLast are the coordinator's range (0, 0: none).
	coordFirst, coordLast uint32
	// nodeUsers: each node agent connects as hyperpod-node-<node>; else
	// (with auth) all as the shared hyperpod-agent.
	nodeUsers bool
	// jobsLine and agentsLine say so, first thing.
	jobsLine, agentsLine string
}

// identities decides who the demo's jobs and node agents run as, given
// -isolation, -auth and the demo's effective uid. Rules:
//
//   - per-job-uid: isolation as root: each job its own uid from
//     coordinator.DefaultJobUIDRange;
//   - not-root: isolation as another user: the jobs run as that user
//     (only root can change uid);
//   - shared-uid: no isolation: the jobs run as the demo's user, root
//     included (hyperpod-agent --allow-root-jobs), as before issue 22;
//   - node-users: isolation with auth: each node agent its own etcd user;
//   - shared-agent: auth without isolation: one hyperpod-agent user;
//   - no-auth: auth off: no etcd users at all.
func identities(isolation, auth bool, euid int) identityPlan {
	var p identityPlan
	switch {
	case isolation && euid == 0:
		first, last, err1 := coordinator.ParseUIDRange(coordinator.DefaultJobUIDRange)
		r, err2 := jobrunner.ParseUIDRange(coordinator.DefaultJobUIDRange)
		if err := errors.Join(err1, err2); err != nil {
			p.jobsLine = fmt.Sprintf("jobs run as root: the uid range %s is unusable: %v", coordinator.DefaultJobUIDRange, err)
			break
		}
		p.perJobUIDs, p.agentRange, p.coordFirst, p.coordLast = true, r, first, last
		p.jobsLine = fmt.Sprintf("job identities: each job runs as its own uid from %s (coordinator and agents --job-uid-range), in 0700 directories made for it", r)
	case isolation:
		p.jobsLine = fmt.Sprintf("job identities: the jobs run as you (uid %d): a user other than root cannot change uid; run the demo as root (sudo make demo) to see each job run as its own uid", euid)
	default:
		p.jobsLine = fmt.Sprintf("job identities: -isolation=false: every job runs as the demo's user (uid %d, --allow-root-jobs)", euid)
	}
	switch {
	case !auth:
		p.agentsLine = "node agents: etcd auth is off (-auth=false): no party has a user of its own"
	case isolation:
		p.nodeUsers = true
		p.agentsLine = "node agents: each connects to etcd as its own user (hyperpod-node-<node>): it writes only its own node's records and reads only its own assignments"
	default:
		p.agentsLine = "node agents: -isolation=false: all connect to etcd as the one shared hyperpod-agent user"
	}
	return p
}

// shareReadOnly copies files into dir (made 0755): a job running as any
// uid can read them there, whatever the modes of the directories they came
// from (a 0700 temporary or home directory). Executables keep 0755, the
// rest get 0644. A file that does not exist is not copied and keeps its
// path. It returns the new paths, in order.
func shareReadOnly(dir string, files ...string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("shared directory: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("shared directory: %w", err)
	}
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f
		st, err := os.Stat(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("share %s with the jobs: %w", f, err)
		}
		mode := os.FileMode(0o644)
		if st.Mode()&0o111 != 0 {
			mode = 0o755
		}
		dst := filepath.Join(dir, filepath.Base(f))
		if err := copyFile(f, dst, mode); err != nil {
			return nil, fmt.Errorf("share %s with the jobs: %w", f, err)
		}
		out[i] = dst
	}
	return out, nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(mode); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// procsByUID counts the live processes of each real uid (/proc/<pid>/status).
func procsByUID() map[uint32]int {
	n := map[uint32]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return n
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // gone meanwhile
		}
		if uid, ok := statusUID(string(b)); ok {
			n[uid]++
		}
	}
	return n
}

// statusUID reads the real uid from a /proc/<pid>/status text.
func statusUID(status string) (uint32, bool) {
	for _, line := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(line, "Uid:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		u, err := strconv.ParseUint(f[0], 10, 32)
		return uint32(u), err == nil
	}
	return 0, false
}

// makeStickyDir makes dir world-writable and sticky (1777, as /tmp): any
// uid creates its own entries there, and none removes or renames another's.
func makeStickyDir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	// os.FileMode's sticky bit is ModeSticky, not 0o1000.
	return os.Chmod(dir, os.ModeSticky|0o777)
}

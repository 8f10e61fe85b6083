package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hyperpodrun/hyperpodrun/agent/node/jobrunner"
	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func scenario(o options) (*result, error) {
	if err := o.absBinaries(); err != nil {
		return nil, err
	}
	d := &demoRun{o: o, tl: &timeline{out: o.out, start: time.Now()}, quiet: slog.New(slog.NewTextHandler(io.Discard, nil)),
		res: &result{uids: map[string]uint32{}, procs: map[string]int{}}}
	// The demo promises to finish in under two minutes (about 25 s here);
	// past that it stops with an error rather than run on.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d.id = identities(o.isolation, o.auth, os.Geteuid())
	d.tl.say("%s", d.id.jobsLine)
	d.tl.say("%s", d.id.agentsLine)

	work, err := os.MkdirTemp("", "hyperpodrun-demo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	d.work = work
	if err := d.prepareWork(); err != nil {
		return nil, err
	}
	srv, err := etcdembed.Start(ctx, etcdembed.Options{Dir: filepath.Join(work, "etcd")})
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	d.srv = srv
	cli, err := srv.Client()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	d.cli, d.st = cli, fleet.New(cli, "")
	d.tl.say("embedded etcd at %s", srv.Endpoints[0])

	sweepRun, prodRun := d.runSpecs()
	if err := d.putTeams(ctx); err != nil {
		return nil, err
	}
	defer d.closeClients()
	if err := d.connectParties(ctx); err != nil {
		return nil, err
	}
	if err := d.run(ctx, sweepRun, prodRun); err != nil {
		return nil, err
	}
	d.summary()
	return d.res, nil
}

// demoRun is what the scenario's steps share.
type demoRun struct {
	o     options
	id    identityPlan
	tl    *timeline
	quiet *slog.Logger
	res   *result

	work, ckptDir, script string
	srv                   *etcdembed.Server
	// cli and st are the demo's own (an admin's with etcd auth on).
	cli *clientv3.Client
	st  *fleet.Store
	// Each party's: with auth on, each connects as its own etcd user.
	nodeNames []string
	agentClis []*clientv3.Client
	coordCli  *clientv3.Client
	teamStore map[string]*fleet.Store
	clis      []*clientv3.Client // opened by connectParties
	prog      *progress
	util      *utilization
}

// absBinaries makes the hyperpodrun and worker paths absolute, and fails
// when one was not built.
func (o *options) absBinaries() error {
	for _, b := range []*string{&o.hyperpodrun, &o.worker} {
		abs, err := filepath.Abs(*b)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("%s not found: run 'make build' first (make demo does)", *b)
		}
		*b = abs
	}
	return nil
}

// prepareWork sets up the work directory: the sticky checkpoint directory
// and, with jobs of their own uids, a world-readable copy of what they run.
func (d *demoRun) prepareWork() error {
	// Jobs running as their own uids traverse the work directory (to their
	// run directories, what they read and their checkpoints) but cannot
	// list it; the etcd data and the passwords below stay 0700.
	if err := os.Chmod(d.work, 0o711); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	d.ckptDir = filepath.Join(d.work, "ckpt")
	if err := makeStickyDir(d.ckptDir); err != nil {
		return fmt.Errorf("checkpoint directory: %w", err)
	}
	repo, _ := os.Getwd()
	d.script = filepath.Join(repo, "examples", "pytorch", "train_elastic.py")
	if d.id.perJobUIDs {
		// What the jobs read, reachable by any uid: a 0755 copy.
		shared, err := shareReadOnly(filepath.Join(d.work, "shared"), d.o.hyperpodrun, d.o.worker, d.script)
		if err != nil {
			return err
		}
		d.o.hyperpodrun, d.o.worker, d.script = shared[0], shared[1], shared[2]
	}
	return nil
}

// runSpecs are the two jobs' runs: PyTorch DDP when installed, else the
// bundled worker.
func (d *demoRun) runSpecs() (sweepRun, prodRun fleet.RunSpec) {
	py := d.o.python
	if py == "" {
		py = os.Getenv("PYTHON_EXEC")
	}
	if py == "" {
		py = "/usr/bin/python3"
	}
	// Each job creates its own checkpoint directory under the sticky one.
	ckptDir, workerBin, script := d.ckptDir, d.o.worker, d.script
	sweepRun = fleet.RunSpec{Script: workerBin, NoPython: true, Args: []string{"--steps", "100000", "--step-time", "100ms", "--ckpt-dir", filepath.Join(ckptDir, "sweep")}, GracefulTimeoutSeconds: 20}
	prodRun = fleet.RunSpec{Script: workerBin, NoPython: true, Args: []string{"--steps", "60", "--step-time", "100ms", "--ckpt-dir", filepath.Join(ckptDir, "prod")}, GracefulTimeoutSeconds: 20}
	if exec.Command(py, "-c", "import torch.distributed").Run() == nil {
		sweepRun = fleet.RunSpec{Script: script, Python: py, Args: []string{"--steps", "100000", "--step-time", "0.1", "--ckpt-every", "20", "--ckpt-dir", filepath.Join(ckptDir, "sweep")}, GracefulTimeoutSeconds: 20}
		prodRun = fleet.RunSpec{Script: script, Python: py, Args: []string{"--steps", "60", "--step-time", "0.1", "--ckpt-every", "20", "--ckpt-dir", filepath.Join(ckptDir, "prod")}, GracefulTimeoutSeconds: 20}
		d.tl.say("workers: real PyTorch DDP (gloo on CPU) via %s", py)
	} else {
		d.tl.say("PyTorch is not installed for %s: 'apt-get install python3-torch' on Debian for real DDP; using the bundled worker", py)
	}
	return sweepRun, prodRun
}

// putTeams writes the two teams, with 16 GPUs (2 nodes) of nominal quota
// each.
func (d *demoRun) putTeams(ctx context.Context) error {
	for _, t := range []policy.Team{
		{Name: "research", Weight: 1, Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 16}}},
		{Name: "prod", Weight: 1, Preemption: policy.PreemptLowerPriority, Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: 16}}},
	} {
		if err := d.st.PutTeam(ctx, t); err != nil {
			return err
		}
	}
	d.tl.say("teams: research and prod, 16 x %s of nominal quota each (fleet: %d nodes x %d GPUs)", flavor, nodes, gpusPerNode)
	return nil
}

// connectParties gives the coordinator, each node's agent and each team
// its etcd client: the demo's own without auth; with auth on, each
// connects as its own etcd user (and the demo itself as an admin).
func (d *demoRun) connectParties(ctx context.Context) error {
	d.nodeNames = make([]string, nodes)
	d.agentClis = make([]*clientv3.Client, nodes)
	for i := range d.nodeNames {
		d.nodeNames[i] = fmt.Sprintf("node-%d", i)
		d.agentClis[i] = d.cli
	}
	d.coordCli, d.teamStore = d.cli, map[string]*fleet.Store{"research": d.st, "prod": d.st}
	if !d.o.auth {
		return nil
	}
	pwDir := filepath.Join(d.work, "passwords")
	parties := etcdauth.Parties{Teams: []string{"research", "prod"}}
	if d.id.nodeUsers {
		parties.Nodes = d.nodeNames
	}
	if _, err := etcdauth.BootstrapFleet(ctx, d.cli, d.st.Keys, parties, pwDir); err != nil {
		return err
	}
	as := func(user string) (*clientv3.Client, error) {
		pw, err := etcdconn.ReadPassword(filepath.Join(pwDir, user+".password"), "", "demo")
		if err != nil {
			return nil, err
		}
		c, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: d.srv.Endpoints, User: user, Password: pw})
		if err == nil {
			d.clis = append(d.clis, c)
		}
		return c, err
	}
	var err error
	if d.coordCli, err = as(etcdauth.CoordinatorUser); err != nil {
		return err
	}
	for i := range d.agentClis {
		user := etcdauth.AgentUser
		if d.id.nodeUsers {
			user = etcdauth.NodeRole(d.nodeNames[i])
		}
		if d.agentClis[i], err = as(user); err != nil {
			return err
		}
	}
	for team := range d.teamStore {
		c, err := as(etcdauth.TeamRole(team))
		if err != nil {
			return err
		}
		d.teamStore[team] = fleet.New(c, "")
	}
	// The demo itself watches as an admin.
	admin, err := as(etcdauth.AdminUser)
	if err != nil {
		return err
	}
	d.cli, d.st = admin, fleet.New(admin, "")
	d.tl.say("etcd auth on: the coordinator, the agents and each team connect as their own users; each job gets its own (docs/security.md)")
	if d.id.nodeUsers {
		// What a node's agent may not do: speak for another node.
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := d.agentClis[0].Put(wctx, d.st.Keys.Node("node-9"), `{"node":"node-9"}`)
		wcancel()
		d.tl.say("node-0's agent (etcd user %s) tries to register a node-9: %v", etcdauth.NodeRole("node-0"), err)
		d.res.nodeRefused = err
	}
	return nil
}

func (d *demoRun) closeClients() {
	for _, c := range d.clis {
		c.Close()
	}
}

// run starts the node agents and the coordinator, plays the two jobs and
// drains the agents.
func (d *demoRun) run(ctx context.Context, sweepRun, prodRun fleet.RunSpec) error {
	d.prog = &progress{tl: d.tl, sizes: map[string][]int{}, world: map[string]int{}, steps: map[string][]int{}, last: map[string]string{}}
	var wg sync.WaitGroup
	actx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	agents, err := d.startAgents(actx, &wg)
	if err != nil {
		return err
	}
	// The jobs are submitted once every node is in etcd: an agent logs in
	// as its own user and registers under two leases, which takes a moment,
	// and a job submitted before would be admitted on the nodes there are.
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	err = waitUntil(rctx, func() bool { inv, _, err := d.st.Nodes(rctx); return err == nil && len(inv) == nodes })
	rcancel()
	if err != nil {
		return fmt.Errorf("the %d node agents did not register within 30s: %w", nodes, err)
	}
	d.tl.say("4 node agents registered their fixture inventories (8 x H100 each)")

	// Coordinator: the demo's stable period is short so it fits in a minute.
	d.util = &utilization{total: nodes * gpusPerNode}
	co := coordinator.New(d.coordCli, coordinator.Config{Resync: 500 * time.Millisecond, Logger: d.quiet, JobCredentials: d.o.auth,
		JobUIDFirst: d.id.coordFirst, JobUIDLast: d.id.coordLast,
		Engine:     policy.Config{MinStablePeriod: 5 * time.Second},
		OnDecision: func(dec policy.Decision) { d.util.record(dec) }})
	wg.Add(1)
	go func() { defer wg.Done(); co.Run(actx) }()
	go followEvents(actx, d.cli, d.st, d.tl)

	if err := d.playJobs(ctx, sweepRun, prodRun); err != nil {
		return err
	}
	for _, a := range agents {
		dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
		a.Drain(dctx)
		dcancel()
	}
	stopAgents()
	wg.Wait()
	return nil
}

// startAgents starts one node agent per node, each with its fixture
// inventory and a job runner, until actx ends.
func (d *demoRun) startAgents(actx context.Context, wg *sync.WaitGroup) ([]*nodeagent.Agent, error) {
	var agents []*nodeagent.Agent
	for i, name := range d.nodeNames {
		rc := jobrunner.Config{Hyperpodrun: d.o.hyperpodrun, Endpoints: d.srv.Endpoints, LogDir: filepath.Join(d.work, "logs"),
			TempDir: filepath.Join(d.work, "run"), RdzvConf: "last_call_timeout=1", Output: d.prog, Logger: d.quiet}
		if d.id.perJobUIDs {
			// hyperpod-agent --job-uid-range: each job as the uid the
			// coordinator gave it.
			rc.UIDRange = d.id.agentRange
		} else {
			// The jobs run as the user who runs the demo, root included
			// (hyperpod-agent --allow-root-jobs).
			rc.AllowRootJobs = true
		}
		runner := jobrunner.New(rc)
		a, err := nodeagent.New(d.agentClis[i], nodeagent.Config{NodeName: name, Discover: fixture(name), Workloads: runner, Logger: d.quiet, LeaseTTL: 5 * time.Second})
		if err != nil {
			return nil, err
		}
		agents = append(agents, a)
		wg.Add(1)
		go func() { defer wg.Done(); a.Run(actx) }()
	}
	return agents, nil
}

// playJobs is the story: the elastic sweep fills the fleet, prod preempts
// half of it, finishes, and the sweep grows back.
func (d *demoRun) playJobs(ctx context.Context, sweepRun, prodRun fleet.RunSpec) error {
	prog, st, tl, res := d.prog, d.st, d.tl, d.res
	submit := func(j fleet.JobSpec) error {
		j.SubmitTime = time.Now().UTC()
		return d.teamStore[j.Team].SubmitJob(ctx, j)
	}
	low, high := "low", "high"
	tl.say("submit: research-sweep (team research, priority low, elastic 1..4 nodes x 8 GPUs)")
	if err := submit(fleet.JobSpec{Job: policy.Job{Name: "sweep", Team: "research", PriorityClass: low, Flavor: flavor,
		PerNode: policy.Resources{Accelerators: gpusPerNode}, MinNodes: 1, MaxNodes: 4, Elastic: true}, Run: sweepRun}); err != nil {
		return err
	}
	if err := waitUntil(ctx, func() bool { w, s := prog.at("sweep"); return w == 4 && s >= 30 }); err != nil {
		return fmt.Errorf("sweep never trained at 4 nodes: %w", err)
	}
	tl.say("submit: prod (team prod, priority high, 2 nodes x 8 GPUs, 60 steps)")
	if err := submit(fleet.JobSpec{Job: policy.Job{Name: "prod", Team: "prod", PriorityClass: high, Flavor: flavor,
		PerNode: policy.Resources{Accelerators: gpusPerNode}, MinNodes: 2, MaxNodes: 2}, Run: prodRun}); err != nil {
		return err
	}
	if err := waitUntil(ctx, func() bool { w, _ := prog.at("prod"); return w == 2 }); err != nil {
		return fmt.Errorf("prod never trained: %w", err)
	}
	if err := d.noteIdentities(ctx); err != nil {
		return err
	}
	if err := waitUntil(ctx, func() bool { f, _, _ := st.Finished(ctx); _, ok := f["prod"]; return ok }); err != nil {
		return fmt.Errorf("prod never finished: %w", err)
	}
	res.prodFinished = true
	if d.o.auth {
		// What a team may not do: resize another team's job.
		_, err := d.teamStore["prod"].UpdateJob(ctx, "sweep", func(j *fleet.JobSpec) error { j.MaxNodes = 1; return nil })
		tl.say("team prod tries to shrink research's sweep to 1 node: %v", err)
		res.refused = append(res.refused, err)
	}
	tl.say("prod finished: its nodes are idle again")
	if err := waitUntil(ctx, func() bool { w, _ := prog.at("sweep"); return w == 4 }); err != nil {
		return fmt.Errorf("sweep never grew back: %w", err)
	}
	_, s0 := prog.at("sweep")
	waitUntil(ctx, func() bool { _, s := prog.at("sweep"); return s >= s0+20 })
	res.history, _, _ = st.Events(ctx, "sweep")
	d.teamStore["research"].DeleteJob(ctx, "sweep")
	return nil
}

// noteIdentities records who the two jobs run as, from their desired
// records and /proc.
func (d *demoRun) noteIdentities(ctx context.Context) error {
	byUID := procsByUID()
	for _, job := range []string{"sweep", "prod"} {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		des, err := d.st.Desired(rctx, job)
		rcancel()
		if err != nil {
			return fmt.Errorf("read %s's desired record: %w", job, err)
		}
		if des != nil && des.UID != 0 {
			d.res.uids[job] = des.UID
			d.res.procs[job] = byUID[des.UID]
		}
	}
	if d.id.perJobUIDs {
		d.tl.say("identities: sweep runs as uid %d (%d processes), prod as uid %d (%d processes): each job its own uid, neither can read, write or signal the other's",
			d.res.uids["sweep"], d.res.procs["sweep"], d.res.uids["prod"], d.res.procs["prod"])
	}
	return nil
}

// summary fills in the result from what training printed and prints why
// the sweep changed size and the summary.
func (d *demoRun) summary() {
	res := d.res
	d.prog.mu.Lock()
	steps := append([]int(nil), d.prog.steps["sweep"]...)
	res.sizes = append([]int(nil), d.prog.sizes["sweep"]...)
	d.prog.mu.Unlock()
	res.lost, res.repeated = checkSteps(steps)
	res.steps = len(steps)
	res.utilization = d.util.percent()
	w := d.o.out
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
	fmt.Fprintf(w, "demo took %.1fs\n", time.Since(d.tl.start).Seconds())
}

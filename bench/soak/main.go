// Command soak is the chaos soak of issue 10: a real fleet (Debian's etcd,
// two hyperpod-coordinators, three hyperpod-agents with fixture Inferentia2
// inventories, all real child processes built from this repository) trains a
// PyTorch DDP job and a bundled-worker job while a seeded schedule injects
// faults: SIGKILL of a worker, of a hyperpodrun, of a node agent, of the
// leading coordinator and of etcd (each restarted), SIGSTOP of a hyperpodrun
// for 10 s, corrupt record writes and etcd's data directory wiped (with
// -auth=false only: the jobs it held must be stopped by their node agents,
// then they are resubmitted; issue 24). It checks from /proc and the training
// logs, all the time, that no two live workers of a job hold one RANK, that
// no committed step is lost, that nothing is orphaned, that every job
// finishes its steps and that none is Failed; it prints BENCH lines and exits
// 1 when an invariant broke, naming the fault that preceded it.
//
// With -isolation (the default, issue 22) each node agent connects to etcd
// as its own node user (elasticctl auth bootstrap --node ...), and, when the
// soak runs as root, each job runs as its own uid (the coordinator's and
// the agents' --job-uid-range, no --allow-root-jobs): the soak then also
// checks from /proc that no job runs as root and no two jobs share a uid.
// What the jobs read (the binaries, the DDP script) is in a 0755 directory
// and they write checkpoints under a sticky 1777 one, each job in its own.
//
//	go run ./bench/soak                       # 20 minutes of faults
//	go run ./bench/soak -short -seed 7        # about 3 minutes
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/checkpoint"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/fsutil"
)

const (
	teamName     = "soak"
	flavor       = "inferentia2" // the devices/testdata inf2 fixture: 12 devices per node
	perNodeAccel = 6             // so both jobs fit on every node
	nodes        = 3
)

type config struct {
	duration, settle           time.Duration
	seed                       uint64
	short, keep, planOnly      bool
	repo, etcdBin, python      string
	ddpSteps, workerSteps      int
	gapMin, gapMax, etcdDown   time.Duration
	corruptHold, warmupTimeout time.Duration
	verbose                    bool
	auth                       bool
	// isolation: per-node etcd users (with auth) and, as root, per-job
	// uids.
	isolation bool
	// etcdMembers: the etcd cluster's size; 3 adds the member faults
	// (members.go).
	etcdMembers int
}

func parseConfig(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.BoolVar(&c.short, "short", os.Getenv("SOAK_SHORT") != "", "the short soak (about 3 minutes; $SOAK_SHORT)")
	dur := fs.Duration("duration", 0, "how long faults are injected (default 20m, -short 2m; $SOAK_DURATION)")
	seed := fs.Uint64("seed", 0, "seed of the fault schedule (default 1; $SOAK_SEED)")
	fs.DurationVar(&c.settle, "settle", 0, "after the faults, how long the last jobs get to finish (default 4m, -short 2m)")
	fs.BoolVar(&c.keep, "keep", false, "keep the work directory (logs, etcd data) and print its path")
	fs.BoolVar(&c.planOnly, "plan", false, "print the fault schedule of the seed and exit")
	fs.StringVar(&c.repo, "repo", ".", "the repository root")
	fs.StringVar(&c.etcdBin, "etcd", "/usr/bin/etcd", "etcd binary (Debian's etcd-server 3.4)")
	fs.StringVar(&c.python, "python", "", "Python with torch (default $PYTHON_EXEC, else /usr/bin/python3)")
	fs.IntVar(&c.ddpSteps, "ddp-steps", 0, "steps of each DDP job (default 400, -short 100)")
	fs.IntVar(&c.workerSteps, "worker-steps", 0, "steps of each bundled-worker job (default 1500, -short 400)")
	fs.BoolVar(&c.verbose, "v", false, "debug logs")
	fs.BoolVar(&c.auth, "auth", os.Getenv("SOAK_AUTH") != "0", "etcd auth on: elasticctl auth bootstrap, every daemon and team as its own user, every job as its minted one ($SOAK_AUTH=0 turns it off)")
	fs.IntVar(&c.etcdMembers, "etcd-members", envInt("SOAK_ETCD_MEMBERS", 1), "etcd members: 3 runs the fleet on a 3-member cluster with member faults (leader SIGKILL, a member down for minutes, a member's disk full, quorum lost for 30 s) ($SOAK_ETCD_MEMBERS)")
	fs.BoolVar(&c.isolation, "isolation", os.Getenv("SOAK_ISOLATION") != "0", "each node agent as its own etcd user (hyperpod-node-<node>) and, as root, each job as its own uid (--job-uid-range); -isolation=false: one shared agent user, jobs as root with --allow-root-jobs ($SOAK_ISOLATION=0)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	c.duration, c.seed = *dur, *seed
	if c.duration == 0 {
		if v := os.Getenv("SOAK_DURATION"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				return c, fmt.Errorf("$SOAK_DURATION: %w", err)
			}
			c.duration = d
		}
	}
	if c.seed == 0 {
		if v := os.Getenv("SOAK_SEED"); v != "" {
			s, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return c, fmt.Errorf("$SOAK_SEED: %w", err)
			}
			c.seed = s
		}
	}
	if c.seed == 0 {
		c.seed = 1
	}
	// The short soak: faults every 5-10 s for 2 minutes, etcd down 1-5 s.
	def := func(d *time.Duration, long, short time.Duration) {
		if *d == 0 {
			*d = long
			if c.short {
				*d = short
			}
		}
	}
	defInt := func(n *int, long, short int) {
		if *n == 0 {
			*n = long
			if c.short {
				*n = short
			}
		}
	}
	def(&c.duration, 20*time.Minute, 2*time.Minute)
	def(&c.settle, 4*time.Minute, 2*time.Minute)
	def(&c.gapMin, 15*time.Second, 5*time.Second)
	def(&c.gapMax, 40*time.Second, 10*time.Second)
	def(&c.etcdDown, 30*time.Second, 5*time.Second)
	def(&c.corruptHold, 5*time.Second, 5*time.Second)
	def(&c.warmupTimeout, 4*time.Minute, 4*time.Minute)
	defInt(&c.ddpSteps, 400, 100)
	defInt(&c.workerSteps, 1500, 400)
	if c.etcdMembers < 1 {
		return c, fmt.Errorf("-etcd-members %d: at least 1", c.etcdMembers)
	}
	if c.duration < 0 || c.settle < 0 || c.ddpSteps < 1 || c.workerSteps < 1 {
		return c, errors.New("durations must be positive and steps at least 1")
	}
	if c.python == "" {
		c.python = os.Getenv("PYTHON_EXEC")
	}
	if c.python == "" {
		c.python = "/usr/bin/python3"
	}
	return c, nil
}

func main() {
	cfg, err := parseConfig(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	level := slog.LevelInfo
	if cfg.verbose {
		level = slog.LevelDebug
	}
	start := time.Now()
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.String("t", fmt.Sprintf("%.1fs", time.Since(start).Seconds()))
		}
		return a
	}}))
	if cfg.planOnly {
		for _, f := range plan(cfg.seed, cfg.duration, cfg.gapMin, cfg.gapMax, cfg.etcdDown, cfg.memberKinds()...) {
			fmt.Println(f)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	code := run(ctx, cfg, log, start)
	stop()
	os.Exit(code)
}

// soak is one run: the fleet, the monitors and what they saw.
type soak struct {
	cfg   config
	log   *slog.Logger
	start time.Time
	work  string
	bin   string // built binaries
	mark  string
	keys  fleet.Keys

	sup     *supervisor
	scan    *scanner
	jobs    *jobTable
	etcdCli *clientv3.Client
	etcd    *child
	cluster *cluster // with -etcd-members > 1 (s.etcd is its first member)
	coords  []*child
	agents  []*child
	// endpoint is etcd's client URL; peer its peer URL (fixed across
	// restarts).
	endpoint, peer string

	// perJobUIDs: the jobs run as their own uids (isolation as root).
	perJobUIDs bool
	// ddpScript is the training script the DDP jobs run.
	ddpScript string

	stopped    atomic.Int64 // pid of the SIGSTOPped hyperpodrun, if any
	resubmit   atomic.Bool  // the fault phase: jobs that end are replaced
	phaseEnd   atomic.Int64 // when the fault phase ends (unix nanos)
	mu         sync.Mutex
	faults     []*injected
	violations []violation
	dupObs     int
	staleObs   int
	uidObs     int
	lost       int64
	orphans    int
	completed  int
	failed     int
	gens       map[string]int
}

type violation struct {
	at        time.Time
	invariant string
	detail    string
	after     string // the fault that preceded it
}

func run(ctx context.Context, cfg config, log *slog.Logger, start time.Time) int {
	s := &soak{cfg: cfg, log: log, start: start, keys: keysFor(), jobs: newJobTable(), gens: map[string]int{}}
	var err error
	if s.work, err = os.MkdirTemp("", "hyperpodrun-soak-"); err != nil {
		log.Error("temp dir", "err", err)
		return 1
	}
	b := make([]byte, 8)
	rand.Read(b)
	s.mark = hex.EncodeToString(b)
	defer func() {
		if cfg.keep {
			log.Info("work directory kept", "dir", s.work)
			return
		}
		os.RemoveAll(s.work)
	}()
	err = s.run(ctx)
	s.teardown()
	s.report(os.Stdout)
	switch {
	case ctx.Err() != nil:
		log.Error("interrupted: everything the soak started was stopped")
		return 130
	case err != nil:
		log.Error("the soak could not run", "err", err)
		return 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.violations) > 0 {
		return 1
	}
	return 0
}

func (s *soak) since(t time.Time) string { return fmt.Sprintf("%.1fs", t.Sub(s.start).Seconds()) }

func (s *soak) run(ctx context.Context) error {
	if err := s.prepare(ctx); err != nil {
		return err
	}
	defer func() {
		if s.etcdCli != nil {
			s.etcdCli.Close()
		}
	}()
	if err := s.startFleet(ctx); err != nil {
		return err
	}

	mctx, stopMonitors := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopMonitors(); wg.Wait() }()
	for _, m := range []func(context.Context){s.watchProcs, s.watchCheckpoints, s.watchJobs} {
		wg.Add(1)
		go func() { defer wg.Done(); m(mctx) }()
	}

	if err := s.warmUp(ctx); err != nil {
		return err
	}
	return s.faultPhase(ctx)
}

// prepare checks what the soak needs (the repository, PyTorch, etcd),
// builds the binaries into the work directory and sets up the process
// scanner and supervisor.
func (s *soak) prepare(ctx context.Context) error {
	cfg := s.cfg
	repo, err := filepath.Abs(cfg.repo)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(repo, "examples", "pytorch", "train_elastic.py")); err != nil {
		return fmt.Errorf("-repo %s is not the repository root: %w", cfg.repo, err)
	}
	cfg.repo = repo
	s.cfg.repo = repo
	if err := exec.Command(cfg.python, "-c", "import torch.distributed").Run(); err != nil {
		return fmt.Errorf("%s cannot import torch.distributed (apt-get install python3-torch): %w", cfg.python, err)
	}
	if _, err := os.Stat(cfg.etcdBin); err != nil {
		return fmt.Errorf("etcd: %w (apt-get install etcd-server)", err)
	}
	s.perJobUIDs = cfg.isolation && os.Geteuid() == 0
	if err := s.makeDirs(); err != nil {
		return err
	}
	s.bin = filepath.Join(s.work, "bin")
	s.log.Info("building the binaries", "into", s.bin)
	build := exec.CommandContext(ctx, "go", "build", "-o", s.bin+"/", "./cmd/hyperpodrun", "./cmd/hyperpod-agent",
		"./cmd/hyperpod-coordinator", "./cmd/elasticctl", "./examples/worker")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	s.ddpScript = filepath.Join(repo, "examples", "pytorch", "train_elastic.py")
	if s.perJobUIDs {
		// The jobs' uids read the script from the 0755 bin directory,
		// whatever the modes above the repository.
		dst := filepath.Join(s.bin, "train_elastic.py")
		if err := fsutil.CopyFile(s.ddpScript, dst, 0o644); err != nil {
			return fmt.Errorf("share the DDP script with the jobs: %w", err)
		}
		s.ddpScript = dst
	}
	if err := setSubreaper(); err != nil {
		return err
	}
	s.scan = newScanner(s.mark, filepath.Join(s.bin, "hyperpodrun"))
	s.sup = newSupervisor(s.log, filepath.Join(s.work, "logs"), []string{markVar + "=" + s.mark}, func(_, line string) {
		if ev := s.jobs.line(line); ev != nil && ev.lost > 0 {
			s.lostSteps(ev.lost)
			s.violate("committed steps kept", fmt.Sprintf("%s: rank 0 restarted after step %d, but step %d was committed (%d committed steps lost)",
				ev.job, ev.resumedAfter, ev.committed, ev.lost))
		}
	})
	return nil
}

// startFleet starts etcd (bootstrapping auth when on), the team, two
// coordinators and the node agents, and waits for the nodes to register.
func (s *soak) startFleet(ctx context.Context) error {
	if s.cfg.etcdMembers > 1 {
		if err := s.startCluster(ctx); err != nil {
			return err
		}
	} else {
		ports, err := freePorts(2)
		if err != nil {
			return err
		}
		s.endpoint, s.peer = fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
		if err := s.startEtcd(ctx); err != nil {
			return err
		}
	}
	var err error
	var user, pw string
	if s.cfg.auth {
		args := []string{"auth", "bootstrap", "--team", teamName, "--password-dir", s.passwordDir()}
		if s.cfg.isolation {
			for i := 0; i < nodes; i++ {
				args = append(args, "--node", nodeName(i))
			}
		}
		if _, err := s.elasticctl(ctx, args...); err != nil {
			return err
		}
		user = etcdauth.RootUser
		if pw, err = etcdconn.ReadPassword(s.passwordFile(user), "", "root"); err != nil {
			return err
		}
		s.log.Info("etcd auth on: every daemon, the team and every job connect as their own users", "per_node_agent_users", s.cfg.isolation)
	}
	if s.perJobUIDs {
		s.log.Info("each job runs as its own uid", "job_uid_range", soakUIDRange)
	} else if s.cfg.isolation {
		s.log.Info("jobs run as the soak's user: only root can run each job as its own uid", "uid", os.Geteuid())
	}
	if s.etcdCli, err = clientv3.New(clientv3.Config{Endpoints: strings.Split(s.endpoint, ","), DialTimeout: 2 * time.Second, Logger: nopZap(), Username: user, Password: pw}); err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	if err := s.applyTeam(ctx); err != nil {
		return err
	}
	for i := 0; i < 2; i++ {
		s.coords = append(s.coords, nil)
		if err := s.startCoordinator(i); err != nil {
			return err
		}
	}
	for i := 0; i < nodes; i++ {
		s.agents = append(s.agents, nil)
		if err := s.startAgent(i); err != nil {
			return err
		}
	}
	if err := s.waitNodes(ctx); err != nil {
		return err
	}
	return nil
}

// warmUp submits both jobs and waits until both trained.
func (s *soak) warmUp(ctx context.Context) error {
	cfg := s.cfg
	s.resubmit.Store(true)
	for _, k := range []string{kindDDP, kindWorker} {
		if err := s.submit(ctx, k); err != nil {
			return err
		}
	}
	s.log.Info("waiting for both jobs to train before the first fault")
	if err := s.until(ctx, cfg.warmupTimeout, func() bool {
		n := 0
		for _, j := range s.jobs.snapshot() {
			if j.maxStep > 0 {
				n++
			}
		}
		return n >= 2
	}); err != nil {
		return fmt.Errorf("the jobs never trained: %w", err)
	}
	return nil
}

// faultPhase injects the planned faults for the configured duration, then
// waits for the running jobs to finish.
func (s *soak) faultPhase(ctx context.Context) error {
	cfg := s.cfg
	schedule := plan(cfg.seed, cfg.duration, cfg.gapMin, cfg.gapMax, cfg.etcdDown, cfg.memberKinds()...)
	s.log.Info("fault phase", "seed", cfg.seed, "faults", len(schedule), "duration", cfg.duration)
	phaseEnd := time.Now().Add(cfg.duration)
	s.phaseEnd.Store(phaseEnd.UnixNano())
	for _, pf := range schedule {
		if err := sleep(ctx, pf.gap); err != nil {
			return nil
		}
		if time.Now().After(phaseEnd) {
			break
		}
		s.fault(ctx, pf)
		if ctx.Err() != nil {
			return nil
		}
	}
	if err := sleep(ctx, time.Until(phaseEnd)); err != nil {
		return nil
	}
	s.resubmit.Store(false)
	s.log.Info("faults over: waiting for the running jobs to finish", "settle", cfg.settle)
	if err := s.until(ctx, cfg.settle, func() bool { return len(s.jobs.runningNames()) == 0 }); err != nil && ctx.Err() == nil {
		for _, n := range s.jobs.runningNames() {
			for _, j := range s.jobs.snapshot() {
				if j.name == n {
					s.violate("every job finishes its steps", fmt.Sprintf("%s did not finish within %s after the faults ended: %s\n%s",
						n, cfg.settle, j, indent(j.output, 12)))
				}
			}
		}
	}
	// One last look at what the user sees.
	s.pollJobs(ctx)
	return nil
}

// fault injects one planned fault, retrying for a while when it has no
// target yet (e.g. the job is between rounds).
func (s *soak) fault(ctx context.Context, pf plannedFault) {
	f := &injected{plannedFault: pf}
	deadline := time.Now().Add(faultTargetRetryLimit)
	for {
		f.at = time.Now()
		s.mu.Lock()
		if len(s.faults) == 0 || s.faults[len(s.faults)-1] != f {
			s.faults = append(s.faults, f)
		}
		s.mu.Unlock()
		err := s.inject(ctx, f)
		f.end = time.Now()
		if err == nil {
			s.log.Info("FAULT", "n", f.n, "kind", f.kind, "target", f.target, "took", f.end.Sub(f.at).Round(time.Millisecond))
			return
		}
		if errors.Is(err, errNoTarget) && time.Now().Before(deadline) && ctx.Err() == nil {
			sleep(ctx, time.Second)
			continue
		}
		f.skipped = err.Error()
		s.log.Warn("FAULT not injected", "n", f.n, "kind", f.kind, "err", err)
		return
	}
}

// violate records a broken invariant with the fault that preceded it.
func (s *soak) violate(invariant, detail string) {
	now := time.Now()
	s.mu.Lock()
	v := violation{at: now, invariant: invariant, detail: detail, after: "no fault yet"}
	for i := len(s.faults) - 1; i >= 0; i-- {
		f := s.faults[i]
		if f.skipped != "" || f.at.After(now) {
			continue
		}
		state := fmt.Sprintf("%.1fs after it began", now.Sub(f.at).Seconds())
		if f.end.IsZero() || f.end.After(now) {
			state = "while it was under way"
		}
		v.after = fmt.Sprintf("%s at %s, %s", f, s.since(f.at), state)
		break
	}
	s.violations = append(s.violations, v)
	s.mu.Unlock()
	s.log.Error("INVARIANT BROKEN", "invariant", invariant, "after", v.after, "detail", detail)
}

func (s *soak) lostSteps(n int64) {
	s.mu.Lock()
	s.lost += n
	s.mu.Unlock()
}

// until polls cond every 200 ms for at most d.
func (s *soak) until(ctx context.Context, d time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for !cond() {
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// --- the fleet ---

// watchProcs scans /proc every 100 ms: duplicate ranks and orphans.
func (s *soak) watchProcs(ctx context.Context) {
	type episode struct {
		first, last time.Time
		obs         int
		pids        map[int]proc
	}
	open := map[dupKey]*episode{}
	staleSeen := map[int]bool{}
	uidSeen := map[string]bool{}
	ow := newOrphanWatch(2 * time.Second)
	self := os.Getpid()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n++
		if n%5 == 0 {
			s.sup.reapOrphans(self)
		}
		ps := s.scan.scan()
		s.jobs.sawUIDs(ps)
		now := time.Now()
		dups := duplicates(ps)
		for k, v := range dups {
			s.mu.Lock()
			s.dupObs++
			s.mu.Unlock()
			e := open[k]
			if e == nil {
				e = &episode{first: now, pids: map[int]proc{}}
				open[k] = e
				var lines []string
				for _, p := range v {
					lines = append(lines, p.String())
				}
				if st := s.stopped.Load(); st != 0 {
					lines = append(lines, fmt.Sprintf("(hyperpodrun pid %d is SIGSTOPped)", st))
				}
				s.violate("no two live workers of a job hold one RANK", fmt.Sprintf("job %s RANK %s held by %d live workers:\n%s",
					k.job, k.rank, len(v), indent(lines, 0)))
			}
			e.obs++
			e.last = now
			for _, p := range v {
				e.pids[p.pid] = p
			}
		}
		for job, v := range staleRounds(ps) {
			s.mu.Lock()
			s.staleObs++
			s.mu.Unlock()
			for _, p := range v {
				if !staleSeen[p.pid] {
					staleSeen[p.pid] = true
					s.violate("fencing: no worker of a superseded round lives beside the next round's", fmt.Sprintf(
						"job %s: %s is alive while round %s's workers run", job, p, newestRound(ps, job)))
				}
			}
		}
		if s.perJobUIDs {
			for _, u := range uidProblems(ps) {
				s.mu.Lock()
				s.uidObs++
				s.mu.Unlock()
				if !uidSeen[u.key] {
					uidSeen[u.key] = true
					s.violate("each job runs as its own uid", u.detail)
				}
			}
		}
		for k, e := range open {
			if _, still := dups[k]; !still {
				s.log.Error("duplicate RANK over", "job", k.job, "rank", k.rank, "lasted", e.last.Sub(e.first).Round(100*time.Millisecond),
					"observations", e.obs, "workers", len(e.pids))
				delete(open, k)
			}
		}
		for _, p := range ow.observe(ps, now, self, s.sup.isChild) {
			s.mu.Lock()
			s.orphans++
			s.mu.Unlock()
			s.violate("nothing is orphaned", fmt.Sprintf("%s has lived 2 s with its parent dead (reparented to %d); killed", p, p.ppid))
			syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}

// watchCheckpoints reads every running job's checkpoint record 4 times a
// second: the committed step must never go backwards.
func (s *soak) watchCheckpoints(ctx context.Context) {
	for sleep(ctx, 250*time.Millisecond) == nil {
		for _, job := range s.jobs.runningNames() {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			resp, err := s.etcdCli.Get(rctx, s.keys.Checkpoint(job))
			cancel()
			if err != nil || len(resp.Kvs) == 0 {
				continue
			}
			var rec checkpoint.Record
			if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
				continue // malformed (the soak's own corrupt writes among them)
			}
			if lost, prev := s.jobs.record(job, rec.Step); lost > 0 {
				s.lostSteps(lost)
				s.violate("committed steps kept", fmt.Sprintf("%s: the checkpoint record went back from step %d to %d (%d committed steps lost)",
					job, prev, rec.Step, lost))
			}
		}
	}
}

// watchJobs asks `elasticctl get jobs -o json` every 3 s what the user sees.
func (s *soak) watchJobs(ctx context.Context) {
	for sleep(ctx, 3*time.Second) == nil {
		s.pollJobs(ctx)
	}
}

func (s *soak) pollJobs(ctx context.Context) {
	out, err := s.elasticctl(ctx, "get", "jobs", "-o", "json")
	if err != nil {
		s.log.Debug("get jobs", "err", err)
		return
	}
	var views []struct {
		Spec     struct{ Name string }              `json:"spec"`
		Status   *struct{ Kind, Message string }    `json:"status"`
		Finished *struct{ Outcome, Message string } `json:"finished"`
	}
	if err := json.Unmarshal(out, &views); err != nil {
		s.log.Warn("get jobs: unreadable output", "err", err)
		return
	}
	for _, v := range views {
		state, msg := "Submitted", ""
		if v.Status != nil {
			state, msg = v.Status.Kind, v.Status.Message
		}
		if v.Finished != nil {
			state, msg = v.Finished.Outcome, v.Finished.Message
		}
		j, ended := s.jobs.status(v.Spec.Name, state, msg)
		if !ended {
			continue
		}
		s.jobEnded(ctx, j)
	}
}

func (s *soak) jobEnded(ctx context.Context, j *jobState) {
	switch {
	case j.state == "Failed":
		s.mu.Lock()
		s.failed++
		s.mu.Unlock()
		s.violate("no job is Failed", fmt.Sprintf("%s is Failed: %s\n  its last output lines:\n%s", j, j.message, indent(j.output, 12)))
	case j.maxStep < j.steps:
		s.violate("every job finishes its steps", fmt.Sprintf("%s Succeeded, but rank 0 reached step %d of %d\n  its last output lines:\n%s",
			j, j.maxStep, j.steps, indent(j.output, 12)))
	default:
		s.mu.Lock()
		s.completed++
		s.mu.Unlock()
		s.log.Info("job completed", "job", j.name, "steps", j.maxStep, "rank0_restarts", j.restarts, "took", j.ended.Sub(j.submitted).Round(time.Second))
	}
	// A job that ends is replaced during the warm-up (a DDP job may finish
	// before the slower worker job trained: the faults that need a DDP
	// worker then had no target for the whole run) and while the faults
	// have a quarter of their time left, so they always have two jobs to
	// hit and the last ones end soon after the faults.
	if s.resubmit.Load() && replaceEnded(s.phaseEnd.Load(), time.Now(), s.cfg.duration) {
		go func() {
			if err := s.submit(ctx, j.kind); err != nil && ctx.Err() == nil {
				s.log.Error("resubmit", "kind", j.kind, "err", err)
			}
		}()
	}
}

// replaceEnded says whether a job that ends now is replaced: always before
// the fault phase (phaseEnd 0: not started), then while more than a
// quarter of the fault phase is left.
func replaceEnded(phaseEnd int64, now time.Time, duration time.Duration) bool {
	return phaseEnd == 0 || time.Unix(0, phaseEnd).Sub(now) > duration/4
}

// --- the end ---

// teardown stops everything the soak started, whatever happened: node
// agents first (they drain their jobs), then the coordinators, then etcd;
// then any process of the tree still alive is an orphan, killed.
func (s *soak) teardown() {
	if s.sup == nil {
		return
	}
	s.resubmit.Store(false)
	if pid := s.stopped.Load(); pid != 0 {
		syscall.Kill(int(pid), syscall.SIGCONT)
	}
	var wg sync.WaitGroup
	for _, group := range [][]*child{s.agents, s.coords} {
		for _, c := range group {
			if c != nil {
				wg.Add(1)
				go func() { defer wg.Done(); s.sup.stop(c, 20*time.Second) }()
			}
		}
		wg.Wait()
	}
	for _, c := range s.sup.live() {
		s.sup.stop(c, 10*time.Second)
	}
	s.unmountMembers()
	if s.scan == nil {
		return
	}
	time.Sleep(time.Second)
	s.sup.reapOrphans(os.Getpid())
	left := s.scan.scan()
	for _, p := range left {
		s.mu.Lock()
		s.orphans++
		s.mu.Unlock()
		s.violate("nothing is orphaned", fmt.Sprintf("%s is still alive after every daemon was stopped; killed", p))
		syscall.Kill(p.pid, syscall.SIGKILL)
	}
	time.Sleep(200 * time.Millisecond)
	s.sup.reapOrphans(os.Getpid())
}

// report prints the figures, the faults and every broken invariant.
func (s *soak) report(w io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintln(w)
	fmt.Fprintf(w, "== soak: seed %d, %s of faults, took %s, %d etcd member(s)\n", s.cfg.seed, s.cfg.duration, time.Since(s.start).Round(time.Second), s.cfg.etcdMembers)
	fmt.Fprintln(w, "== faults")
	byKind := map[string]int{}
	for _, f := range s.faults {
		if f.skipped == "" {
			byKind[f.kind]++
		}
		fmt.Fprintf(w, "  %7s  %s\n", s.since(f.at), f)
	}
	fmt.Fprintln(w, "== jobs")
	for _, j := range s.jobs.snapshot() {
		fmt.Fprintf(w, "  %s\n", j)
	}
	fmt.Fprintf(w, "== invariants broken: %d\n", len(s.violations))
	for i, v := range s.violations {
		fmt.Fprintf(w, "  %d. [%s] %s\n     preceded by: %s\n     %s\n", i+1, s.since(v.at), v.invariant, v.after,
			strings.ReplaceAll(v.detail, "\n", "\n     "))
	}
	for _, k := range s.cfg.reportKinds() {
		fmt.Fprintf(w, "BENCH soak_faults_%s %d count\n", k, byKind[k])
	}
	fmt.Fprintf(w, "BENCH soak_jobs_completed %d count\n", s.completed)
	fmt.Fprintf(w, "BENCH soak_committed_steps_lost %d count target=0\n", s.lost)
	fmt.Fprintf(w, "BENCH soak_duplicate_rank_observations %d count target=0\n", s.dupObs)
	fmt.Fprintf(w, "BENCH soak_stale_round_observations %d count target=0\n", s.staleObs)
	fmt.Fprintf(w, "BENCH soak_orphans %d count target=0\n", s.orphans)
	if s.perJobUIDs {
		fmt.Fprintf(w, "BENCH soak_job_uid_observations %d count target=0\n", s.uidObs)
	}
	fmt.Fprintf(w, "BENCH soak_jobs_failed %d count target=0\n", s.failed)
	if s.cfg.keep {
		fmt.Fprintf(w, "logs: %s\n", filepath.Join(s.work, "logs"))
	}
}

func newestRound(ps []proc, job string) string {
	var n int64
	for _, p := range ps {
		if r, err := strconv.ParseInt(p.round, 10, 64); p.worker && p.job == job && err == nil {
			n = max(n, r)
		}
	}
	return strconv.FormatInt(n, 10)
}

func indent(lines []string, last int) string {
	if last > 0 && len(lines) > last {
		lines = lines[len(lines)-last:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

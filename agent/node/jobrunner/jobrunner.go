// Package jobrunner is the node agent's workload runtime: it starts a job's
// hyperpodrun on this node when the coordinator assigns the job to it (the
// node's own assignments, fleet.Keys.NodeAssignments, are all it watches),
// and drains it (SIGUSR2: checkpoint, leave, exit 0) when the job is
// moved off the node. Jobs run as plain processes (the process runtime).
//
// A job fails only when the job fails: a hyperpodrun that dies any other
// way than exit 0 is a node failure, restarted with a backoff while the job
// is placed here, until the job's global restart budget is spent. Each run
// of hyperpodrun is contained (see containment): when it exits, every
// process it left behind is killed and its TMPDIR removed.
package jobrunner

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/utils/clock"

	"github.com/hyperpodrun/hyperpodrun/agent/node/containers"
	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// Config tunes the runner.
type Config struct {
	// Hyperpodrun is the hyperpodrun binary (default: "hyperpodrun" on PATH).
	Hyperpodrun string
	// Endpoints are the etcd endpoints given to hyperpodrun.
	Endpoints []string
	// RdzvConf is extra --rdzv-conf for every job (e.g. lease_ttl=3).
	RdzvConf string
	// LogDir is the base of the jobs' log directories: a job's is
	// <LogDir>/<node>/<job>/ (its hyperpodrun's --log-dir), owned by the
	// job (see JobLogDir).
	LogDir string
	// Output receives the jobs' console output, each line prefixed with
	// "<node>/<job> " (default os.Stdout).
	Output io.Writer
	Logger *slog.Logger
	// TempDir (hyperpod-agent --job-run-dir) holds each run's own
	// directory (its TMPDIR: hyperpodrun's control directories and its
	// workers' temporary files; its etcd password file), removed when the
	// run ends (default: DefaultRunDir()). It must be root's (or the
	// agent's) and writable by no one else: see EnsureBaseDir. Keep it
	// short: the control socket's path must fit in 107 bytes.
	TempDir string
	// CgroupParent is the cgroup v2 directory under which each run gets a
	// cgroup (default: the agent's own cgroup on the cgroup2 mount);
	// NoCgroup contains runs by process tree instead (see containment).
	CgroupParent string
	// BackoffBase and BackoffMax bound the wait before a failed
	// hyperpodrun is restarted (defaults 1s and 30s): see Backoff.
	BackoffBase, BackoffMax time.Duration
	// HealthyAfter is how long a run must last for the next failure to
	// count as the first again (default 1m).
	HealthyAfter time.Duration
	// JobUser is who jobs run as (hyperpod-agent --job-user). Unset, they
	// run as the agent, which an agent running as root refuses unless
	// AllowRootJobs.
	JobUser       JobUser
	AllowRootJobs bool
	// UIDRange (hyperpod-agent --job-uid-range) runs each job as its own
	// uid, the one the coordinator gave it (fleet.Assignment.UID), which
	// must be in the range; it wins over JobUser. See identityFor.
	UIDRange UIDRange
	// AllowEnv lists run.env names allowed although refusedEnv refuses
	// them (--allow-job-env).
	AllowEnv []string
	// Containers runs the jobs that name run.image (the containerd
	// runtime); nil: such jobs fail on this node with the reason.
	Containers *containers.Runtime
	// ContainerHyperpodrun is a static hyperpodrun binary mounted into
	// containers whose job names no run.command.
	ContainerHyperpodrun string
	// ContainerStartTimeout bounds a container's pull and start (default
	// 15m).
	ContainerStartTimeout time.Duration
	// DrainMargin is what a drained run gets beyond the job's graceful
	// timeout before it is SIGKILLed (default 30s).
	DrainMargin time.Duration
	// DialJob connects to etcd as a job's own user, to read the job's
	// restart count and rendezvous (a node's user may not); default: the
	// Endpoints, without TLS.
	DialJob DialJob
	// Clock times the restart backoff (default: the real clock); tests
	// step a fake one past it.
	Clock clock.WithDelayedExecution
	// Tracer traces the runner's actions (tracing.go); nil: not traced.
	Tracer trace.TracerProvider
	// JobTracing is where the jobs export their traces (tracing.go).
	JobTracing JobTracing
}

// Runner implements nodeagent.Workloads.
type Runner struct {
	cfg  Config
	log  *slog.Logger
	mu   sync.Mutex
	jobs map[string]*proc // the running hyperpodrun of each job
	// lostData are the jobs whose hyperpodrun exited on finding that etcd
	// lost their records, until StopAll names them.
	lostData []string
	retry    map[string]*retry // jobs whose hyperpodrun failed on this node
	// doneHere holds the jobs whose hyperpodrun finished its part on this
	// node while other nodes still train: they are not started again here.
	doneHere map[string]bool
	// creds are the etcd credentials each placed job was started with:
	// the runner reads a job's own keys as the job (asjob.go).
	creds map[string]*fleet.JobCreds
	wg    sync.WaitGroup
	node  nodeagent.Node
	st    *fleet.Store
	// kick asks the Run loop to reconcile (a restart's backoff is over).
	kick chan struct{}
	box  *containment
	seq  int
	tmp  string // the directory of the runs' TMPDIRs
	// leaving: the node is drained; no job starts or restarts.
	leaving bool
	// resetting: etcd lost its data and StopAll stops (or stopped) every
	// job; nothing starts until the Run loop re-read the assignments after
	// StopAll (relistDue, relist): see dataloss.go.
	resetting, relistDue bool
	relist               chan struct{}
	// gens is the desired record's generation of each job (containers
	// are labelled with it).
	gens map[string]int64
	// adopted: the containers of an earlier agent were taken over (Run
	// loop only).
	adopted bool
	// quit ends the watches of containers when the runner stops without
	// a drain: the containers go on, for the next agent to adopt.
	quit chan struct{}
	// uids is the uid the coordinator gave each job (its assignment's).
	uids map[string]uint32
	// claims are the uids this runner claimed on the host, by job.
	claims map[string]uint32
	// problems are the jobs this runner wrote a problem record for, and
	// whether it says the job is restarting (a crash loop).
	problems map[string]bool
}

// proc is one run of a job's hyperpodrun: a host process or a container.
type proc struct {
	cmd         *exec.Cmd // the host process (nil for a container)
	done        chan struct{}
	draining    bool
	started     time.Time
	maxRestarts int
	box         *box
	// signal signals hyperpodrun; kill SIGKILLs the whole run. Both are
	// nil while a container is still being pulled or started (starting).
	signal   func(syscall.Signal) error
	kill     func()
	starting bool
	// grace bounds a drain; then the run is killed (deadline).
	grace    time.Duration
	deadline *time.Timer
	// healthy clears a crash loop's problem record once the run has
	// lasted HealthyAfter.
	healthy *time.Timer
	// drainedAt is when the run was first told to drain (its trace).
	drainedAt time.Time
}

// drain asks the run's hyperpodrun to checkpoint and leave (SIGUSR2) and
// SIGKILLs the run if it has not ended after its grace period; the
// caller holds r.mu.
func (p *proc) drain(log *slog.Logger, job string) {
	p.draining = true
	if p.drainedAt.IsZero() {
		p.drainedAt = time.Now()
	}
	if p.signal == nil {
		return // a container still starting: killed once up
	}
	if err := p.signal(syscall.SIGUSR2); err != nil {
		log.Warn("cannot signal the job's hyperpodrun to drain", "job", job, "err", err)
	}
	if p.deadline == nil && p.grace > 0 {
		kill := p.kill
		p.deadline = time.AfterFunc(p.grace, func() {
			log.Warn("the job's drained hyperpodrun did not exit within its grace period: killing it", "job", job, "grace", p.grace)
			kill()
		})
	}
}

// retry is the restart state of a job whose hyperpodrun failed.
type retry struct {
	failures  int       // consecutive node failures
	notBefore time.Time // no restart before
	timer     clock.Timer
}

// New returns a runner.
func New(cfg Config) *Runner {
	if cfg.Hyperpodrun == "" {
		cfg.Hyperpodrun = "hyperpodrun"
	}
	if cfg.Output == nil {
		cfg.Output = os.Stdout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TempDir == "" {
		cfg.TempDir = DefaultRunDir()
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = time.Second
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = 30 * time.Second
	}
	if cfg.HealthyAfter <= 0 {
		cfg.HealthyAfter = time.Minute
	}
	if cfg.DrainMargin <= 0 {
		cfg.DrainMargin = 30 * time.Second
	}
	if cfg.ContainerStartTimeout <= 0 {
		cfg.ContainerStartTimeout = 15 * time.Minute
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Runner{cfg: cfg, log: cfg.Logger, jobs: map[string]*proc{}, retry: map[string]*retry{}, doneHere: map[string]bool{}, creds: map[string]*fleet.JobCreds{}, kick: make(chan struct{}, 1), relist: make(chan struct{}, 1), gens: map[string]int64{}, quit: make(chan struct{}),
		uids: map[string]uint32{}, claims: map[string]uint32{}, problems: map[string]bool{}}
}

// DefaultRunDir is the default base of the runs' directories:
// /run/hyperpod-agent for an agent running as root, else
// $TMPDIR/hyperpod-agent-<uid> (refused if someone else made it first).
func DefaultRunDir() string {
	if os.Geteuid() == 0 {
		return "/run/hyperpod-agent"
	}
	return filepath.Join(os.TempDir(), "hyperpod-agent-"+strconv.Itoa(os.Geteuid()))
}

var _ nodeagent.Workloads = (*Runner)(nil)

// Backoff is the wait before restarting a hyperpodrun after its n-th
// consecutive failure on this node (n >= 1): base, doubling with each
// failure, at most max.
func Backoff(n int, base, max time.Duration) time.Duration {
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// Run reconciles the jobs on this node with the desired records until ctx
// ends; then (an agent crash) the jobs are killed as they would be with the
// node.
func (r *Runner) Run(ctx context.Context, node nodeagent.Node) error {
	r.node = node
	r.st = fleet.New(node.Client, node.Prefix)
	r.log = r.log.With("node", node.Name)
	r.box = newContainment(r.cfg.CgroupParent, r.log)
	// 0711, root's: a job reaches its own run's directory (made for it)
	// but cannot list or add to the others'.
	base, err := EnsureBaseDir(r.cfg.TempDir)
	if err != nil {
		return fmt.Errorf("jobrunner: the runs' directory (--job-run-dir): %w", err)
	}
	base.Close()
	r.tmp = filepath.Clean(r.cfg.TempDir)
	// The host-process runs of this node's previous agent died with it;
	// their directories (a job's password file among them) go now.
	if n, err := removeStaleRuns(r.tmp, node.Name); err != nil {
		r.log.Warn("cannot remove the run directories an earlier agent of this node left", "dir", r.tmp, "err", err)
	} else if n > 0 {
		r.log.Info("removed the run directories an earlier agent of this node left", "dir", r.tmp, "runs", n)
	}
	if r.cfg.JobUser.Set || r.cfg.UIDRange.Set() {
		for _, d := range []string{r.tmp, r.cfg.LogDir} {
			if u := unsearchable(d); d != "" && u != "" {
				r.log.Warn("jobs run as other users but cannot reach their directories: a directory on the way is not searchable by others; chmod o+x it, or pick another directory",
					"dir", d, "not_searchable", u)
			}
		}
	}
	defer r.killAll()
	if r.cfg.Containers != nil {
		// Containers started by an earlier agent of this node go on as
		// this agent's runs: no duplicate, no orphan. Until containerd
		// answers, no container job starts here (start retries it).
		if err := r.adoptContainers(ctx); err != nil {
			r.log.Warn("cannot list this node's containers to adopt them; container jobs wait for containerd", "err", err)
		}
	}
	// Only this node's assignments: one decision costs this agent a
	// watch event only when it touches this node.
	prefix := r.st.Keys.NodeAssignments(node.Name)
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, etcdTimeout)
		resp, err := node.Client.Get(rctx, prefix, clientv3.WithPrefix())
		cancel()
		if err != nil {
			r.log.Warn("read this node's assignments", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		placed := map[string]bool{}
		for _, kv := range resp.Kvs {
			r.apply(placed, kv.Key, kv.Value)
		}
		r.relisted()
		r.reconcile(ctx, placed)
		wctx, wcancel := context.WithCancel(ctx)
		wch := node.Client.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	watch:
		for {
			select {
			case <-ctx.Done():
				break watch
			case <-r.kick:
				r.reconcile(ctx, placed)
			case <-r.relist:
				break watch // etcd lost its data: read the assignments afresh
			case <-tick.C:
				r.box.adopt(r.markers())
			case w, ok := <-wch:
				if !ok || w.Err() != nil {
					break watch
				}
				for _, ev := range w.Events {
					if ev.Type == clientv3.EventTypeDelete {
						if _, job, ok := r.st.Keys.AssignmentOwner(string(ev.Kv.Key)); ok {
							delete(placed, job)
						}
						continue
					}
					r.apply(placed, ev.Kv.Key, ev.Kv.Value)
				}
				r.reconcile(ctx, placed)
			}
		}
		wcancel()
	}
	return nil
}

// markers lists the running runs' markers.
func (r *Runner) markers() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var m []string
	for _, p := range r.jobs {
		if p.box != nil {
			m = append(m, p.box.marker)
		}
	}
	return m
}

// etcdTimeout bounds every etcd call of the runner.
const etcdTimeout = 5 * time.Second

// apply records that an assignment places its job on this node. A
// malformed record is logged with its key and leaves the job as it was.
func (r *Runner) apply(placed map[string]bool, key, value []byte) {
	a, err := fleet.DecodeAssignment(string(key), value)
	if err != nil {
		r.log.Warn("ignoring malformed assignment", "key", fleet.ClipKey(key), "err", err)
		return
	}
	placed[a.Job] = true
	r.gens[a.Job] = a.Generation
	r.uids[a.Job] = a.UID
}

// reconcile starts jobs placed here (a failed one once its backoff is
// over), drains jobs moved away and forgets the failures of jobs no longer
// placed here. The runner's lock is never held across an etcd call.
func (r *Runner) reconcile(ctx context.Context, placed map[string]bool) {
	var start []string
	now := r.cfg.Clock.Now()
	r.mu.Lock()
	for job, p := range r.jobs {
		if !placed[job] && !p.draining {
			r.log.Info("job moved off this node: draining its hyperpodrun", "job", job)
			p.drain(r.log, job)
		}
	}
	for job, rt := range r.retry {
		if !placed[job] {
			if _, running := r.jobs[job]; !running {
				r.log.Info("job no longer placed on this node: its failed hyperpodrun is not restarted", "job", job)
			}
			rt.timer.Stop()
			delete(r.retry, job)
		}
	}
	// A job that left the node (placed elsewhere, no run here) gives its
	// uid back, and its problem record goes.
	var gone []string
	for job := range r.claims {
		if _, running := r.jobs[job]; !placed[job] && !running {
			gone = append(gone, job)
		}
	}
	for job := range r.problems {
		if _, running := r.jobs[job]; !placed[job] && !running && !slices.Contains(gone, job) {
			gone = append(gone, job)
		}
	}
	for job := range r.doneHere {
		if !placed[job] {
			delete(r.doneHere, job)
		}
	}
	for job := range r.creds {
		if _, running := r.jobs[job]; !placed[job] && !running {
			delete(r.creds, job)
		}
	}
	for job, here := range placed {
		if _, running := r.jobs[job]; !here || running || r.leaving || r.resetting || r.doneHere[job] {
			continue
		}
		if rt := r.retry[job]; rt != nil && now.Before(rt.notBefore) {
			continue // its timer kicks the loop
		}
		start = append(start, job)
	}
	r.mu.Unlock()
	for _, job := range gone {
		r.leave(job)
	}
	sort.Strings(start)
	for _, job := range start {
		if err := r.start(ctx, job); err != nil {
			r.restartLater(job, fmt.Sprintf("cannot start: %v", err), 0)
		}
	}
}

// poke asks the Run loop to reconcile.
func (r *Runner) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// retryOf returns a job's restart state, made if need be; the caller
// holds r.mu.
func (r *Runner) retryOf(job string) *retry {
	rt := r.retry[job]
	if rt == nil {
		rt = &retry{timer: r.cfg.Clock.AfterFunc(time.Hour, r.poke)}
		rt.timer.Stop()
		r.retry[job] = rt
	}
	return rt
}

// forget drops a job's restart state.
func (r *Runner) forget(job string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rt := r.retry[job]; rt != nil {
		rt.timer.Stop()
		delete(r.retry, job)
	}
}

// Args builds the hyperpodrun command line of a job on a node.
func Args(spec fleet.JobSpec, endpoints []string, prefix, rdzvConf, logDir string) []string {
	nproc := spec.Run.NProcPerNode
	if nproc == "" {
		nproc = "1"
	}
	// maxNodes defaults to minNodes (and both to the ends of sizes):
	// the same bounds the coordinator sizes the job within.
	minN, maxN := spec.Bounds()
	conf := "prefix=" + prefix
	// The rendezvous forms rounds only of the sizes the engine allows.
	if sc := rendezvous.SizesConf(spec.Job); sc != "" {
		conf += "," + sc
	}
	if rdzvConf != "" {
		conf += "," + rdzvConf
	}
	args := []string{
		"--nnodes", fmt.Sprintf("%d:%d", minN, maxN), "--nproc-per-node", nproc,
		"--rdzv-backend", "etcd", "--rdzv-endpoint", strings.Join(endpoints, ","),
		"--rdzv-id", spec.Name, "--rdzv-conf", conf,
		"--max-restarts", strconv.Itoa(spec.Run.MaxRestarts),
	}
	if spec.Run.GracefulTimeoutSeconds > 0 {
		args = append(args, "--graceful-timeout", strconv.FormatFloat(spec.Run.GracefulTimeoutSeconds, 'f', -1, 64))
	}
	if spec.Run.InProcessResize {
		args = append(args, "--inprocess-resize")
	}
	if logDir != "" {
		args = append(args, "--log-dir", logDir)
	}
	switch {
	case spec.Run.NoPython:
		args = append(args, "--no-python")
	case spec.Run.Module:
		args = append(args, "-m")
	}
	return append(append(args, spec.Run.Script), spec.Run.Args...)
}

// credsConf adds a job's etcd credentials to the --rdzv-conf the agent
// gives every job: the user, and the password in a file of mode 0600 in
// the run's own directory, the job's alone (never on the command line,
// never the agent's).
func credsConf(conf string, creds *fleet.JobCreds, dir string, id Identity) (string, error) {
	if creds == nil {
		return conf, nil
	}
	if strings.ContainsAny(creds.User, ",= ") {
		return "", fmt.Errorf("job %s's credentials record names user %q, which cannot pass in --rdzv-conf", creds.Job, creds.User)
	}
	pw := filepath.Join(dir, "etcd.password")
	if err := WriteJobFile(dir, "etcd.password", []byte(creds.Password+"\n"), id); err != nil {
		return "", fmt.Errorf("write the job's etcd password file: %w", err)
	}
	add := "user=" + creds.User + ",password_file=" + pw
	if conf == "" {
		return add, nil
	}
	return conf + "," + add, nil
}

// start starts a run of a job's hyperpodrun, unless the job has finished
// or runs already. Each run has its own TMPDIR and containment; when
// hyperpodrun exits, every process of the run is killed and both are
// removed before the exit is judged (exited).
func (r *Runner) start(ctx context.Context, job string) (err error) {
	defer r.traceStart(ctx, job)(&err)
	l, err := r.prepare(ctx, job)
	if err != nil || l == nil {
		return err
	}
	if l.spec.Run.Image != "" {
		return r.startContainer(ctx, l.spec, l.env, l.creds, l.id)
	}
	return r.startProcess(job, l)
}

// launch is what a run of a job starts with.
type launch struct {
	spec  *fleet.JobSpec
	id    Identity // who it runs as
	env   []string // its spec's environment and the torchrun contract
	creds *fleet.JobCreds
}

// prepare reads what a run of job needs: its spec, who it runs as (with
// its uid claimed), its environment and its etcd credentials. It returns
// nil and no error when there is nothing to start: the job has finished,
// or its environment was refused and the job marked failed.
func (r *Runner) prepare(ctx context.Context, job string) (*launch, error) {
	rctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	fin, problem, err := r.st.FinishOf(rctx, job)
	if err != nil {
		return nil, err
	}
	if problem != nil {
		r.log.Warn("ignoring malformed finish record", "err", problem)
	}
	if fin != nil {
		return nil, nil // finished: the coordinator releases it
	}
	spec, err := r.st.Job(rctx, job)
	if err != nil {
		return nil, err
	}
	// Who the job runs as: its own uid (--job-uid-range), --job-user, or
	// (a container) its image's user; a host process may not run as
	// root unasked.
	id, why := identityFor(IdentityPolicy{AgentUID: os.Geteuid(), Range: r.cfg.UIDRange, User: r.cfg.JobUser, AllowRoot: r.cfg.AllowRootJobs},
		job, r.uids[job], spec.Run.Image != "")
	if why != "" {
		if r.cfg.UIDRange.Set() {
			r.problem(job, why)
			r.noteProblem(job, false)
		}
		return nil, errors.New(why)
	}
	if id.Set && r.cfg.UIDRange.Set() {
		if err := r.claimUID(job, id.UID); err != nil {
			msg := fmt.Sprintf("cannot run the job as uid %d on this host: %v", id.UID, err)
			r.problem(job, msg)
			r.noteProblem(job, false)
			return nil, errors.New(msg)
		}
	}
	// The job's environment: its spec and the torchrun contract, nothing
	// of the agent's. A refused variable fails the job with the reason
	// (elasticctl describe job); the node is not at fault.
	baseEnv, err := jobEnv(*spec, EnvOptions{Allow: r.cfg.AllowEnv, Home: id.Home}, nil)
	if err != nil {
		r.log.Warn("job refused", "job", job, "err", err)
		if ferr := r.st.MarkFinished(rctx, job, fleet.Finish{Outcome: fleet.Failed, Node: r.node.Name, Message: err.Error(), Time: time.Now().UTC()}); ferr != nil {
			return nil, fmt.Errorf("%w (and recording it: %v)", err, ferr)
		}
		return nil, nil
	}
	// The job's own etcd user (etcd auth on: the coordinator minted it);
	// never the agent's.
	creds, err := r.st.NodeCreds(rctx, r.node.Name, job)
	if err != nil {
		return nil, err
	}
	r.rememberCreds(job, creds)
	return &launch{spec: spec, id: id, env: baseEnv, creds: creds}, nil
}

// startProcess starts job's hyperpodrun as a host process, unless it runs
// already.
func (r *Runner) startProcess(job string, l *launch) error {
	spec, id := l.spec, l.id
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, running := r.jobs[job]; running || !r.mayStart() {
		return nil
	}
	// The job's own directories, made for it (never a walk, never a
	// symlink followed): its log directory on this node and the run's.
	logDir := ""
	if r.cfg.LogDir != "" {
		var err error
		if logDir, err = JobLogDir(r.cfg.LogDir, r.node.Name, job, id); err != nil {
			return fmt.Errorf("the job's log directory: %w", err)
		}
	}
	tmp, err := RunDir(r.tmp, processRunPrefix(r.node.Name), id)
	if err != nil {
		return err
	}
	r.seq++
	b := r.box.open(fmt.Sprintf("%d.%s.%s", r.seq, r.node.Name, job))
	rdzvConf, err := credsConf(r.cfg.RdzvConf, l.creds, tmp, id)
	if err != nil {
		b.abandon()
		os.RemoveAll(tmp)
		return err
	}
	tenv, err := r.jobTracingEnv(spec, tmp, tmp, id)
	if err != nil {
		b.abandon()
		os.RemoveAll(tmp)
		return err
	}
	cmd := r.hyperpodrunCmd(l, Args(*spec, r.cfg.Endpoints, r.st.Keys.Prefix(), rdzvConf, logDir), tmp, b.marker)
	cmd.Env = append(cmd.Env, tenv...)
	b.apply(cmd.SysProcAttr)
	// A pipe of our own, not an io.Writer: Wait then returns when
	// hyperpodrun exits even while a descendant still holds the pipe.
	pr, pw, err := os.Pipe()
	if err != nil {
		b.abandon()
		os.RemoveAll(tmp)
		return fmt.Errorf("output pipe: %w", err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	cloned := cmd.SysProcAttr.UseCgroupFD
	err = cmd.Start()
	if err != nil && cloned {
		r.log.Info("cannot start hyperpodrun inside its cgroup; moving it there once started", "job", job, "err", err)
		b.noCloneIntoCgroup(cmd.SysProcAttr)
		cloned = false
		cmd = rebuild(cmd)
		err = cmd.Start()
	}
	pw.Close()
	if err != nil {
		pr.Close()
		b.abandon()
		os.RemoveAll(tmp)
		return fmt.Errorf("start hyperpodrun: %w", err)
	}
	b.started(cmd.Process.Pid, cloned)
	r.log.Info("started job", "job", job, "pid", cmd.Process.Pid, "cgroup", b.cg, "tmpdir", tmp)
	pid := cmd.Process.Pid
	p := &proc{cmd: cmd, done: make(chan struct{}), started: time.Now(), maxRestarts: spec.Run.MaxRestarts, box: b, grace: graceOf(spec, r.cfg.DrainMargin),
		signal: func(sig syscall.Signal) error { return syscall.Kill(pid, sig) },
		kill:   func() { syscall.Kill(-pid, syscall.SIGKILL) }}
	r.jobs[job] = p
	r.started(job, p)
	r.watchRun(job, p, pr, tmp)
	return nil
}

// hyperpodrunCmd is the command of a run of l's job: hyperpodrun with args,
// its environment (TMPDIR tmp, the containment marker), its working
// directory, its own session and who it runs as.
func (r *Runner) hyperpodrunCmd(l *launch, args []string, tmp, marker string) *exec.Cmd {
	spec, id := l.spec, l.id
	cmd := exec.Command(r.cfg.Hyperpodrun, args...)
	// The job's own TMPDIR, if it sets one, wins (and is not removed).
	cmd.Env = append(l.env, "HYPERPODRUN_NODE_ID="+r.node.Name, "TMPDIR="+tmp, MarkerEnv+"="+marker)
	if spec.Run.Python != "" {
		cmd.Env = append(cmd.Env, "PYTHON_EXEC="+spec.Run.Python)
	}
	for _, k := range []string{"TMPDIR"} {
		if v, ok := spec.Run.Env[k]; ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	// A job with a uid of its own has no home but its run's directory.
	if _, own := spec.Run.Env["HOME"]; id.Set && id.Home == "" && !own {
		cmd.Env = append(cmd.Env, "HOME="+tmp)
	}
	cmd.Dir = spec.Run.WorkDir
	// Its own session: the fallback finds the run's processes by it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if id.Set {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: []uint32{}}
	}
	return cmd
}

// watchRun copies the run's output (pr) to the agent's, prefixed, and
// when hyperpodrun exits kills what is left of the run, removes its
// TMPDIR and judges the exit.
func (r *Runner) watchRun(job string, p *proc, pr *os.File, tmp string) {
	cmd, b := p.cmd, p.box
	prefix := r.node.Name + "/" + job + " "
	output := make(chan struct{})
	var lastLine string // the run's last line of output (a crash's reason)
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		defer close(output)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintln(r.cfg.Output, prefix+sc.Text())
			if t := strings.TrimSpace(sc.Text()); t != "" {
				lastLine = t
			}
		}
		io.Copy(io.Discard, pr)
	}()
	go func() {
		defer r.wg.Done()
		waitExited(cmd.Process.Pid)
		if err := b.kill(); err != nil {
			r.log.Error("cannot kill every process of the job's run", "job", job, "err", err)
		}
		err := cmd.Wait()
		ran := time.Since(p.started)
		// The output ends with the run's processes; should one have
		// escaped, it does not hold the reader.
		pr.SetReadDeadline(time.Now().Add(time.Second))
		<-output
		pr.Close()
		if err := os.RemoveAll(tmp); err != nil {
			r.log.Warn("cannot remove the run's TMPDIR", "job", job, "dir", tmp, "err", err)
		}
		if err != nil && lastLine != "" {
			err = &runError{err: err, output: lastLine}
		}
		draining := r.release(job, p, err != nil)
		if draining {
			r.traceDrain(job, p.drainedAt, err)
		}
		r.exited(job, err, draining, ran, p.maxRestarts)
	}()
}

// runError is a run's failure with its last line of output.
type runError struct {
	err    error
	output string
}

func (e *runError) Error() string { return e.err.Error() + ": " + e.output }
func (e *runError) Unwrap() error { return e.err }

// release forgets a run that ended (or never started) and reports whether
// it was being drained. A failed run that was not drained is not
// restarted until exited has judged the failure.
func (r *Runner) release(job string, p *proc, failed bool) (draining bool) {
	r.mu.Lock()
	draining = p.draining
	delete(r.jobs, job)
	if p.deadline != nil {
		p.deadline.Stop()
	}
	if p.healthy != nil {
		p.healthy.Stop()
	}
	if !draining && failed && !r.leaving {
		r.retryOf(job).notBefore = r.cfg.Clock.Now().Add(24 * time.Hour)
	}
	r.mu.Unlock()
	close(p.done)
	return draining
}

// rebuild makes a fresh command like cmd (an exec.Cmd starts once).
func rebuild(cmd *exec.Cmd) *exec.Cmd {
	c := exec.Command(cmd.Path, cmd.Args[1:]...)
	c.Env, c.Dir, c.SysProcAttr = cmd.Env, cmd.Dir, cmd.SysProcAttr
	c.Stdout, c.Stderr = cmd.Stdout, cmd.Stderr
	return c
}

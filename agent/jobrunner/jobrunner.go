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
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/agent/containers"
	"github.com/hyperpodrun/hyperpodrun/agent/nodeagent"
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
	// LogDir is the base --log-dir of the jobs.
	LogDir string
	// Output receives the jobs' console output, each line prefixed with
	// "<node>/<job> " (default os.Stdout).
	Output io.Writer
	Logger *slog.Logger
	// TempDir holds each run's own TMPDIR (hyperpodrun's control
	// directories and its workers' temporary files), removed when the run
	// ends (default: "hyperpod-agent-<pid>" in os.TempDir()). Keep it
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
}

// Runner implements nodeagent.Workloads.
type Runner struct {
	cfg   Config
	log   *slog.Logger
	mu    sync.Mutex
	jobs  map[string]*proc  // the running hyperpodrun of each job
	retry map[string]*retry // jobs whose hyperpodrun failed on this node
	// doneHere holds the jobs whose hyperpodrun finished its part on this
	// node while other nodes still train: they are not started again here.
	doneHere map[string]bool
	wg       sync.WaitGroup
	node     nodeagent.Node
	st       *fleet.Store
	// kick asks the Run loop to reconcile (a restart's backoff is over).
	kick chan struct{}
	box  *containment
	seq  int
	tmp  string // the directory of the runs' TMPDIRs
	// leaving: the node is drained; no job starts or restarts.
	leaving bool
	// gens is the desired record's generation of each job (containers
	// are labelled with it).
	gens map[string]int64
	// adopted: the containers of an earlier agent were taken over (Run
	// loop only).
	adopted bool
	// quit ends the watches of containers when the runner stops without
	// a drain: the containers go on, for the next agent to adopt.
	quit chan struct{}
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
}

// drain asks the run's hyperpodrun to checkpoint and leave (SIGUSR2) and
// SIGKILLs the run if it has not ended after its grace period; the
// caller holds r.mu.
func (p *proc) drain(log *slog.Logger, job string) {
	p.draining = true
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
	timer     *time.Timer
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
		cfg.TempDir = filepath.Join(os.TempDir(), "hyperpod-agent-"+strconv.Itoa(os.Getpid()))
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
	return &Runner{cfg: cfg, log: cfg.Logger, jobs: map[string]*proc{}, retry: map[string]*retry{}, doneHere: map[string]bool{}, kick: make(chan struct{}, 1), gens: map[string]int64{}, quit: make(chan struct{})}
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
	// 0711: a job user may reach its own run's directory (chowned to it)
	// but not list the others'.
	err := os.MkdirAll(r.cfg.TempDir, 0o711)
	if err == nil {
		err = os.Chmod(r.cfg.TempDir, 0o711)
	}
	if err != nil {
		return fmt.Errorf("jobrunner: make the runs' temporary directory: %w", err)
	}
	r.tmp = r.cfg.TempDir
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
			case <-tick.C:
				r.box.adopt(r.markers())
			case w, ok := <-wch:
				if !ok || w.Err() != nil {
					break watch
				}
				for _, ev := range w.Events {
					if ev.Type == clientv3.EventTypeDelete {
						delete(placed, strings.TrimPrefix(string(ev.Kv.Key), prefix))
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
		r.log.Warn("ignoring malformed assignment", "key", string(key), "err", err)
		return
	}
	placed[a.Job] = true
	r.gens[a.Job] = a.Generation
}

// reconcile starts jobs placed here (a failed one once its backoff is
// over), drains jobs moved away and forgets the failures of jobs no longer
// placed here. The runner's lock is never held across an etcd call.
func (r *Runner) reconcile(ctx context.Context, placed map[string]bool) {
	var start []string
	now := time.Now()
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
	for job := range r.doneHere {
		if !placed[job] {
			delete(r.doneHere, job)
		}
	}
	for job, here := range placed {
		if _, running := r.jobs[job]; !here || running || r.leaving || r.doneHere[job] {
			continue
		}
		if rt := r.retry[job]; rt != nil && now.Before(rt.notBefore) {
			continue // its timer kicks the loop
		}
		start = append(start, job)
	}
	r.mu.Unlock()
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
		rt = &retry{timer: time.AfterFunc(time.Hour, r.poke)}
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

// restartLater schedules a restart of a job's hyperpodrun after its
// backoff; a run that lasted HealthyAfter starts the backoff over.
func (r *Runner) restartLater(job, why string, ran time.Duration, attrs ...any) {
	r.mu.Lock()
	rt := r.retryOf(job)
	if ran >= r.cfg.HealthyAfter {
		rt.failures = 0
	}
	rt.failures++
	d := Backoff(rt.failures, r.cfg.BackoffBase, r.cfg.BackoffMax)
	rt.notBefore = time.Now().Add(d)
	rt.timer.Reset(d)
	n := rt.failures
	r.mu.Unlock()
	r.log.Warn("node failure: restarting the job's hyperpodrun after a backoff while the job is placed on this node",
		append([]any{"job", job, "why", why, "backoff", d, "consecutive_failures", n}, attrs...)...)
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
// the run's own directory (never on the command line, never the agent's).
func credsConf(conf string, creds *fleet.JobCreds, dir string) (string, error) {
	if creds == nil {
		return conf, nil
	}
	if strings.ContainsAny(creds.User, ",= ") {
		return "", fmt.Errorf("job %s's credentials record names user %q, which cannot pass in --rdzv-conf", creds.Job, creds.User)
	}
	pw := filepath.Join(dir, "etcd.password")
	if err := os.WriteFile(pw, []byte(creds.Password+"\n"), 0o600); err != nil {
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
func (r *Runner) start(ctx context.Context, job string) error {
	rctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	fin, problem, err := r.st.FinishOf(rctx, job)
	if err != nil {
		return err
	}
	if problem != nil {
		r.log.Warn("ignoring malformed finish record", "err", problem)
	}
	if fin != nil {
		return nil // finished: the coordinator releases it
	}
	spec, err := r.st.Job(rctx, job)
	if err != nil {
		return err
	}
	// A container is the job's boundary: it runs as the image's user
	// (or --job-user); a host process may not run as root unasked.
	if why := refuseRoot(os.Geteuid(), r.cfg.JobUser, r.cfg.AllowRootJobs); why != "" && spec.Run.Image == "" {
		return errors.New(why)
	}
	// The job's environment: its spec and the torchrun contract, nothing
	// of the agent's. A refused variable fails the job with the reason
	// (elasticctl describe job); the node is not at fault.
	baseEnv, err := jobEnv(*spec, EnvOptions{Allow: r.cfg.AllowEnv, Home: r.cfg.JobUser.Home}, nil)
	if err != nil {
		r.log.Warn("job refused", "job", job, "err", err)
		if ferr := r.st.MarkFinished(rctx, job, fleet.Finish{Outcome: fleet.Failed, Node: r.node.Name, Message: err.Error(), Time: time.Now().UTC()}); ferr != nil {
			return fmt.Errorf("%w (and recording it: %v)", err, ferr)
		}
		return nil
	}
	// The job's own etcd user (etcd auth on: the coordinator minted it);
	// never the agent's.
	creds, err := r.st.Creds(rctx, job)
	if err != nil {
		return err
	}
	if spec.Run.Image != "" {
		return r.startContainer(ctx, spec, baseEnv, creds)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, running := r.jobs[job]; running {
		return nil
	}
	logDir := ""
	if r.cfg.LogDir != "" {
		logDir = filepath.Join(r.cfg.LogDir, r.node.Name)
	}
	tmp, err := os.MkdirTemp(r.tmp, "")
	if err != nil {
		return fmt.Errorf("make the run's TMPDIR: %w", err)
	}
	r.seq++
	b := r.box.open(fmt.Sprintf("%d.%s.%s", r.seq, r.node.Name, job))
	rdzvConf, err := credsConf(r.cfg.RdzvConf, creds, tmp)
	if err != nil {
		b.abandon()
		os.RemoveAll(tmp)
		return err
	}
	args := Args(*spec, r.cfg.Endpoints, r.st.Keys.Prefix(), rdzvConf, logDir)
	cmd := exec.Command(r.cfg.Hyperpodrun, args...)
	// The job's own TMPDIR, if it sets one, wins (and is not removed).
	cmd.Env = append(baseEnv, "HYPERPODRUN_NODE_ID="+r.node.Name, "TMPDIR="+tmp, MarkerEnv+"="+b.marker)
	if spec.Run.Python != "" {
		cmd.Env = append(cmd.Env, "PYTHON_EXEC="+spec.Run.Python)
	}
	for _, k := range []string{"TMPDIR"} {
		if v, ok := spec.Run.Env[k]; ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Dir = spec.Run.WorkDir
	// Its own session: the fallback finds the run's processes by it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if u := r.cfg.JobUser; u.Set {
		// The run's own directories become the job user's; nothing of
		// the agent's is.
		for _, d := range []string{tmp, logDir} {
			if d == "" {
				continue
			}
			if err := os.MkdirAll(d, 0o755); err == nil {
				err = filepath.WalkDir(d, func(p string, _ os.DirEntry, err error) error {
					if err != nil {
						return err
					}
					return os.Lchown(p, int(u.UID), int(u.GID))
				})
			}
			if err != nil {
				b.abandon()
				os.RemoveAll(tmp)
				return fmt.Errorf("give %s to the job user %d: %w", d, u.UID, err)
			}
		}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}
	}
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
	prefix := r.node.Name + "/" + job + " "
	output := make(chan struct{})
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		defer close(output)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintln(r.cfg.Output, prefix+sc.Text())
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
		draining := r.release(job, p, err != nil)
		r.exited(job, err, draining, ran, p.maxRestarts)
	}()
	return nil
}

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
	if !draining && failed && !r.leaving {
		r.retryOf(job).notBefore = time.Now().Add(24 * time.Hour)
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

// exited judges a run's end. Drained: nothing to do. Exit 0: the job
// finished training (Succeeded). Any other end (a non-zero exit, a signal,
// an error) is a node failure, restarted after a backoff while the job is
// placed here, unless the job's global restart budget is spent: its
// restart count exceeds maxRestarts, as hyperpodrun itself decides (then
// Failed).
func (r *Runner) exited(job string, err error, draining bool, ran time.Duration, maxRestarts int) {
	if draining || err == nil {
		r.forget(job)
	}
	ctx, cancel := context.WithTimeout(context.Background(), etcdTimeout)
	defer cancel()
	switch {
	case draining:
		r.log.Info("job drained off this node", "job", job, "err", err)
		return
	case err == nil:
		r.finishedHere(ctx, job, "its workers succeeded")
		return
	}
	if done, ferr := rendezvous.JobFinished(ctx, r.node.Client, r.st.Keys.Prefix(), job); ferr == nil && done {
		// A node that joined after every other node finished is refused
		// (exit 1, as torchrun's closed rendezvous): not a node failure.
		r.forget(job)
		r.finishedHere(ctx, job, "the job had already finished when it joined")
		return
	}
	why := describeExit(err)
	n, problem, rerr := r.st.Restarts(ctx, job)
	if problem != nil {
		r.log.Warn("malformed restart count", "job", job, "err", problem)
	}
	if rerr != nil {
		r.restartLater(job, why, ran, "restart_count_unknown", rerr.Error())
		return
	}
	if n > int64(maxRestarts) {
		msg := fmt.Sprintf("hyperpodrun %s; the job's %d restart(s) exceed maxRestarts %d (counted for the whole job)", why, n, maxRestarts)
		r.forget(job)
		r.log.Warn("job failed: its restart budget is spent", "job", job, "why", why, "restarts", n, "max_restarts", maxRestarts)
		if err := r.st.MarkFinished(ctx, job, fleet.Finish{Outcome: fleet.Failed, Node: r.node.Name, Message: msg, Time: time.Now().UTC()}); err != nil {
			r.log.Error("cannot record the job's failure", "job", job, "err", err)
		}
		return
	}
	r.restartLater(job, why, ran, "restarts", n, "max_restarts", maxRestarts)
}

// finishedHere records that the job's hyperpodrun on this node is done:
// it is not started here again while the job stays placed. The job itself
// succeeded only when no node is left in its rendezvous (each node leaves
// it before its hyperpodrun exits, so the last one to exit sees none): a
// node whose ranks finish first must not end the job for the others.
func (r *Runner) finishedHere(ctx context.Context, job, why string) {
	r.mu.Lock()
	r.doneHere[job] = true
	r.mu.Unlock()
	left, err := r.st.Members(ctx, job)
	switch {
	case err != nil:
		r.log.Warn("this node's part of the job is done; cannot tell whether other nodes still train", "job", job, "why", why, "err", err)
	case left > 0:
		r.log.Info("this node's part of the job is done; the job goes on on other nodes", "job", job, "why", why, "nodes_left", left)
	default:
		r.log.Info("job finished: no node is left in its rendezvous", "job", job, "why", why)
		if err := r.st.MarkFinished(ctx, job, fleet.Finish{Outcome: fleet.Succeeded, Node: r.node.Name, Time: time.Now().UTC()}); err != nil {
			r.log.Error("cannot record the job's success", "job", job, "err", err)
		}
	}
}

// describeExit says how a hyperpodrun ended.
func describeExit(err error) string {
	var ce *containerExit
	if errors.As(err, &ce) {
		return "(in its container) " + ce.Error()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "was killed by " + ws.Signal().String()
		}
		return fmt.Sprintf("exited with status %d", ee.ExitCode())
	}
	return "failed: " + err.Error()
}

// Drain drains every job on the node and waits for them to leave.
func (r *Runner) Drain(ctx context.Context) error {
	r.mu.Lock()
	r.leaving = true
	for job, rt := range r.retry {
		rt.timer.Stop()
		delete(r.retry, job)
	}
	var waits []chan struct{}
	for job, p := range r.jobs {
		p.drain(r.log, job)
		waits = append(waits, p.done)
	}
	r.mu.Unlock()
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			r.killAll()
			return ctx.Err()
		}
	}
	return nil
}

// killAll SIGKILLs every job's hyperpodrun (the rest of each run dies
// with it), cancels pending restarts and waits for the runner's goroutines.
func (r *Runner) killAll() {
	r.mu.Lock()
	for _, p := range r.jobs {
		if p.cmd == nil {
			continue // a container: it outlives the agent, the next one adopts it
		}
		p.draining = true
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	select {
	case <-r.quit:
	default:
		close(r.quit)
	}
	for job, rt := range r.retry {
		rt.timer.Stop()
		delete(r.retry, job)
	}
	r.mu.Unlock()
	r.wg.Wait()
	if r.box != nil {
		r.box.close()
	}
	if r.tmp != "" {
		os.Remove(r.tmp) // empty now; another runner of this process may still use it
	}
}

// Package jobrunner is the node agent's workload runtime: it starts a job's
// hyperpodrun on this node when the coordinator's desired record places the
// job here, and drains it (SIGUSR2: checkpoint, leave, exit 0) when the job is
// moved off the node. Jobs run as plain processes (the process runtime).
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

	"github.com/hyperpodrun/hyperpodrun/agent/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
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
}

// Runner implements nodeagent.Workloads.
type Runner struct {
	cfg  Config
	log  *slog.Logger
	mu   sync.Mutex
	jobs map[string]*proc
	wg   sync.WaitGroup
	node nodeagent.Node
	st   *fleet.Store
}

type proc struct {
	cmd      *exec.Cmd
	done     chan struct{}
	draining bool
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
	return &Runner{cfg: cfg, log: cfg.Logger, jobs: map[string]*proc{}}
}

var _ nodeagent.Workloads = (*Runner)(nil)

// Run reconciles the jobs on this node with the desired records until ctx
// ends; then (an agent crash) the jobs are killed as they would be with the
// node.
func (r *Runner) Run(ctx context.Context, node nodeagent.Node) error {
	r.node = node
	r.st = fleet.New(node.Client, node.Prefix)
	r.log = r.log.With("node", node.Name)
	defer r.killAll()
	prefix := r.st.Keys.DesiredPrefix()
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, etcdTimeout)
		resp, err := node.Client.Get(rctx, prefix, clientv3.WithPrefix())
		cancel()
		if err != nil {
			r.log.Warn("read desired records", "err", err)
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
		wch := node.Client.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for w := range wch {
			if w.Err() != nil {
				break
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
	return nil
}

// etcdTimeout bounds every etcd call of the runner.
const etcdTimeout = 5 * time.Second

// apply records whether a desired record places its job on this node. A
// malformed record is logged with its key and leaves the job as it was.
func (r *Runner) apply(placed map[string]bool, key, value []byte) {
	d, err := fleet.DecodeDesired(string(key), value)
	if err != nil {
		r.log.Warn("ignoring malformed desired record", "key", string(key), "err", err)
		return
	}
	placed[d.Job] = d.Running() && slices.Contains(d.Nodes, r.node.Name)
}

// reconcile starts jobs placed here and drains jobs moved away. The
// runner's lock is never held across an etcd call.
func (r *Runner) reconcile(ctx context.Context, placed map[string]bool) {
	var start []string
	r.mu.Lock()
	for job, p := range r.jobs {
		if !placed[job] && !p.draining {
			r.log.Info("job moved off this node: draining its hyperpodrun", "job", job)
			p.draining = true
			p.cmd.Process.Signal(syscall.SIGUSR2)
		}
	}
	for job, here := range placed {
		if _, running := r.jobs[job]; here && !running {
			start = append(start, job)
		}
	}
	r.mu.Unlock()
	sort.Strings(start)
	for _, job := range start {
		if err := r.start(ctx, job); err != nil {
			r.log.Error("cannot start job", "job", job, "err", err)
		}
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

func (r *Runner) start(ctx context.Context, job string) error {
	rctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	fin, bad, err := r.st.Finished(rctx)
	if err != nil {
		return err
	}
	for _, b := range bad {
		r.log.Warn("ignoring malformed finish record", "err", b)
	}
	if _, done := fin[job]; done {
		return nil // finished: the coordinator releases it
	}
	spec, err := r.st.Job(rctx, job)
	if err != nil {
		return err
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
	args := Args(*spec, r.cfg.Endpoints, r.st.Keys.Prefix(), r.cfg.RdzvConf, logDir)
	cmd := exec.Command(r.cfg.Hyperpodrun, args...)
	cmd.Env = append(os.Environ(), "HYPERPODRUN_NODE_ID="+r.node.Name)
	if spec.Run.Python != "" {
		cmd.Env = append(cmd.Env, "PYTHON_EXEC="+spec.Run.Python)
	}
	for k, v := range spec.Run.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Dir = spec.Run.WorkDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start hyperpodrun: %w", err)
	}
	r.log.Info("started job", "job", job, "pid", cmd.Process.Pid)
	p := &proc{cmd: cmd, done: make(chan struct{})}
	r.jobs[job] = p
	prefix := r.node.Name + "/" + job + " "
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintln(r.cfg.Output, prefix+sc.Text())
		}
		io.Copy(io.Discard, pr)
	}()
	go func() {
		defer r.wg.Done()
		err := cmd.Wait()
		pw.Close()
		r.mu.Lock()
		draining := p.draining
		delete(r.jobs, job)
		r.mu.Unlock()
		close(p.done)
		r.exited(job, err, draining)
	}()
	return nil
}

// exited records a job's end: a hyperpodrun that exits 0 without being
// drained finished training; one that fails is reported as failed.
func (r *Runner) exited(job string, err error, draining bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var ee *exec.ExitError
	switch {
	case draining:
		r.log.Info("job drained off this node", "job", job, "err", err)
	case err == nil:
		r.log.Info("job finished", "job", job)
		r.st.MarkFinished(ctx, job, fleet.Finish{Outcome: fleet.Succeeded, Node: r.node.Name, Time: time.Now().UTC()})
	case errors.As(err, &ee) && ee.ProcessState.Sys().(syscall.WaitStatus).Signaled():
		r.log.Info("job's hyperpodrun was killed", "job", job, "err", err)
	default:
		r.log.Warn("job failed", "job", job, "err", err)
		r.st.MarkFinished(ctx, job, fleet.Finish{Outcome: fleet.Failed, Node: r.node.Name, Message: err.Error(), Time: time.Now().UTC()})
	}
}

// Drain drains every job on the node and waits for them to leave.
func (r *Runner) Drain(ctx context.Context) error {
	r.mu.Lock()
	var waits []chan struct{}
	for _, p := range r.jobs {
		p.draining = true
		p.cmd.Process.Signal(syscall.SIGUSR2)
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

// killAll SIGKILLs every job's hyperpodrun (its workers die with it) and
// waits for the runner's goroutines.
func (r *Runner) killAll() {
	r.mu.Lock()
	for _, p := range r.jobs {
		p.draining = true
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

package elastic

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/hyperpodrun/hyperpodrun/c10dstore"
	"github.com/hyperpodrun/hyperpodrun/checkpoint"
	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/launcher"
)

// ExitError carries the process exit code hyperpodrun should end with.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// RunStatic runs a non-elastic job: --standalone (one node) or the static
// rendezvous (--node-rank, --master-addr, --master-port, fixed --nnodes).
// Failed workers are all restarted up to MaxRestarts times, as torchrun
// does. It returns nil when every worker succeeded.
func RunStatic(ctx context.Context, o Options) error {
	o.defaults()
	if o.MinNodes != o.MaxNodes {
		return &ExitError{2, fmt.Errorf("--nnodes %d:%d needs an elastic rendezvous: add --rdzv-backend etcd --rdzv-endpoint HOST:2379 --rdzv-id JOB, or give a fixed --nnodes for the static backend", o.MinNodes, o.MaxNodes)}
	}
	if o.NodeRank < 0 || o.NodeRank >= o.MaxNodes {
		return &ExitError{2, fmt.Errorf("--node-rank %d is outside 0..%d for --nnodes %d", o.NodeRank, o.MaxNodes-1, o.MaxNodes)}
	}
	log := o.Logger
	nproc := o.Spec.NProcPerNode
	a := launcher.Assignment{
		GroupRank:      o.NodeRank,
		GroupWorldSize: o.MaxNodes,
		BaseRank:       o.NodeRank * nproc,
		WorldSize:      o.MaxNodes * nproc,
		MasterAddr:     o.MasterAddr,
		MasterPort:     o.MasterPort,
	}
	// --standalone keeps the job's committed checkpoint in process (there is
	// no etcd): workers get the control channel, and a restart after a
	// failure resumes from the last checkpoint they committed.
	var record *checkpoint.LocalRecord
	var ctlEnv map[string]string
	var ch *control.Channel // standalone only: also the workers' heartbeats (hang.go)
	if o.RdzvBackend == "standalone" {
		dir, err := os.MkdirTemp("", "hyperpodrun-ctl-") // short: unix socket paths are limited
		if err != nil {
			return &ExitError{1, fmt.Errorf("control channel: %w", err)}
		}
		defer os.RemoveAll(dir)
		record = &checkpoint.LocalRecord{}
		ch, err = control.NewChannel(dir, control.WithHandler(record.ReportHandler()), control.WithLogger(log))
		if err != nil {
			return &ExitError{1, fmt.Errorf("control channel: %w", err)}
		}
		defer ch.Close()
		ctlEnv = ch.Env()
		ctlEnv["HYPERPODRUN_ELASTIC_SIGNAL"] = strconv.Itoa(int(o.ElasticSignal))
	}
	stop, err := serveStaticStore(ctx, &o)
	if err != nil {
		return err
	}
	defer stop()
	if err := runHook(ctx, "pre-train", o.PreTrain); err != nil {
		return err
	}
	for {
		resume := int64(-1)
		if record != nil {
			a.Env = maps.Clone(ctlEnv)
			if rec := record.Latest(); rec != nil {
				maps.Copy(a.Env, rec.Env())
				resume = rec.Step
			}
			hangEnvFor(o, log, a.Env, a.Attempt)
		}
		log.Info("starting workers", "attempt", a.Attempt, "restart_count", a.RestartCount,
			"world_size", a.WorldSize, "group_rank", a.GroupRank, "nproc_per_node", nproc,
			"master", fmt.Sprintf("%s:%d", a.MasterAddr, a.MasterPort), "log_dir", o.Spec.LogDir, "resume_step", resume)
		g, err := launcher.Start(o.Spec, a)
		if err != nil {
			return &ExitError{1, err}
		}
		hang := watchStaticHang(ctx, o, ch, g)
		outcome, sig := waitGroup(ctx, g, o, hang.verdict)
		hang.stop()
		res := g.Result()
		switch outcome {
		case outcomeSignal:
			return &ExitError{1, fmt.Errorf("hyperpodrun received %s: workers stopped", launcher.SignalName(sig))}
		case outcomeDone:
			if res.OK() {
				log.Info("workers succeeded", "attempt", a.Attempt)
				return runHook(ctx, "post-train", o.PostTrain)
			}
		case outcomeHung:
			res = hang.stopHung(g, log)
		}
		if launcher.BudgetSpent(a.RestartCount+1, o.MaxRestarts) { // this failure included
			fmt.Fprint(o.stderrW(), res.Summary(o.Spec.Entrypoint))
			return &ExitError{1, fmt.Errorf("%s failed: %d worker(s) failed, %d restart(s) used of --max-restarts %d", o.Spec.Entrypoint, max(len(res.Failures), 1), a.RestartCount, o.MaxRestarts)}
		}
		if rc := res.RootCause; rc != nil {
			log.Warn("worker failed, restarting all local workers", "rank", rc.Rank, "exitcode", rc.ExitCode,
				"restart", a.RestartCount+1, "max_restarts", o.MaxRestarts)
		}
		a.RestartCount++
		a.Attempt++
	}
}

type outcome int

const (
	outcomeDone   outcome = iota // all workers exited (check Result)
	outcomeFailed                // a worker failed; the others were stopped
	outcomeSignal                // hyperpodrun got a signal; workers were stopped
	outcomeHung                  // a worker is hung (--hang-timeout); the workers still run
)

// waitGroup waits for the group to finish, a worker to fail, a signal, or
// a hang verdict (nil: none comes).
func waitGroup(ctx context.Context, g *launcher.Group, o Options, hung <-chan hangVerdict) (outcome, syscall.Signal) {
	select {
	case <-hung:
		return outcomeHung, 0
	case <-g.Exited():
		return outcomeDone, 0
	case <-g.Failed():
		awaitOthers(g, failureGrace)
		g.Stop(o.ShutdownSignal, o.ShutdownTimeout)
		return outcomeFailed, 0
	case s := <-o.Signals:
		sig, _ := s.(syscall.Signal)
		o.Logger.Warn("received signal, forwarding to workers", "signal", launcher.SignalName(sig), "shutdown_timeout", o.ShutdownTimeout)
		g.Stop(sig, o.ShutdownTimeout)
		return outcomeSignal, sig
	case <-ctx.Done():
		g.Stop(o.ShutdownSignal, o.ShutdownTimeout)
		return outcomeSignal, o.ShutdownSignal
	}
}

// serveStaticStore is torchrun's agent store under the static rendezvous:
// node 0's agent serves the TCPStore on --master-port for the whole run,
// and every node's workers run with TORCHELASTIC_USE_AGENT_STORE=True (they
// connect to it, prefixing their keys with the restart count), as torchrun
// 1.13 does. --standalone (torchrun's local c10d rendezvous) and
// --no-agent-store keep the workers' own store on rank 0. stop closes it.
func serveStaticStore(ctx context.Context, o *Options) (stop func(), err error) {
	if o.RdzvBackend != "static" || o.NoAgentStore {
		return func() {}, nil
	}
	o.Spec.UseAgentStore = true
	if o.NodeRank != 0 {
		return func() {}, nil
	}
	s, err := c10dstore.Listen(ctx, net.JoinHostPort("", strconv.Itoa(o.MasterPort)), c10dstore.Options{Logger: o.Logger})
	if err != nil {
		return nil, &ExitError{1, fmt.Errorf("serve the workers' TCPStore on --master-port %d (or run with --no-agent-store): %w", o.MasterPort, err)}
	}
	o.Logger.Info("serving the workers' TCPStore (torchrun's agent store)", "port", o.MasterPort)
	return func() { _ = s.Close() }, nil
}

// failureGrace is how long, after a worker's failure, the agent lets the
// other workers end on their own before it stops them, so the failure
// summary lists every rank that failed, root cause first, as torchrun's
// does (a missing script fails every rank at once; a dead rank breaks its
// peers' collectives within milliseconds). torch 1.13's agent sees
// failures when it polls, every --monitor-interval (5 s): by then the
// peers have failed too. Workers still running after it are stopped and
// not reported as failures. It costs a restart at most this long when the
// other workers do not end (a hung collective).
const failureGrace = time.Second

// awaitOthers waits up to grace for every worker of g to have exited.
func awaitOthers(g *launcher.Group, grace time.Duration) {
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-g.Exited():
	case <-t.C:
	}
}

// runHook runs a --pre-train-script / --post-train-script with its args.
func runHook(ctx context.Context, name string, argv []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return nil
	}
	if err := launcher.Run(ctx, argv, nil); err != nil {
		return &ExitError{1, fmt.Errorf("--%s-script %s failed: %w", name, argv[0], err)}
	}
	return nil
}

func (o Options) stderrW() io.Writer {
	if o.Stderr != nil {
		return o.Stderr
	}
	return os.Stderr
}

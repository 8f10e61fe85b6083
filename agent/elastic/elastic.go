package elastic

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/hyperpodrun/hyperpodrun/c10dstore"
	"github.com/hyperpodrun/hyperpodrun/checkpoint"
	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/telemetry"
	"github.com/hyperpodrun/hyperpodrun/launcher"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// ElasticDeps lets tests and embedders supply what RunElastic would
// otherwise build from the options.
type ElasticDeps struct {
	// Client is an etcd client to use instead of dialling --rdzv-endpoint.
	Client *clientv3.Client
	// Tracer replaces the one configured from OTEL_* variables.
	Tracer trace.TracerProvider
	// NodeID names this agent in the rendezvous (default: generated).
	NodeID string
}

// RunElastic runs the elastic agent on the etcd rendezvous.
func RunElastic(ctx context.Context, o Options) error {
	return RunElasticWith(ctx, o, ElasticDeps{})
}

// RunElasticWith is RunElastic with injected dependencies.
func RunElasticWith(ctx context.Context, o Options, deps ElasticDeps) error {
	o.defaults()
	log := o.Logger
	var cfg rendezvous.Config
	copts, err := rendezvous.ParseConf(o.RdzvConf, &cfg)
	if err != nil {
		return &ExitError{2, fmt.Errorf("--rdzv-conf: %w", err)}
	}
	cfg.JobID = o.RdzvID
	cfg.NodeID = deps.NodeID
	if cfg.NodeID == "" {
		// The node agent names the rendezvous member after its node, so
		// the coordinator's placement can be matched.
		cfg.NodeID = os.Getenv("HYPERPODRUN_NODE_ID")
	}
	cfg.Addr = o.LocalAddr
	cfg.LocalWorldSize = o.Spec.NProcPerNode
	cfg.MinNodes, cfg.MaxNodes = o.MinNodes, o.MaxNodes
	cfg.RegisterTimeout = o.RegisterTimeout
	cfg.Logger = log
	cfg.Prefix = fleet.NormalizePrefix(cfg.Prefix)
	if cfg.JobID == "" || cfg.JobID == "none" {
		return &ExitError{2, errors.New("--rdzv-id: an elastic job needs an id shared by all its nodes, e.g. --rdzv-id my-job")}
	}
	cli := deps.Client
	if cli == nil {
		if o.RdzvEndpoint == "" {
			return &ExitError{2, errors.New("--rdzv-endpoint: give the etcd endpoint(s), e.g. --rdzv-endpoint etcd-0:2379,etcd-1:2379")}
		}
		copts.Endpoints = strings.Split(o.RdzvEndpoint, ",")
		if err := copts.Validate(); err != nil {
			return &ExitError{2, err}
		}
		if cli, err = etcdconn.Connect(ctx, copts); err != nil {
			return &ExitError{1, err}
		}
		defer cli.Close()
	}
	tp := deps.Tracer
	if tp == nil {
		var shutdown func(context.Context) error
		if tp, shutdown, err = telemetry.Setup(ctx, "hyperpodrun", resourceAttrs(cfg.JobID, cfg.NodeID)...); err != nil {
			log.Warn("tracing disabled", "err", err)
			tp = noop.NewTracerProvider()
		} else {
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				shutdown(sctx)
			}()
		}
	}
	if len(copts.Endpoints) == 0 {
		copts.Endpoints = cli.Endpoints()
	}
	e := &elastic{o: o, cfg: cfg, cli: cli, copts: copts, log: log, tracer: tp.Tracer("github.com/hyperpodrun/hyperpodrun/agent/elastic")}
	return e.run(ctx)
}

type elastic struct {
	o   Options
	cfg rendezvous.Config
	cli *clientv3.Client
	// copts reach cli's etcd: the watchdog revokes the lease with them if
	// this agent dies (leaseWill).
	copts  rendezvous.ClientOptions
	log    *slog.Logger
	tracer trace.Tracer
	node   *rendezvous.Node
	// roundNo is the running round; stopping is the round in which a
	// worker reported it is stopping for a planned change.
	roundNo, stopping atomic.Int64
	store             *checkpoint.Store
	ch                *control.Channel
	round             *rendezvous.Round
	// guard renews the workers' watchdog from the lease keepalive.
	guard *leaseGuard
	// agentStore is the TCPStore this node serves for the round's workers
	// when it holds group rank 0 (Options.NoAgentStore unset).
	agentStore *c10dstore.Server
	// carry holds this node's workers between rounds during an in-process
	// resize (Options.InProcessResize): they left the old round's process
	// group and wait, parked on the control channel, for the next round's
	// assignment. nil when the next round starts new workers.
	carry *launcher.Group
	// prewarmed says carry holds workers started ahead of their first
	// round (prewarm.go): they hold no rank and no training state.
	prewarmed bool
	// summary is the failure summary this node printed last (jobfail.go).
	summary string
	// ckptFails holds the last round's failed checkpoint (ckptfail.go).
	ckptFails ckptFailures
	// wipe is what the wipe guard remembers of etcd and the job (wipe.go).
	wipe wipeMemory
	// steps holds the scaling event waiting for its workers' first report
	// at the new size (tracing.go).
	steps stepWatch
	// hangs is what the hang watch remembers across rounds (hang.go).
	hangs hangMemory
}

// workerState is where this node's workers stand, after torch's
// WorkerState (torch/distributed/elastic/agent/server/api.py). The agent's
// loop joins a round (init), runs the workers (healthy) and ends each round
// in one of the other states: unhealthy and stopped go on to the next
// round, succeeded and failed end the agent.
type workerState int

const (
	// workersInit: joining a round; no workers run.
	workersInit workerState = iota
	// workersHealthy: the round's workers run.
	workersHealthy
	// workersUnhealthy: a worker failed; the failure is reported and the
	// job restarts at the next round.
	workersUnhealthy
	// workersStopped: the workers were stopped because the round changed
	// (a planned change, a lost or failed member elsewhere, fencing); the
	// agent joins the next round.
	workersStopped
	// workersSucceeded: the workers succeeded, or this node was drained;
	// the agent exits 0.
	workersSucceeded
	// workersFailed: the agent gives up (signal, error, cancelled); it
	// exits with the step's error.
	workersFailed
)

func (s workerState) String() string {
	switch s {
	case workersInit:
		return "INIT"
	case workersHealthy:
		return "HEALTHY"
	case workersUnhealthy:
		return "UNHEALTHY"
	case workersStopped:
		return "STOPPED"
	case workersSucceeded:
		return "SUCCEEDED"
	case workersFailed:
		return "FAILED"
	}
	return fmt.Sprintf("workerState(%d)", int(s))
}

// final says the agent is done in this state.
func (s workerState) final() bool { return s == workersSucceeded || s == workersFailed }

// roundEnd is how a round's workers ended: the state, the scaling event
// that ended the round (workersStopped; nil when there is none to trace),
// in a final state the agent's outcome (nil: exit 0), and whether they
// were stopped because this node lost its lease (fencing: the loop
// rejoins with a fresh lease).
type roundEnd struct {
	state     workerState
	next      *scaleEvent
	err       error
	leaseLost bool
}

// finished ends the agent with err: succeeded when nil, else failed.
func finished(err error) roundEnd {
	if err != nil {
		return roundEnd{state: workersFailed, err: err}
	}
	return roundEnd{state: workersSucceeded}
}

// failedWith ends the agent with err.
func failedWith(err error) roundEnd { return roundEnd{state: workersFailed, err: err} }

func (e *elastic) run(ctx context.Context) (err error) {
	o := e.o
	e.store = checkpoint.NewStore(e.cli, e.cfg.Prefix, e.cfg.JobID).WithLogger(e.log)
	// A short path: unix socket paths are limited to 107 bytes.
	ctlDir, err := os.MkdirTemp("", "hyperpodrun-ctl-")
	if err != nil {
		return &ExitError{1, fmt.Errorf("control channel: %w", err)}
	}
	defer os.RemoveAll(ctlDir)
	e.guard = newLeaseGuard(e.log)
	defer e.guard.close()
	defer e.closeStore()
	commit := e.store.ReportHandler(func() int64 { return e.roundNo.Load() })
	e.ch, err = control.NewChannel(ctlDir,
		control.WithHandler(func(ctx context.Context, r control.Report) error {
			if !e.guard.leaseAlive() {
				// Fenced (perhaps while this agent was stopped): another
				// round may run this node's ranks already.
				return fmt.Errorf("%w: this node's lease of round %d is no longer provably alive", control.ErrStaleRound, r.Round)
			}
			if r.Type == control.ReportStopping {
				// A worker saw a planned change (possibly announced on
				// another node) and exits 0: not the end of training.
				e.stopping.Store(e.roundNo.Load())
			}
			if r.Type == control.ReportCheckpointFailed {
				e.checkpointFailed(r)
			}
			if r.Type != control.ReportStopping {
				e.firstStep(r) // the scaling event's workers run at the new size
			}
			if err := commit(ctx, r); err != nil {
				return err
			}
			e.sawCommit(ctx, r)
			return nil
		}), control.WithAdvisor(e.adviseFailedSave))
	if err != nil {
		return &ExitError{1, fmt.Errorf("control channel: %w", err)}
	}
	defer e.ch.Close()
	if err := e.newNode(); err != nil {
		return err
	}
	defer func() { e.node.Close() }()
	if err := runHook(ctx, "pre-train", o.PreTrain); err != nil {
		return err
	}

	// Workers kept for an in-process resize do not outlive the agent.
	defer e.dropCarry("hyperpodrun is leaving the job")
	if sig := e.prewarmFirst(ctx); sig != 0 {
		return e.leaveOnSignal(ctx, sig, "while the workers prewarmed")
	}
	return e.loop(ctx)
}

// prewarmFirst starts this node's workers before it registers when it
// joins a job already training in process (prewarm.go). It returns a
// signal received meanwhile (0: none).
func (e *elastic) prewarmFirst(ctx context.Context) syscall.Signal {
	if !e.o.InProcessResize {
		return 0
	}
	view := prewarmView{InProcess: true, Timeout: e.o.PrewarmTimeout}
	if view.Timeout > 0 {
		view.RunningNodes = e.runningNodes(ctx)
	}
	ok, why := shouldPrewarm(view)
	if !ok {
		e.log.Debug("workers start after the round (no prewarm)", "why", why)
		return 0
	}
	e.log.Info("joining a job that trains: prewarming this node's workers before registering", "why", why)
	return e.prewarm(ctx)
}

// newNode (re)creates this agent's rendezvous participant.
func (e *elastic) newNode() error {
	if e.node != nil {
		e.node.Close()
	}
	cfg := e.cfg
	cfg.OnRenew = e.guard.forNode()
	n, err := rendezvous.New(e.cli, cfg)
	if err != nil {
		return &ExitError{2, err}
	}
	e.node = n
	return nil
}

// join waits for the next round, or a signal. A node that loses its lease
// while it registers or waits (etcd restarting: the new lease's keepalives
// are not confirmed in time, or a member write finds the lease gone) is
// replaced by a fresh one, with a fresh lease, for as long as a join may
// take: an etcd outage costs a rejoin, not the job.
func (e *elastic) join(ctx context.Context, event *scaleEvent) (*rendezvous.Round, syscall.Signal, error) {
	timeout := e.cfg.RegisterTimeout
	if timeout <= 0 {
		timeout = e.cfg.JoinTimeout
	}
	if timeout <= 0 {
		timeout = rendezvous.DefaultJoinTimeout
	}
	deadline := time.Now().Add(timeout)
	for {
		r, sig, err := e.joinOnce(ctx, event)
		leaseGone := errors.Is(err, rendezvous.ErrLeaseLost) || errors.Is(err, rpctypes.ErrLeaseNotFound)
		if err == nil || !leaseGone || ctx.Err() != nil || time.Now().After(deadline) {
			return r, sig, err
		}
		e.log.Warn("rendezvous: this node lost its lease while joining (etcd restarting?); joining again with a fresh lease", "err", err)
		if err := e.newNode(); err != nil {
			return nil, 0, err
		}
	}
}

// joinOnce is one Join of the current node, or a signal.
func (e *elastic) joinOnce(ctx context.Context, event *scaleEvent) (*rendezvous.Round, syscall.Signal, error) {
	jctx, cancel := context.WithCancel(ctx)
	defer cancel()
	spanCtx := jctx
	if event != nil {
		spanCtx = event.ctx
	}
	_, span := e.tracer.Start(spanCtx, "rendezvous")
	defer span.End()
	type res struct {
		r   *rendezvous.Round
		err error
	}
	out := make(chan res, 1)
	if e.node.Lease() == 0 {
		// Logged before the member key is written: its time bounds the
		// registration from below (a prewarmed worker asked before it).
		e.log.Info("registering with the job's rendezvous", "node", e.node.ID(), "prewarmed_workers", e.prewarmed)
	}
	go func() {
		r, err := e.node.Join(jctx)
		out <- res{r, err}
	}()
	// Workers kept for an in-process resize leave once a round closes
	// without this node (a shrink that drops it: it waits as a spare).
	var leftOut chan error
	if e.carry != nil && e.round != nil {
		ch := make(chan error, 1)
		after := e.round.Number
		go func() { ch <- e.node.LeftOut(jctx, after) }()
		leftOut = ch
	}
	for {
		select {
		case err := <-leftOut:
			leftOut = nil
			if err == nil {
				e.dropCarry("this node is not in the next round")
			}
		case r := <-out:
			if r.err != nil {
				span.SetStatus(codes.Error, r.err.Error())
				return nil, 0, r.err
			}
			span.SetAttributes(attribute.Int64("round", r.r.Number), attribute.Int("rank", r.r.Rank),
				attribute.Int("nodes", r.r.NumNodes), attribute.Int("world_size", r.r.WorldSize),
				attribute.String("reason", string(r.r.Reason)))
			return r.r, 0, nil
		case s := <-e.o.Signals:
			cancel()
			<-out
			sig, _ := s.(syscall.Signal)
			return nil, sig, nil
		}
	}
}

// signalError carries a signal received while no workers run.
type signalError struct{ sig syscall.Signal }

func (e signalError) Error() string { return "received " + launcher.SignalName(e.sig) }

// leaveOnSignal leaves the job when a signal arrives while no workers run:
// SIGUSR2 (a planned drain) exits 0, any other signal exits 1 as torchrun.
func (e *elastic) leaveOnSignal(ctx context.Context, sig syscall.Signal, when string) error {
	e.leave(ctx)
	if sig == syscall.SIGUSR2 {
		e.log.Info("drained "+when, "signal", launcher.SignalName(sig))
		return nil
	}
	return &ExitError{1, fmt.Errorf("hyperpodrun received %s %s", launcher.SignalName(sig), when)}
}

// watch waits while the round's workers run (workersHealthy) and returns
// how they ended: in a final state the agent is finished (err is the
// outcome); otherwise the loop joins the next round, next being the
// scaling event that ended this one.
func (e *elastic) watch(ctx context.Context, g *launcher.Group, r *rendezvous.Round) roundEnd {
	o := e.o
	nctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changes, nextErr := e.superseded(nctx, r)
	hang := e.watchHang(nctx, g, r)
	stopAll := func(sig syscall.Signal) { g.Stop(sig, o.ShutdownTimeout) }
	// In process, a worker whose collective broke (a peer died) leaves the
	// process group and parks; unless a change is under way already, that
	// is a failure the job must hear of at once (not a lease TTL later).
	var parkedCh <-chan struct{}
	var unannounced <-chan time.Time
	if o.InProcessResize {
		_, parkedCh = e.ch.Parked()
	}
	for {
		select {
		case <-parkedCh:
			var p map[int]int
			p, parkedCh = e.ch.Parked()
			if len(p) > 0 && unannounced == nil {
				unannounced = time.After(unannouncedGrace)
			}
			continue
		case <-unannounced:
			parkedCh, unannounced = nil, nil
			e.log.Warn("a worker left a broken process group with no change announced; reporting it so the job forms a new round", "round", r.Number)
			if _, err := e.node.ReportFailure(ctx, r, "a worker's collective broke (in process)", ""); err != nil {
				e.log.Warn("report the broken process group", "err", err)
			}
			continue
		case <-g.Exited():
			if e.guard.expired() {
				return e.fence(g, r)
			}
			res := g.Result()
			if res.OK() && e.stopping.Load() == r.Number {
				// The workers checkpointed and stopped for a planned change
				// announced elsewhere; the new round follows.
				e.log.Info("workers stopped for a planned change", "round", r.Number)
				e.sayPlannedLoss(ctx, r)
				return roundEnd{state: workersStopped, next: e.peerEvent(ctx, r)}
			}
			if res.OK() {
				e.log.Info("workers succeeded", "round", r.Number)
				if err := e.node.Finish(detached(ctx), r); err != nil {
					e.log.Warn("finish rendezvous", "err", err)
				}
				return finished(runHook(ctx, "post-train", o.PostTrain))
			}
			return e.failed(ctx, g, r)
		case <-g.Failed():
			if e.guard.expired() {
				// The watchdog killed them: this agent was stopped or wedged
				// past its lease.
				return e.fence(g, r)
			}
			awaitOthers(g, failureGrace)
			stopAll(o.ShutdownSignal)
			return e.failed(ctx, g, r)
		case v := <-hang:
			return e.hung(ctx, g, r, v)
		case c := <-changes:
			return roundEnd{state: workersStopped, next: e.change(ctx, g, r, c)}
		case err := <-nextErr:
			if errors.Is(err, rendezvous.ErrLeaseLost) {
				return e.fence(g, r)
			}
			stopAll(o.ShutdownSignal)
			e.leave(ctx)
			return failedWith(&ExitError{1, err})
		case <-e.node.LeaseLost():
			return e.fence(g, r)
		case s := <-o.Signals:
			sig, _ := s.(syscall.Signal)
			if sig == syscall.SIGUSR2 {
				return finished(e.drain(ctx, g, r))
			}
			e.log.Warn("received signal, forwarding to workers", "signal", launcher.SignalName(sig))
			stopAll(sig)
			e.leave(ctx)
			return failedWith(&ExitError{1, fmt.Errorf("hyperpodrun received %s: workers stopped", launcher.SignalName(sig))})
		case <-ctx.Done():
			stopAll(o.ShutdownSignal)
			e.leave(ctx)
			return failedWith(&ExitError{1, ctx.Err()})
		}
	}
}

// unannouncedGrace is how long a worker may wait parked, in process, for a
// change this agent has not seen yet (announced on another node, still on
// its way here) before the agent reports the broken process group itself.
const unannouncedGrace = 100 * time.Millisecond

// superseded runs Next for round r in a goroutine: the first channel gets
// the change that supersedes r, the second Next's error. Both are buffered,
// so the goroutine ends with ctx whether or not anyone reads them.
func (e *elastic) superseded(ctx context.Context, r *rendezvous.Round) (<-chan rendezvous.Change, <-chan error) {
	changes := make(chan rendezvous.Change, 1)
	errs := make(chan error, 1)
	go func() {
		c, err := e.node.Next(ctx, r)
		if err != nil {
			errs <- err
			return
		}
		changes <- c
	}()
	return changes, errs
}

// detached is ctx without its cancellation, for the rendezvous calls that
// must still be made when ctx ends (Leave, Finish): they bound each etcd
// request with a deadline of their own, derived from it.
func detached(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// leave revokes this node's lease (the others see it gone at once).
func (e *elastic) leave(ctx context.Context) {
	e.node.Leave(detached(ctx))
}

// opTimeout bounds each etcd request the agent makes itself, as the
// rendezvous bounds its own: the longer of 5s and two lease TTLs.
func (e *elastic) opTimeout() time.Duration { return rendezvous.OpTimeout(e.cfg.LeaseTTL) }

// drain is a planned leave of this node (SIGUSR2, sent by the node agent
// when the coordinator moves the job off this node): the workers of every
// node are told through the sync signal, checkpoint and exit 0; then this
// node leaves the rendezvous at once and hyperpodrun exits 0.
//
// When the coordinator took the whole job's allocation away, the desired
// record the node agent reacted to says why: the workers are then told
// "preemption" or "shutdown" (new world size 0) with the coordinator's
// reason, not "drain".
func (e *elastic) drain(ctx context.Context, g *launcher.Group, r *rendezvous.Round) error {
	ev := control.Event{Kind: control.Drain, NewWorldSize: e.newWorldSize(ctx, control.Drain, r)}
	d := e.desired(ctx)
	if d != nil && d.Stop != nil {
		stop := *d.Stop
		ev = control.Event{Kind: control.EventKind(stop.Kind), Reason: stop.Reason}
	} else {
		// Tell every member first: the closer proposes the next round
		// without this node at once, and the other agents announce it to
		// their workers, so no worker learns of it from a broken collective.
		e.tellMembersWeDrain(ctx, r, &ev)
	}
	e.log.Info("draining: asking workers to checkpoint, then leaving the job", "round", r.Number, "kind", ev.Kind, "why", ev.Reason)
	event := e.beginEvent(e.drainParent(d), string(ev.Kind), r, d)
	defer event.span.End()
	e.announceAndWait(event.ctx, g, r, ev)
	event.workersStopped()
	if err := e.node.Leave(detached(ctx)); err != nil {
		e.log.Warn("leave rendezvous", "err", err)
	}
	return nil
}

// tellMembersWeDrain marks this node as leaving in the rendezvous and waits
// briefly for the round without it, whose world size the workers are told.
// Without an answer the drain goes on as a local announcement.
func (e *elastic) tellMembersWeDrain(ctx context.Context, r *rendezvous.Round, ev *control.Event) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := e.node.Drain(ctx); err != nil {
		e.log.Warn("could not tell the other members this node drains; announcing to this node's workers only", "err", err)
		return
	}
	c, err := e.node.Next(ctx, r)
	if err != nil {
		e.log.Warn("no round without this node yet; announcing the drain anyway", "err", err)
		return
	}
	ev.Reason = c.Detail
	if c.WorldSize > 0 {
		ev.NewWorldSize = c.WorldSize
	}
}

// desired reads the job's desired record (nil when there is none, it
// cannot be read in time, or it is malformed: each logged).
func (e *elastic) desired(ctx context.Context) *fleet.Desired {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	d, err := fleet.New(e.cli, e.cfg.Prefix).Desired(ctx, e.cfg.JobID)
	if err != nil {
		e.log.Warn("cannot read the job's desired record", "err", err)
		return nil
	}
	return d
}

// newWorldSize estimates the world size after a planned change whose round
// is not proposed yet (plannedNodes; nodes are assumed to run this node's
// --nproc-per-node).
func (e *elastic) newWorldSize(ctx context.Context, kind control.EventKind, r *rendezvous.Round) int {
	target := 0
	if kind != control.ScaleUp && kind != control.Drain {
		target = e.desired(ctx).Target()
	}
	return plannedNodes(kind, r.NumNodes, target, e.cfg) * e.o.Spec.NProcPerNode
}

// plannedNodes estimates the node count after a planned change of kind
// from a round of nodes, within the sizes the job allows (cfg.Sizes,
// cfg.Step, MinNodes..MaxNodes) as the rendezvous sizes the next round:
// the next allowed size up for a waiting node (scale_up), the next one
// down for a drain, the target (down to an allowed size) for a resize,
// and the round's own size when a resize has no target.
func plannedNodes(kind control.EventKind, nodes, target int, cfg rendezvous.Config) int {
	want := nodes
	switch kind {
	case control.ScaleUp:
		for n := nodes + 1; n <= cfg.MaxNodes; n++ {
			if cfg.AllowedSize(n) == n {
				return n
			}
		}
		want = cfg.MaxNodes
	case control.Drain:
		want = nodes - 1
	default:
		if target > 0 {
			want = target
		}
	}
	if n := cfg.AllowedSize(want); n > 0 {
		return n
	}
	return cfg.MinNodes
}

// fence stops the workers at once: this agent can no longer prove its
// lease alive, so another node may soon be given its ranks.
func (e *elastic) fence(g *launcher.Group, r *rendezvous.Round) roundEnd {
	e.log.Error("lease lost: killing workers before the lease can expire (fencing)", "round", r.Number)
	g.Stop(syscall.SIGKILL, 0)
	return roundEnd{state: workersStopped, leaseLost: true}
}

// failed reports a worker failure to the job and prints the summary.
func (e *elastic) failed(ctx context.Context, g *launcher.Group, r *rendezvous.Round) roundEnd {
	res := g.Result()
	detail := "worker failed"
	if rc := res.RootCause; rc != nil {
		detail = fmt.Sprintf("rank %d exitcode %d", rc.Rank, rc.ExitCode)
	}
	detail = e.failureDetail(ctx, r, detail)
	e.printSummary(res.Summary(e.o.Spec.Entrypoint))
	n, err := e.node.ReportFailure(ctx, r, detail, e.summary)
	if err != nil {
		return failedWith(&ExitError{1, fmt.Errorf("report worker failure: %w", err)})
	}
	e.log.Warn("worker failed; the job restarts at the next round", "detail", detail, "job_restarts", n, "max_restarts", e.o.MaxRestarts)
	return roundEnd{state: workersUnhealthy}
}

// change handles a superseded round: planned changes are announced to the
// workers (event file + elastic signal) so they checkpoint and exit 0; lost
// or failed members mean the collectives are broken, so workers are
// stopped at once and resume from the last committed checkpoint.
func (e *elastic) change(ctx context.Context, g *launcher.Group, r *rendezvous.Round, c rendezvous.Change) *scaleEvent {
	o := e.o
	parent := changeTrace(e.cfg.JobID, c.Round, c.ID)
	planned := c.Reason == rendezvous.TargetChanged || c.Reason == rendezvous.NodeWaiting || c.Reason == rendezvous.NodeLeaving
	var d *fleet.Desired
	if planned {
		// Under the coordinator's decision span (issue 15): a new target,
		// and the node it took away (leaving) or added (waiting), which
		// may reach this node first.
		d = e.desired(ctx)
		parent = decisionParent(d, parent)
	}
	event := e.beginEvent(parent, string(c.Reason), r, d, attribute.String("detail", c.Detail), attribute.Int64("to_round", c.Round))
	ectx := event.ctx
	_, dspan := e.tracer.Start(ectx, "decision", trace.WithAttributes(attribute.String("reason", string(c.Reason)), attribute.String("detail", c.Detail)))
	dspan.End()
	e.log.Info("round superseded", "round", r.Number, "reason", c.Reason, "detail", c.Detail, "planned", planned)
	if o.InProcessResize {
		ev := control.Event{Kind: control.MemberLost, NewWorldSize: c.WorldSize, Reason: c.Detail}
		if planned {
			ev = e.plannedEvent(ctx, c, r)
		}
		if e.handOver(ectx, g, r, ev) {
			e.carry = g
		}
		if planned {
			e.sayPlannedOutcome(ectx, r, e.carry == g)
		}
		event.workersStopped()
		return event
	}
	if !planned {
		e.dumpIfStalled(g, r)
		_, sspan := e.tracer.Start(ectx, "signal", trace.WithAttributes(attribute.String("signal", launcher.SignalName(o.ShutdownSignal))))
		g.Stop(o.ShutdownSignal, o.ShutdownTimeout)
		sspan.End()
		event.workersStopped()
		return event
	}
	e.announceAndWait(ectx, g, r, e.plannedEvent(ctx, c, r))
	event.workersStopped()
	return event
}

// changeTrace returns a context whose remote parent puts every agent's spans
// for one change of the job (the proposal of a round) into one trace: the
// trace id is derived from the job, the round and the proposal's id, which
// every member reads from the same round record, so the agents agree on it
// without talking to each other.
func changeTrace(job string, round int64, id string) context.Context {
	h := sha256.Sum256([]byte(fmt.Sprintf("hyperpodrun/%s/%d/%s", job, round, id)))
	var tid trace.TraceID
	var sid trace.SpanID
	copy(tid[:], h[:16])
	copy(sid[:], h[16:24])
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	return trace.ContextWithRemoteSpanContext(context.Background(), sc)
}

// plannedEvent names a planned change for the workers: scale_up or
// scale_down when the proposed round is larger or smaller, with its world
// size; resize when the size stays (or is not proposed yet, in which case
// the world size is estimated from the target).
func (e *elastic) plannedEvent(ctx context.Context, c rendezvous.Change, r *rendezvous.Round) control.Event {
	switch {
	case c.WorldSize > 0 && c.NumNodes > r.NumNodes:
		return control.Event{Kind: control.ScaleUp, NewWorldSize: c.WorldSize, Reason: c.Detail}
	case c.WorldSize > 0 && c.NumNodes < r.NumNodes:
		return control.Event{Kind: control.ScaleDown, NewWorldSize: c.WorldSize, Reason: c.Detail}
	case c.WorldSize > 0:
		return control.Event{Kind: control.Resize, NewWorldSize: c.WorldSize, Reason: c.Detail}
	case c.Reason == rendezvous.NodeWaiting:
		return control.Event{Kind: control.ScaleUp, NewWorldSize: e.newWorldSize(ctx, control.ScaleUp, r), Reason: c.Detail}
	}
	return control.Event{Kind: control.Resize, NewWorldSize: e.newWorldSize(ctx, control.Resize, r), Reason: c.Detail}
}

// announceAndWait announces a planned change to the workers (event file,
// then the elastic signal) and waits up to --graceful-timeout for them to
// checkpoint and exit, then escalates: SIGTERM, then SIGKILL.
func (e *elastic) announceAndWait(ectx context.Context, g *launcher.Group, r *rendezvous.Round, ev control.Event) {
	o := e.o
	ev.Deadline = time.Now().Add(o.GracefulTimeout)
	ev.Round = r.Number
	ev.TraceParent = telemetry.TraceParent(ectx)
	_, sspan := e.tracer.Start(ectx, "signal", trace.WithAttributes(attribute.String("signal", launcher.SignalName(o.ElasticSignal)),
		attribute.String("kind", string(ev.Kind)), attribute.Int("new_world_size", ev.NewWorldSize)))
	e.log.Info("announcing a planned change to the workers", "kind", ev.Kind, "new_world_size", ev.NewWorldSize, "why", ev.Reason)
	if err := e.ch.Announce(ev); err != nil {
		e.log.Warn("announce event", "err", err)
	}
	g.Signal(o.ElasticSignal)
	sspan.End()
	_, wspan := e.tracer.Start(ectx, "checkpoint_wait", trace.WithAttributes(attribute.Float64("graceful_timeout_s", o.GracefulTimeout.Seconds())))
	t := time.NewTimer(o.GracefulTimeout)
	defer t.Stop()
	signalled := time.Now()
	escalated := false
	if o.InProcessResize {
		// Workers that offer to reconfigure in process (they cannot know
		// this node leaves) are told to leave: they checkpointed already.
		stop := e.leaveParkedUntil(g.Exited())
		defer stop()
	}
	select {
	case <-g.Exited():
	case <-e.node.LeaseLost():
		// Fencing holds during the graceful wait too: without a lease
		// this node's ranks may soon be given to another node.
		e.log.Error("lease lost while the workers checkpoint: killing them (fencing)", "round", r.Number)
		escalated = true
		g.Stop(syscall.SIGKILL, 0)
	case <-t.C:
		e.log.Warn("workers did not exit within --graceful-timeout; escalating", "graceful_timeout", o.GracefulTimeout)
		escalated = true
		g.Stop(syscall.SIGTERM, o.ShutdownTimeout)
	}
	wspan.SetAttributes(attribute.Bool("escalated", escalated))
	e.traceCheckpoint(context.Background(), ectx, wspan)
	wspan.End()
	// The workers' own time (checkpoint and exit) is logged so the agent's
	// overhead of a planned change can be told apart (bench/elastic).
	e.log.Info("workers stopped for the change", "round", r.Number, "took_ms", time.Since(signalled).Milliseconds(), "escalated", escalated)
	e.sayPlannedLoss(ectx, r)
}

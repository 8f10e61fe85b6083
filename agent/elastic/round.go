package elastic

// The I/O of a round's start: the ready barrier and the running marker
// (rendezvous.Barrier, rendezvous.RunningMarker), the round's TCPStore,
// and the workers' start with their assignment.

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/hyperpodrun/hyperpodrun/c10dstore"
	"github.com/hyperpodrun/hyperpodrun/checkpoint"
	"github.com/hyperpodrun/hyperpodrun/internal/telemetry"
	"github.com/hyperpodrun/hyperpodrun/launcher"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// barrier marks this node ready for round r (its previous workers are gone)
// and waits until every member is (rendezvous.Barrier) and no node outside
// the round still runs workers of an older round (rendezvous.RunningMarker).
// It returns the change instead when the round is superseded first (a
// member died before it got ready).
func (e *elastic) barrier(ctx context.Context, r *rendezvous.Round, event *scaleEvent) (*rendezvous.Change, error) {
	parent := ctx
	if event != nil {
		parent = event.ctx
	}
	_, span := e.tracer.Start(parent, "barrier", trace.WithAttributes(attribute.Int64("round", r.Number), attribute.Int("nodes", r.NumNodes)))
	defer span.End()
	// The round's store is up before this node says it is ready, so no
	// worker of any node starts before it: none waits on torch's
	// connect-retry grid.
	if err := e.serveStore(ctx, r); err != nil {
		return nil, err
	}
	b := rendezvous.NewBarrier(e.cli, e.cfg.Prefix, e.cfg.JobID, r.Number, r.NumNodes, e.node.ID(), e.opTimeout())
	if err := b.Arrive(ctx); err != nil {
		return nil, err
	}
	if r.Rank == 0 {
		if err := b.PruneOlder(ctx); err != nil {
			e.log.Warn("cannot delete old rounds' ready barriers", "err", err)
		}
	}
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changed, failed := e.superseded(bctx, r)
	passed := make(chan error, 1)
	go func() {
		err := b.Wait(bctx)
		if err == nil {
			// Nodes that are not in this round (leaving: drained, or
			// spares) may still be checkpointing with their workers of an
			// older round: no rank of this round exists before theirs are
			// gone. A dead node's marker expires with its lease.
			err = e.marker().WaitOlderGone(bctx, r.Number, func(nodes []string) {
				e.log.Info("waiting for older workers on other nodes to stop", "round", r.Number, "nodes", strings.Join(nodes, ","))
			})
		}
		passed <- err
	}()
	// A long wait says so, with how many members arrived: a node never
	// waits silently for the others (issue 24).
	arrived := time.Now()
	note := time.NewTicker(barrierNoteEvery)
	defer note.Stop()
	for {
		select {
		case err := <-passed:
			if err != nil {
				return nil, fmt.Errorf("round %d barrier: %w", r.Number, err)
			}
			return nil, nil
		case c := <-changed:
			return &c, nil
		case err := <-failed:
			return nil, err
		case <-e.node.LeaseLost():
			return nil, rendezvous.ErrLeaseLost
		case s := <-e.o.Signals:
			sig, _ := s.(syscall.Signal)
			return nil, signalError{sig}
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-note.C:
			n, _, err := b.Arrived(bctx)
			e.log.Info("waiting at the round's ready barrier for the other members to stop their previous workers", "round", r.Number,
				"arrived", n, "nodes", r.NumNodes, "waited", time.Since(arrived).Round(time.Second), "read_err", err)
		}
	}
}

// barrierNoteEvery is how often a node waiting at a round's ready barrier
// logs how many members arrived.
const barrierNoteEvery = 10 * time.Second

// serveStore starts the round's TCPStore on MASTER_PORT when this node
// holds group rank 0 (and the agent store is on); a store of an earlier
// round is closed first.
func (e *elastic) serveStore(ctx context.Context, r *rendezvous.Round) error {
	e.closeStore()
	if e.o.NoAgentStore || r.Rank != 0 {
		return nil
	}
	s, err := c10dstore.Listen(ctx, net.JoinHostPort("", strconv.Itoa(r.MasterPort)), c10dstore.Options{Logger: e.log})
	if err != nil {
		return fmt.Errorf("round %d: serve the workers' TCPStore on port %d (or run with --no-agent-store): %w", r.Number, r.MasterPort, err)
	}
	e.agentStore = s
	e.log.Info("serving the round's TCPStore for its workers", "round", r.Number, "port", r.MasterPort)
	return nil
}

// closeStore stops the round's TCPStore, if this node serves one.
func (e *elastic) closeStore() {
	if e.agentStore != nil {
		_ = e.agentStore.Close()
		e.agentStore = nil
	}
}

// marker is this node's running-workers marker, under its current lease.
func (e *elastic) marker() *rendezvous.RunningMarker {
	return rendezvous.NewRunningMarker(e.cli, e.cfg.Prefix, e.cfg.JobID, e.node.ID(), e.node.Lease(), e.opTimeout())
}

// markRunning records, under this node's lease, that its workers of round
// r may be alive from now on (fleet.Keys.Running), and leaves the will
// that revokes the lease should this agent die (leaseWill).
func (e *elastic) markRunning(ctx context.Context, r *rendezvous.Round) error {
	m := e.marker()
	if err := m.Mark(ctx, r.Number); err != nil {
		return err
	}
	e.guard.setWill(encodeWill(e.copts, e.node.Lease()))
	return nil
}

// markStopped clears this node's running marker once its workers are gone
// (best effort: the lease takes it with it otherwise, and this node's own
// marker never holds up its own barrier).
func (e *elastic) markStopped(ctx context.Context) {
	if err := e.marker().Clear(context.WithoutCancel(ctx)); err != nil {
		e.log.Warn("cannot clear this node's running-workers marker; it goes with the lease", "err", err)
	}
}

// start launches this node's workers for a round.
func (e *elastic) start(ctx context.Context, r *rendezvous.Round, restarts int, event *scaleEvent) (*launcher.Group, error) {
	parent := ctx
	if event != nil {
		parent = event.ctx
	}
	sctx, span := e.tracer.Start(parent, "restart")
	defer span.End()
	a, rec, err := e.prepare(ctx, sctx, r, restarts)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}
	span.SetAttributes(attribute.Int64("round", r.Number), attribute.Int("world_size", r.WorldSize),
		attribute.Int("restart_count", restarts))
	if rec != nil {
		span.SetAttributes(attribute.Int64("resume_step", rec.Step))
	}
	e.log.Info("starting workers", "round", r.Number, "group_rank", r.Rank, "nodes", r.NumNodes,
		"world_size", r.WorldSize, "base_rank", r.Self.BaseRank, "restart_count", restarts,
		"master", net.JoinHostPort(r.MasterAddr, strconv.Itoa(r.MasterPort)), "resume_step", resumeStep(rec))
	opts := []launcher.StartOption{launcher.OnSpawn(func(pid, localRank int) { e.ch.Admit(r.Number, pid, r.Self.BaseRank+localRank) })}
	if wd := e.guard.watchdog(); wd != nil {
		opts = append(opts, launcher.GuardedBy(wd))
	}
	g, err := launcher.Start(e.spec(), a, opts...)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}
	e.awaitFirstStep(event, r) // the event ends at the workers' first report
	return g, nil
}

// spec is the launcher spec of this agent's workers.
func (e *elastic) spec() launcher.Spec {
	spec := e.o.Spec
	// torch's env:// and tcp:// init then connect every rank as a client of
	// the store rank 0's node serves (torchrun's agent-store mode).
	spec.UseAgentStore = !e.o.NoAgentStore
	return spec
}

// prepare makes r the control channel's round (a fresh control token) and
// builds the workers' assignment for it: the round's ranks and master, the
// control channel, the checkpoint to resume from (claimed for this round)
// and the trace.
func (e *elastic) prepare(ctx, sctx context.Context, r *rendezvous.Round, restarts int) (launcher.Assignment, *checkpoint.Record, error) {
	// The channel believes only this round's workers (with this round's
	// fresh control token, in their environment below); the watchdog kills
	// them if this agent cannot prove its lease alive in time.
	e.ch.SetRound(r.Number)
	env := map[string]string{
		"HYPERPODRUN_ROUND":     strconv.FormatInt(r.Number, 10),
		"HYPERPODRUN_NUM_NODES": strconv.Itoa(r.NumNodes),
	}
	for k, v := range e.ch.Env() {
		env[k] = v
	}
	env["HYPERPODRUN_ELASTIC_SIGNAL"] = strconv.Itoa(int(e.o.ElasticSignal))
	if e.o.InProcessResize {
		env[envInProcess] = "1"
	}
	e.hangEnv(env, restarts)

	lctx, lcancel := context.WithTimeout(ctx, e.opTimeout())
	// Claim the checkpoint for this round before reading it: a commit of
	// an earlier round still in flight (this node's, from before it was
	// fenced) is refused from now on instead of landing after our workers
	// read where to resume.
	rec, err := e.store.Resume(lctx, r.Number)
	lcancel()
	if err != nil {
		return launcher.Assignment{}, nil, err
	}
	if rec != nil {
		for k, v := range rec.Env() {
			env[k] = v
		}
	}
	if tp := telemetry.TraceParent(sctx); tp != "" {
		env["TRACEPARENT"] = tp
	}
	if err := e.ch.ClearEvent(); err != nil {
		return launcher.Assignment{}, nil, err
	}
	return launcher.Assignment{
		GroupRank:      r.Rank,
		GroupWorldSize: r.NumNodes,
		BaseRank:       r.Self.BaseRank,
		WorldSize:      r.WorldSize,
		MasterAddr:     r.MasterAddr,
		MasterPort:     r.MasterPort,
		RestartCount:   restarts,
		Attempt:        restarts, // attempt_<restart count>, as torchrun numbers them
		Env:            env,
	}, rec, nil
}

func resumeStep(r *checkpoint.Record) int64 {
	if r == nil {
		return -1
	}
	return r.Step
}

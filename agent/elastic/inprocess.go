package elastic

import (
	"context"
	"net"
	"strconv"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/internal/telemetry"
	"github.com/hyperpodrun/hyperpodrun/launcher"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// envInProcess tells workers that the agent offers in-process
// reconfiguration (--inprocess-resize): on an event they call
// hyperpodrun_elastic.reconfigure() instead of exiting.
const envInProcess = "HYPERPODRUN_INPROCESS"

// In-process resize (Options.InProcessResize), in the agent's terms:
//
//  1. A change supersedes round N. handOver announces it (event file with
//     inprocess, then the elastic signal). The workers agree on a step,
//     checkpoint (the fallback), leave their process group and each sends
//     a reconfigure request, which the control channel parks. Once every
//     live worker of this node is parked, they hold no rank of round N:
//     the round ends as if they had exited (running marker cleared, the
//     round's store closed, the channel believes no one), and the group is
//     kept in e.carry.
//  2. The agent joins round N+1 and passes its ready barrier as usual (no
//     node starts N+1's ranks before every older worker of a leaving node
//     is gone), marks N+1 running, then resume gives the parked workers
//     their assignment: SetRound(N+1) (a fresh control token), Admit each
//     worker's process group with its new rank, and Release answers each
//     request with the new environment. They re-form the process group on
//     the store this round's rank-0 node serves.
//  3. A node that is not in round N+1 (LeftOut) tells its parked workers to
//     leave: they checkpointed already and exit 0.
//
// Anything else falls back to the restart path: a worker that does not ask
// within --graceful-timeout, one that exits or fails instead, a carried
// worker that died while parked, or a lost lease (SIGKILL, fencing).

// handOver announces a change to in-process workers and waits until every
// one of them is parked for its next assignment; it returns false (the
// workers are gone then) when they do not all ask within the graceful
// timeout, or some exited or failed instead: the next round restarts them.
func (e *elastic) handOver(ectx context.Context, g *launcher.Group, r *rendezvous.Round, ev control.Event) bool {
	o := e.o
	ev.InProcess = true
	ev.Deadline = time.Now().Add(o.GracefulTimeout)
	ev.Round = r.Number
	ev.TraceParent = telemetry.TraceParent(ectx)
	_, sspan := e.tracer.Start(ectx, "signal", trace.WithAttributes(attribute.String("signal", launcher.SignalName(o.ElasticSignal)),
		attribute.String("kind", string(ev.Kind)), attribute.Int("new_world_size", ev.NewWorldSize), attribute.Bool("inprocess", true)))
	e.log.Info("announcing a change to the workers, in process", "kind", ev.Kind, "new_world_size", ev.NewWorldSize, "why", ev.Reason)
	if err := e.ch.Announce(ev); err != nil {
		e.log.Warn("announce event", "err", err)
	}
	g.Signal(o.ElasticSignal)
	sspan.End()
	_, wspan := e.tracer.Start(ectx, "reconfigure_wait", trace.WithAttributes(attribute.Float64("graceful_timeout_s", o.GracefulTimeout.Seconds())))
	defer wspan.End()
	signalled := time.Now()
	t := time.NewTimer(o.GracefulTimeout)
	defer t.Stop()
	// A worker's exit is not announced on a channel of its own: poll.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	nproc := o.Spec.NProcPerNode
	fallback := func(why string, sig syscall.Signal) bool {
		e.log.Warn("workers did not all reconfigure in process; falling back to a restart", "round", r.Number, "why", why)
		wspan.SetAttributes(attribute.String("fallback", why))
		e.leaveParked("this node's workers are restarted: " + why)
		if sig == syscall.SIGKILL {
			g.Stop(syscall.SIGKILL, 0)
		} else {
			select {
			case <-g.Exited():
			case <-time.After(min(o.ShutdownTimeout, 5*time.Second)):
			}
			g.Stop(sig, o.ShutdownTimeout)
		}
		return false
	}
	for {
		parked, changed := e.ch.Parked()
		pids := g.PIDs()
		all := len(pids) == nproc
		for _, pid := range pids {
			if _, ok := parked[pid]; !ok {
				all = false
			}
		}
		if all {
			e.log.Info("workers wait for their next assignment in process", "round", r.Number, "took_ms", time.Since(signalled).Milliseconds())
			return true
		}
		if len(pids) < nproc {
			select {
			case <-g.Failed():
				return fallback("a worker failed", o.ShutdownSignal)
			default:
			}
			return fallback("a worker exited instead of calling reconfigure()", syscall.SIGTERM)
		}
		select {
		case <-changed:
		case <-tick.C:
		case <-e.node.LeaseLost():
			e.log.Error("lease lost while the workers reconfigure: killing them (fencing)", "round", r.Number)
			return fallback("lease lost", syscall.SIGKILL)
		case <-t.C:
			return fallback("not every worker called reconfigure() within --graceful-timeout", syscall.SIGTERM)
		}
	}
}

// leaveParked tells every parked worker to leave (exit 0).
func (e *elastic) leaveParked(why string) int {
	parked, _ := e.ch.Parked()
	if len(parked) == 0 {
		return 0
	}
	by := make(map[int]control.Assignment, len(parked))
	for pg := range parked {
		by[pg] = control.Assignment{Leave: true, Reason: why}
	}
	return e.ch.Release(by)
}

// dropCarry ends the workers kept for an in-process resize: told to leave,
// they exit 0; any still there after the shutdown timeout are stopped.
func (e *elastic) dropCarry(why string) {
	g := e.carry
	if g == nil {
		return
	}
	e.carry = nil
	if e.prewarmed {
		// Started ahead of their round: no rank, no state to save.
		e.prewarmed = false
		e.ch.ForgetPrewarmed()
		e.log.Info("the prewarmed workers are stopped", "why", why)
		e.leaveParked(why)
		g.Stop(e.o.ShutdownSignal, e.o.ShutdownTimeout)
		return
	}
	e.log.Info("the workers kept for the next round leave", "why", why)
	e.leaveParked(why)
	select {
	case <-g.Exited():
	case <-time.After(e.o.ShutdownTimeout):
	}
	g.Stop(syscall.SIGTERM, e.o.ShutdownTimeout)
}

// killCarry SIGKILLs the kept workers at once (fencing: the lease is lost).
func (e *elastic) killCarry() {
	if e.carry != nil {
		e.carry.Stop(syscall.SIGKILL, 0)
		e.carry = nil
	}
	if e.prewarmed {
		e.prewarmed = false
		e.ch.ForgetPrewarmed()
	}
}

// resume hands round r's assignment to the workers kept from the previous
// round. It returns nil and no error when they cannot all be carried over
// (one died while parked): they are stopped, and the caller starts new
// workers.
func (e *elastic) resume(ctx context.Context, r *rendezvous.Round, restarts int, event *scaleEvent) (*launcher.Group, error) {
	g := e.carry
	prewarmed := e.prewarmed
	e.carry = nil
	parent := ctx
	if event != nil {
		parent = event.ctx
	}
	sctx, span := e.tracer.Start(parent, "reconfigure", trace.WithAttributes(attribute.Int64("round", r.Number), attribute.Int("world_size", r.WorldSize)))
	defer span.End()
	a, rec, err := e.prepare(ctx, sctx, r, restarts)
	if err != nil {
		e.carry = g
		e.dropCarry("the next round could not be prepared")
		return nil, err
	}
	parked, _ := e.ch.Parked()
	workers, ok := g.Reassign(a)
	for _, w := range workers {
		if _, in := parked[w.PID]; !in {
			ok = false
		}
	}
	if !ok || len(workers) != e.o.Spec.NProcPerNode {
		if prewarmed {
			e.log.Warn("not every prewarmed worker asked for its assignment by the time the round formed; starting this node's workers instead", "round", r.Number)
		} else {
			e.log.Warn("a kept worker is gone or no longer waits; restarting this node's workers", "round", r.Number)
		}
		e.carry = g
		e.dropCarry("restarting this node's workers")
		return nil, nil
	}
	e.prewarmed = false
	by := make(map[int]control.Assignment, len(workers))
	for _, w := range workers {
		e.ch.Admit(r.Number, w.PID, w.Rank)
		by[w.PID] = control.Assignment{Round: r.Number, Env: w.Env}
	}
	msg := "reassigning workers in process"
	if prewarmed {
		msg = "assigning the prewarmed workers their first round"
	}
	e.log.Info(msg, "round", r.Number, "group_rank", r.Rank, "nodes", r.NumNodes,
		"world_size", r.WorldSize, "base_rank", r.Self.BaseRank, "restart_count", restarts,
		"master", net.JoinHostPort(r.MasterAddr, strconv.Itoa(r.MasterPort)), "resume_step", resumeStep(rec))
	if n := e.ch.Release(by); n != len(by) {
		// A worker hung up between the check and the answer: it died.
		e.log.Warn("a kept worker stopped waiting; restarting this node's workers", "answered", n, "workers", len(by))
		g.Stop(syscall.SIGTERM, e.o.ShutdownTimeout)
		return nil, nil
	}
	e.awaitFirstStep(event, r) // the event ends at the workers' first report
	return g, nil
}

// leaveParkedUntil tells every worker that parks for an in-process resize
// to leave, until done is closed or the returned stop is called: on a drain
// of this node its workers offer to reconfigure (they cannot know the node
// leaves), and they have checkpointed already.
func (e *elastic) leaveParkedUntil(done <-chan struct{}) (stop func()) {
	quit := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			parked, changed := e.ch.Parked()
			if len(parked) > 0 {
				e.leaveParked("this node leaves the job")
			}
			select {
			case <-changed:
			case <-done:
				return
			case <-quit:
				return
			}
		}
	}()
	return func() { close(quit); <-finished }
}

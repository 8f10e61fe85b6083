package elastic

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/telemetry"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// A scaling event's trace on one node (issue 29). Its root span,
// scale_event, is a child of the coordinator's decision span when the
// event is the coordinator's (the traceparent in the job's desired
// record), so the decision, the node agents' actions and every
// hyperpodrun's handling are one trace. Under it: decision, signal,
// checkpoint_wait (or reconfigure_wait), rendezvous, barrier, restart (or
// reconfigure) and first_step. scale_event carries job, team, node, from
// and to size and round, reason, generation, the committed checkpoint
// step, and downtime: the seconds from this node's workers stopping (or
// parking) to the first progress of the workers at the new size (their
// first heartbeat, or report: a committed checkpoint, ...).

// scaleEvent is the trace of one scaling event, carried from the moment a
// round is superseded until the workers run at the new size.
type scaleEvent struct {
	ctx  context.Context
	span trace.Span
	// stopped is when this node's workers stopped (or parked) for the
	// change; zero until then.
	stopped time.Time
}

// firstStepWait bounds how long a scaling event waits for the first
// report of the workers at the new size before it ends without one.
const firstStepWait = 10 * time.Minute

// pendingStep is a scaling event whose workers run at the new size and
// have not reported yet.
type pendingStep struct {
	event   *scaleEvent
	round   int64
	started time.Time
	timer   *time.Timer
	// done ends the watch of the workers' heartbeats.
	done chan struct{}
}

// heartbeatPoll is how often a pending scaling event looks for the new
// workers' first heartbeat (their progress under --hang-timeout).
const heartbeatPoll = 200 * time.Millisecond

// stepWatch holds the scaling event waiting for its first step.
type stepWatch struct {
	mu      sync.Mutex
	pending *pendingStep
}

// drainParent is the parent of a drain's scaling event: the
// coordinator's decision that took this node away (d), or none when d
// still places the job here (the node agent is leaving on its own).
func (e *elastic) drainParent(d *fleet.Desired) context.Context {
	if !d.TookAway(e.nodeID()) {
		return context.Background()
	}
	return decisionParent(d, context.Background())
}

// resourceAttrs name this process's job and node (when known) in its
// traces' resource.
func resourceAttrs(job, node string) []attribute.KeyValue {
	a := []attribute.KeyValue{attribute.String(telemetry.JobAttr, job)}
	if node != "" {
		a = append(a, attribute.String(telemetry.NodeAttr, node))
	}
	return a
}

// decisionParent is the context under which a scaling event's spans hang:
// the coordinator's decision span named in d (the desired record), else
// fallback.
func decisionParent(d *fleet.Desired, fallback context.Context) context.Context {
	if p, ok := telemetry.FromTraceParent(d.TraceParentOrEmpty()); ok {
		return p
	}
	return fallback
}

// eventAttrs are a scaling event's attributes known when it begins: who
// (job, team, node), why (reason, generation) and from what (round, size)
// to what (the target).
func eventAttrs(job, node, reason string, r *rendezvous.Round, d *fleet.Desired) []attribute.KeyValue {
	attrs := []attribute.KeyValue{attribute.String("job", job), attribute.String("node", node), attribute.String("reason", reason)}
	if r != nil {
		attrs = append(attrs, attribute.Int64("from_round", r.Number), attribute.Int("from_size", r.NumNodes))
	}
	if d != nil {
		if d.Team != "" {
			attrs = append(attrs, attribute.String("team", d.Team))
		}
		attrs = append(attrs, attribute.Int64("generation", d.Generation))
		if n := d.Target(); n > 0 {
			attrs = append(attrs, attribute.Int("to_size", n))
		}
	}
	return attrs
}

// beginEvent starts a scaling event's root span under parent.
func (e *elastic) beginEvent(parent context.Context, reason string, r *rendezvous.Round, d *fleet.Desired, extra ...attribute.KeyValue) *scaleEvent {
	attrs := append(eventAttrs(e.cfg.JobID, e.nodeID(), reason, r, d), extra...)
	ctx, span := e.tracer.Start(parent, "scale_event", trace.WithAttributes(attrs...))
	return &scaleEvent{ctx: ctx, span: span}
}

// nodeID is this agent's rendezvous member name.
func (e *elastic) nodeID() string {
	if e.node != nil {
		return e.node.ID()
	}
	return e.cfg.NodeID
}

// peerEvent is the scaling event of workers that stopped for a planned
// change this agent had not seen yet (announced on another node): under
// the coordinator's decision when the desired record names one.
func (e *elastic) peerEvent(ctx context.Context, r *rendezvous.Round) *scaleEvent {
	d := e.desired(ctx)
	ev := e.beginEvent(decisionParent(d, context.Background()), "peer_event", r, d)
	ev.workersStopped()
	return ev
}

// workersStopped records that this node's workers stopped (or parked)
// for the change: downtime counts from here.
func (ev *scaleEvent) workersStopped() {
	if ev != nil && ev.stopped.IsZero() {
		ev.stopped = time.Now()
		ev.span.AddEvent("workers_stopped")
	}
}

// traceCheckpoint notes the committed checkpoint step after the workers
// checkpointed for a change, on the wait span and the scaling event.
func (e *elastic) traceCheckpoint(ctx, ectx context.Context, wait trace.Span) {
	if !wait.IsRecording() {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, e.opTimeout())
	defer cancel()
	rec, err := e.store.Latest(cctx)
	if err != nil || rec == nil {
		return
	}
	a := attribute.Int64("checkpoint_step", rec.Step)
	wait.SetAttributes(a)
	trace.SpanFromContext(ectx).SetAttributes(a)
}

// awaitFirstStep hands the scaling event, whose workers now run round r,
// to the first report they send (firstStep); it ends unanswered when the
// round ends first (endPending) or after firstStepWait.
func (e *elastic) awaitFirstStep(ev *scaleEvent, r *rendezvous.Round) {
	if ev == nil {
		return
	}
	ev.span.SetAttributes(attribute.Int64("to_round", r.Number), attribute.Int("to_size", r.NumNodes), attribute.Int("world_size", r.WorldSize))
	e.endPending("the next scaling event began")
	p := &pendingStep{event: ev, round: r.Number, started: time.Now(), done: make(chan struct{})}
	p.timer = time.AfterFunc(firstStepWait, func() { e.endPending("no report from the workers within " + firstStepWait.String()) })
	e.steps.mu.Lock()
	e.steps.pending = p
	e.steps.mu.Unlock()
	if ev.span.IsRecording() {
		go e.watchHeartbeats(p)
	}
}

// watchHeartbeats ends p at the new workers' first heartbeat (the Python
// helper's progress from elastic_event_detected(), which the control
// channel keeps apart from the reports), unless a report or the round's
// end comes first.
func (e *elastic) watchHeartbeats(p *pendingStep) {
	t := time.NewTicker(heartbeatPoll)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
		}
		if first, ok := e.firstHeartbeat(); ok {
			e.endStep(p, control.Report{Type: control.ReportHeartbeat, Round: p.round}, first)
			return
		}
	}
}

// firstHeartbeat is when the current round's first heartbeat arrived.
func (e *elastic) firstHeartbeat() (time.Time, bool) {
	var first time.Time
	for _, h := range e.ch.Heartbeats() {
		if first.IsZero() || h.First.Before(first) {
			first = h.First
		}
	}
	return first, !first.IsZero()
}

// claim takes p from the pending slot; false when it ended meanwhile.
func (e *elastic) claim(p *pendingStep) bool {
	e.steps.mu.Lock()
	defer e.steps.mu.Unlock()
	if e.steps.pending != p {
		return false
	}
	e.steps.pending = nil
	p.timer.Stop()
	close(p.done)
	return true
}

// firstStep ends the pending scaling event at the first report of its
// round's workers (a committed checkpoint, ...; heartbeats are watched by
// watchHeartbeats): a first_step span from the workers' start, and the
// event's downtime.
func (e *elastic) firstStep(rep control.Report) {
	e.steps.mu.Lock()
	p := e.steps.pending
	e.steps.mu.Unlock()
	if p == nil || (rep.Round != 0 && rep.Round != p.round) {
		return
	}
	e.endStep(p, rep, time.Now())
}

// endStep ends p at now, the first progress rep of its workers, or at
// their first heartbeat if it came earlier.
func (e *elastic) endStep(p *pendingStep, rep control.Report, now time.Time) {
	if !e.claim(p) {
		return
	}
	if hb, ok := e.firstHeartbeat(); ok && hb.Before(now) {
		rep, now = control.Report{Type: control.ReportHeartbeat, Round: p.round}, hb
	}
	if now.Before(p.started) {
		now = p.started
	}
	_, span := e.tracer.Start(p.event.ctx, "first_step", trace.WithTimestamp(p.started),
		trace.WithAttributes(attribute.Int64("round", p.round), attribute.Int64("step", rep.Step), attribute.String("report", rep.Type)))
	span.End(trace.WithTimestamp(now))
	p.event.span.SetAttributes(attribute.String("first_report", rep.Type), attribute.Float64("downtime", downtime(p.event.stopped, p.started, now)))
	if rep.Type != control.ReportHeartbeat { // a heartbeat names no step
		p.event.span.SetAttributes(attribute.Int64("first_step", rep.Step))
	}
	p.event.span.End(trace.WithTimestamp(now))
}

// endPending ends a pending scaling event that saw no report of its
// workers (why), without a downtime.
func (e *elastic) endPending(why string) {
	e.steps.mu.Lock()
	p := e.steps.pending
	e.steps.mu.Unlock()
	if p == nil || !e.claim(p) {
		return
	}
	p.event.span.SetAttributes(attribute.String("first_step_unseen", why))
	p.event.span.End()
}

// downtime is the seconds this node trained at neither size: from its
// workers stopping (stopped; when unknown, from their start at the new
// size, started) to their first report at the new size (first).
func downtime(stopped, started, first time.Time) float64 {
	from := stopped
	if from.IsZero() || from.After(started) {
		from = started
	}
	if first.Before(from) {
		return 0
	}
	return first.Sub(from).Seconds()
}

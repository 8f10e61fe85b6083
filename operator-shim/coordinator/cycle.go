package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/telemetry"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// maxTxnOps is how many operations the coordinator puts in one
// transaction: etcd's default --max-txn-ops (fleet.MaxTxnOps, the one
// definition), less room for the few a batch adds after its check.
const maxTxnOps = fleet.MaxTxnOps - 8

// maxFollowUps bounds the follow-up cycles run in a row without an input
// change.
const maxFollowUps = 8

// cycle runs the engine on the view and writes what changed; again says a
// follow-up cycle is due (an allocation changed, or a job was preempted). On an error the view may
// be ahead of etcd: the caller reads it again.
func (c *Coordinator) cycle(ctx context.Context, leader clientv3.Cmp) (again bool, err error) {
	start := time.Now()
	v := c.view
	// Node records whose alive key is gone are deleted (liveness.go).
	c.reapDead(ctx)
	if err := c.refreshJobs(ctx); err != nil {
		c.stale = true
		return false, err
	}
	// The nodes' reports of jobs placed on them become finish and
	// problem records; the others are ignored.
	c.processReports(ctx, leader)
	// Deleted jobs stopped by an earlier cycle go once their nodes left
	// (one stopped in this cycle keeps its stop record until then).
	_, owned := v.state(time.Time{}, c.cfg.Engine)
	c.forgetDeleted(ctx, leader, owned)
	now := c.cfg.Now()
	st, _ := v.state(now, c.cfg.Engine)
	t0 := time.Now()
	d, fast := c.decide(st)
	// The fast path's decision is one the full cycle would make and then
	// keep (policy.Engine.Admit), unless it preempted (Settled): as the
	// full cycle's, that one is followed by another.
	settled := fast && c.engine.Settled()
	engine := time.Since(t0)
	c.logProblems(d.Problems)
	c.uids = c.decideUIDs(&d)
	if err := c.mintFor(ctx, d.Allocations); err != nil {
		return false, err
	}
	c.ensureTeamUsers(ctx)
	c.removeTeamUsers(ctx)
	t1 := time.Now()
	p := c.plan(d, !v.haveLast)
	// A follow-up comes when the cycle preempts or changes an allocation
	// (below), unless the follow-ups in a row reached their bound.
	p.settle((p.again || (len(p.changed) > 0 && !settled)) && c.followUps < maxFollowUps)
	diff := time.Since(t1)
	// The view takes the plan only once it is written: on an error it is
	// as it was, and read again before the next cycle.
	ops, err := c.commitPlan(ctx, etcdCommitter{c: c, leader: leader}, p)
	if err != nil {
		c.stale = true
		return false, err
	}
	if verifyWrites {
		c.verifyDiff(d, p)
	}
	changed, running, again := p.changed, p.running, p.again
	// A cycle that changed an allocation is followed by another at once:
	// the engine starts from the allocations it is given, so the next
	// cycle on the same inputs may decide more (admit into capacity this
	// one freed, re-explain the pending jobs); without it that waited for
	// the next input change. The follow-ups end at the first cycle that
	// changes no allocation, and after maxFollowUps in a row (an engine
	// that kept changing its mind would otherwise never rest).
	// A settled fast path decision: no follow-up.
	again = again || (len(changed) > 0 && !settled)
	if again {
		c.followUps++
		if c.followUps > maxFollowUps {
			c.log.Warn("the engine changed allocations in every one of the last cycles on the same inputs; waiting for an input change", "cycles", maxFollowUps)
			again, c.followUps = false, 0
		}
	} else {
		c.followUps = 0
	}
	c.log.Debug("cycle", "fast", fast, "engine", engine, "diff", diff, "write", time.Since(t1)-diff, "ops", ops, "jobs", len(d.Reasons))
	c.ran, c.lastCycle = v.changed, now
	if c.reportsLeft {
		c.reportRetries++
	} else {
		c.reportRetries = 0
	}
	c.wake = retryWake(c.nextWake(d, now), now, c.reportRetries)
	if c.cfg.OnDecision != nil {
		c.cfg.OnDecision(d)
	}
	c.revokeEnded(ctx, running)
	if c.cfg.OnCycle != nil {
		cs := CycleStats{Duration: time.Since(start), Engine: engine, Decision: d, Changed: changed, Ops: ops}
		cs.Waited, cs.Fast, cs.NextWake = c.waited, fast, c.wake
		c.cfg.OnCycle(cs)
	}
	return again, nil
}

// reportRetry is how soon a cycle comes again after a node's report could
// not be processed (an etcd error), when nothing else brings one sooner;
// it doubles with each cycle in a row that leaves reports, up to
// maxReportRetry.
const (
	reportRetry    = time.Second
	maxReportRetry = 30 * time.Second
)

// retryWake is the cycle's next wake, wake, brought forward to a retry when
// the last retries cycles in a row left reports unprocessed: without it a
// finished job's report waited for the next input change or the resync
// (10 minutes), the job Running all that while. The retry backs off (1 s,
// 2 s, 4 s, ... 30 s): each is a full cycle, and an etcd that refuses
// writes for minutes (its space alarm) would otherwise cost one every
// second.
func retryWake(wake, now time.Time, retries int) time.Time {
	if retries <= 0 {
		return wake
	}
	delay := maxReportRetry
	if retries <= 5 {
		delay = min(reportRetry<<(retries-1), maxReportRetry)
	}
	if retry := now.Add(delay); wake.IsZero() || retry.Before(wake) {
		return retry
	}
	return wake
}

// maxFastSubmits bounds the submits one cycle decides on the engine's
// fast path: more (a burst) go to a full cycle.
const maxFastSubmits = 32

// decide runs the engine on st: on its fast path (policy.Engine.Admit)
// when every input change since the last cycle was the submit of a job
// under a new name and the last cycle's decision was written whole, or
// (policy.Engine.FollowUp) when nothing changed since a fast path
// decision that preempted; else a full cycle. fast says which.
func (c *Coordinator) decide(st policy.State) (d policy.Decision, fast bool) {
	v := c.view
	submitted := v.submitted
	v.submitted = nil
	onlySubmits := v.changed-c.ran == v.submitChanges-c.ranSubmits
	// Jobs whose records changed outside the write diff since the last
	// decision (re-read, forgotten, expired) are inputs the fast path does
	// not know of; the statuses a follow-up left to compare in full
	// (touched too) are not: the plan compares those whichever path
	// decided.
	untouched := v.outside == c.ranOutside
	c.ranSubmits, c.ranOutside = v.submitChanges, v.outside
	if onlySubmits && v.haveLast && untouched && len(submitted) > 0 && len(submitted) <= maxFastSubmits {
		if d, ok := c.engine.Admit(st, submitted); ok {
			return d, true
		}
		c.log.Debug("submits decided by a full cycle", "why", c.engine.Declined())
	}
	if onlySubmits && v.haveLast && untouched && len(submitted) == 0 && !c.engine.Settled() {
		// The follow-up of a fast path decision that preempted, with no
		// input changed since: the engine's fast path decides it when
		// the full cycle would change nothing more.
		if d, ok := c.engine.FollowUp(st); ok {
			return d, true
		}
		c.log.Debug("follow-up decided by a full cycle", "why", c.engine.Declined())
	}
	return c.engine.Schedule(st), false
}

// verifyWrites makes every cycle check its write diff against a full
// comparison of the decision with the view (tests set it): the diff
// visits only the jobs whose decision changed, and must miss none.
var verifyWrites bool

// verifyDiff compares the whole decision with the view the committed plan
// wrote left, as the first cycle after a read does; it panics when that
// finds anything to write. The events the cycle recorded are planned again
// by the comparison (an event is written whenever the decision is one
// worth an event): those are no miss. The comparison's plan is not
// applied.
func (c *Coordinator) verifyDiff(d policy.Decision, wrote *plan) {
	k := c.store.Keys
	evented := map[string]bool{}
	for _, e := range wrote.events {
		evented[e.job] = true
	}
	var keys []string
	for _, u := range c.plan(d, true).units {
		for _, op := range u {
			key := string(op.KeyBytes())
			if ek, ok := k.ParseEventKey(key); ok && evented[ek.Job] {
				continue
			}
			keys = append(keys, key)
		}
	}
	if len(keys) > 0 {
		panic(fmt.Sprintf("coordinator: the incremental write diff missed %d writes: %v", len(keys), keys))
	}
}

// commitConcurrency is how many of a cycle's transactions are in flight
// at once: etcd commits concurrent proposals in one raft round and one
// fsync, so a large cycle (a cold start, a churn round) is not one fsync
// per 120 ops.
const commitConcurrency = 4

// commit writes units (the ops of one job stay in one transaction), each
// transaction guarded by leadership, up to commitConcurrency at once; it
// returns how many ops it wrote. The units from each of phases on
// (plan.moves, plan.takes) are sent only once every unit before them is
// written. On an error some of the other transactions may have committed,
// none after a failed one of an earlier phase: the caller reads the view
// again.
func (c *Coordinator) commit(ctx context.Context, leader clientv3.Cmp, units [][]clientv3.Op, phases ...int) (int, error) {
	type txn struct {
		ops     []clientv3.Op
		ordered bool // committed after every earlier transaction
	}
	var txns []txn
	var batch []clientv3.Op
	orderNext := false // the next transaction starts a phase
	cut := func(ordered bool) {
		if len(batch) > 0 {
			txns = append(txns, txn{batch, ordered || orderNext})
			batch, orderNext = nil, false
		}
	}
	for i, u := range units {
		if i > 0 && slices.Contains(phases, i) {
			cut(false)
			orderNext = true
		}
		if len(batch)+len(u) > maxTxnOps {
			cut(false)
		}
		// A job on more nodes than a transaction holds is split: its
		// desired record goes first, its assignments after, in order.
		split := false
		for len(u) > maxTxnOps {
			batch = append(batch, u[:maxTxnOps]...)
			u = u[maxTxnOps:]
			cut(split)
			split = true
		}
		batch = append(batch, u...)
		if split {
			cut(true)
		}
	}
	cut(false)
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		written  int
		firstErr error
	)
	sem := make(chan struct{}, commitConcurrency)
	for _, t := range txns {
		if t.ordered {
			wg.Wait()
		}
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(ops []clientv3.Op) {
			defer func() { <-sem; wg.Done() }()
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			r, err := c.cli.Txn(wctx).If(leader).Then(ops...).Commit()
			cancel()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				c.etcdError("write")
				if firstErr == nil {
					firstErr = fmt.Errorf("write decision: %w", err)
				}
			case !r.Succeeded:
				if firstErr == nil {
					firstErr = errNotLeader
				}
			default:
				c.observeRev(r.Header.Revision)
				written += len(ops)
			}
		}(t.ops)
	}
	wg.Wait()
	return written, firstErr
}

// sameAllocation reports whether two allocations are equal.
func sameAllocation(a, b api.Allocation) bool {
	return a.Job == b.Job && a.Team == b.Team && a.Flavor == b.Flavor && a.Size == b.Size &&
		a.AcceleratorsPerNode == b.AcceleratorsPerNode && a.Since.Equal(b.Since) && a.LastResize.Equal(b.LastResize) &&
		slices.Equal(a.Nodes, b.Nodes) && slices.Equal(a.TookFrom, b.TookFrom)
}

// statusReason is what a job's status records of decision r. An admission
// is recorded as the running state it starts: kind Running at its size,
// with the admission's message. The admission itself is in the event
// history (Admitted, with its code), and the next cycle's decision, the
// job running unchanged, is then no rewrite: one status write per admitted
// job, not two (issue 27's writes per churn round).
func statusReason(r policy.Reason) policy.Reason {
	if r.Kind == policy.KindAdmitted {
		r.Kind, r.Code, r.FromSize, r.For, r.ForTeam = policy.KindRunning, "", r.ToSize, nil, ""
	}
	return r
}

// stable reports whether a job's status needs no rewrite: the same kind,
// code, sizes and beneficiaries. The message alone (its usage figures,
// who holds the capacity now) is no reason to write: the team usage record
// has the figures.
func stable(prev, r *policy.Reason) bool {
	return prev.Kind == r.Kind && prev.Code == r.Code && prev.FromSize == r.FromSize && prev.ToSize == r.ToSize &&
		prev.ForTeam == r.ForTeam && slices.Equal(prev.For, r.For) && prev.Team == r.Team
}

// decisionSpan records the decision that changes a job's size as the root
// span of that scale event's trace and returns its traceparent, which
// travels in the desired record to the agents ("" when tracing is off).
func (c *Coordinator) decisionSpan(now time.Time, r policy.Reason, from, to int) string {
	attrs := []attribute.KeyValue{attribute.String("job", r.Job), attribute.String("team", r.Team), attribute.String("kind", string(r.Kind)),
		attribute.String("code", string(r.Code)), attribute.Int("from_size", from), attribute.Int("to_size", to),
		attribute.String("reason", r.Message)}
	if r.RequestedBy != "" {
		// Who asked for the change (a user's resize): the spec's writer.
		attrs = append(attrs, attribute.String("requested_by", r.RequestedBy))
	}
	ctx, span := c.tracer.Start(context.Background(), "coordinator.decision", trace.WithNewRoot(), trace.WithTimestamp(now),
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
	defer span.End()
	return telemetry.TraceParent(ctx)
}

// nextWake is when the engine's time-based rule (the stable period) next
// lets a job grow or move: the next cycle then.
func (c *Coordinator) nextWake(d policy.Decision, now time.Time) time.Time {
	stablePeriod := c.cfg.Engine.StablePeriod()
	if stablePeriod <= 0 {
		return time.Time{}
	}
	var wake time.Time
	for _, a := range d.Allocations {
		t := a.LastResize.Add(stablePeriod)
		if a.LastResize.IsZero() || !t.After(now) {
			continue
		}
		if wake.IsZero() || t.Before(wake) {
			wake = t
		}
	}
	if !wake.IsZero() {
		wake = wake.Add(10 * time.Millisecond)
	}
	return wake
}

// logProblems logs invalid inputs when they appear, not every cycle.
func (c *Coordinator) logProblems(ps []policy.Problem) {
	seen := make(map[string]bool, len(ps))
	for _, p := range ps {
		k := p.Object + "\x00" + p.Name + "\x00" + p.Error
		seen[k] = true
		if !c.problems[k] {
			c.log.Warn("invalid input ignored", "object", p.Object, "name", p.Name, "err", p.Error)
		}
	}
	c.problems = seen
}

// refreshJobs reads again the desired record and status of the jobs whose
// spec was just created: SubmitJob deletes what an earlier job of the
// same name left, in the transaction that creates the spec.
func (c *Coordinator) refreshJobs(ctx context.Context) error {
	v := c.view
	if len(v.refresh) == 0 {
		return nil
	}
	jobs := make([]string, 0, len(v.refresh))
	for j := range v.refresh {
		if _, known := v.desired[j]; known {
			jobs = append(jobs, j)
		} else if _, known := v.statuses[j]; known {
			jobs = append(jobs, j)
		}
	}
	clear(v.refresh)
	for len(jobs) > 0 {
		n := min(len(jobs), maxTxnOps/2)
		var ops []clientv3.Op
		for _, j := range jobs[:n] {
			ops = append(ops, clientv3.OpGet(c.store.Keys.Desired(j)), clientv3.OpGet(c.store.Keys.Status(j)))
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := c.cli.Txn(rctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			c.etcdError("read")
			return fmt.Errorf("read resubmitted jobs' records: %w", err)
		}
		for i, j := range jobs[:n] {
			v.touch(j)
			if kvs := r.Responses[2*i].GetResponseRange().Kvs; len(kvs) == 0 {
				v.dropDesired(j)
			} else if d, err := fleet.DecodeDesired(string(kvs[0].Key), kvs[0].Value); err == nil {
				v.setDesired(*d)
			}
			if kvs := r.Responses[2*i+1].GetResponseRange().Kvs; len(kvs) == 0 {
				delete(v.statuses, j)
			} else if s, err := fleet.DecodeStatus(string(kvs[0].Key), kvs[0].Value); err == nil {
				v.statuses[j] = s
			} else {
				v.statuses[j] = unreadableStatus(j)
			}
		}
		jobs = jobs[n:]
	}
	return nil
}

// forgetDeleted removes what deleted jobs left behind (rendezvous, restart
// count, checkpoint record, desired record, status) once their nodes have
// left: a job submitted again under the same name starts afresh.
func (c *Coordinator) forgetDeleted(ctx context.Context, leader clientv3.Cmp, owned map[string]specRec) {
	v := c.view
	for job := range v.deleted {
		d := v.desired[job]
		if _, has := owned[job]; has || d.Stop == nil || ctx.Err() != nil {
			continue
		}
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := c.cli.Txn(fctx).If(leader, c.store.NoMembers(job), c.store.SpecAbsent(d.Team, job)).
			Then(c.store.ForgetJobOps(job, "")...).Commit()
		cancel()
		switch {
		case err != nil:
			c.etcdError("write")
			c.log.Warn("cannot forget a deleted job yet", "job", job, "err", err)
		case r.Succeeded:
			v.dropDesired(job)
			delete(v.statuses, job)
			v.delFinished(job)
			v.touch(job)
			c.log.Info("deleted job forgotten: its rendezvous, checkpoint record and status are gone", "job", job)
		}
	}
}

// housekeeping runs what is due: forgetting deleted jobs whose nodes have
// left, cleaning up finished jobs past their retention, and compaction.
// It reads and writes nothing when nothing is due.
func (c *Coordinator) housekeeping(ctx context.Context, leader clientv3.Cmp) {
	if c.view == nil {
		return
	}
	_, owned := c.view.state(time.Time{}, c.cfg.Engine)
	c.forgetDeleted(ctx, leader, owned)
	c.expireFinished(ctx, leader, owned)
	c.compact(ctx)
}

// expireFinished deletes every record of the jobs that finished longer
// than FinishedRetention ago (once their nodes have left the rendezvous).
func (c *Coordinator) expireFinished(ctx context.Context, leader clientv3.Cmp, owned map[string]specRec) {
	if c.cfg.FinishedRetention < 0 {
		return
	}
	v := c.view
	now := c.cfg.Now()
	var due []string
	for job, f := range v.finished {
		t := f.f.Time
		if t.IsZero() || t.After(f.seen) {
			t = f.seen
		}
		if now.Sub(t) >= c.cfg.FinishedRetention {
			due = append(due, job)
		}
	}
	sort.Strings(due)
	for _, job := range due {
		if ctx.Err() != nil {
			return
		}
		team := v.desired[job].Team
		if s, ok := owned[job]; ok {
			team = s.job.Team
		}
		ops := c.store.ForgetJobOps(job, team)
		for n := range v.assigned[job] {
			ops = append(ops, c.store.DeleteAssignmentOp(n, job))
		}
		evs := v.events.byJob[job]
		for _, e := range evs {
			if len(ops) >= maxTxnOps {
				break // the rest age out with the history
			}
			ops = append(ops, clientv3.OpDelete(e.key))
		}
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := c.cli.Txn(fctx).If(leader, c.store.NoMembers(job)).Then(ops...).Commit()
		cancel()
		if err != nil {
			c.etcdError("write")
			c.log.Warn("cannot clean up a finished job yet", "job", job, "err", err)
			continue
		}
		if !r.Succeeded {
			continue // nodes still in its rendezvous, or not the leader
		}
		c.observeRev(r.Header.Revision)
		if team != "" {
			v.delSpec(c.store.Keys.Spec(team, job))
		}
		v.delFinished(job)
		v.dropDesired(job)
		delete(v.statuses, job)
		delete(v.assigned, job)
		v.events.drop(job)
		v.touch(job)
		v.changed++
		c.log.Info("finished job's records removed after the retention period", "job", job, "retention", c.cfg.FinishedRetention)
	}
}

// observeRev notes a revision etcd reported, for compaction.
func (c *Coordinator) observeRev(rev int64) {
	if c.cfg.CompactRetention < 0 || rev == 0 {
		return
	}
	now := c.cfg.Now()
	if n := len(c.revs); n > 0 && (rev <= c.revs[n-1].rev || now.Sub(c.revs[n-1].t) < c.cfg.CompactRetention/20) {
		return
	}
	c.revs = append(c.revs, revAt{now, rev})
}

// compact compacts etcd's history to the newest revision seen at least
// CompactRetention ago. It probes the revision (a one-key count) when it
// has seen none for a while: rendezvous traffic, which it does not watch,
// moves it too.
func (c *Coordinator) compact(ctx context.Context) {
	if c.cfg.CompactRetention < 0 || c.compactDenied {
		return
	}
	now := c.cfg.Now()
	if n := len(c.revs); n == 0 || now.Sub(c.revs[n-1].t) >= c.cfg.CompactRetention/10 {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := c.cli.Get(pctx, c.store.Keys.Usage(), clientv3.WithCountOnly())
		cancel()
		if err == nil {
			c.observeRev(r.Header.Revision)
		}
	}
	i := sort.Search(len(c.revs), func(i int) bool { return now.Sub(c.revs[i].t) < c.cfg.CompactRetention }) - 1
	if i < 0 || c.revs[i].rev <= c.compacted {
		return
	}
	rev := c.revs[i].rev
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err := c.cli.Compact(cctx, rev)
	cancel()
	switch {
	case err == nil, errors.Is(err, rpctypes.ErrCompacted):
		c.compacted = rev
		c.revs = slices.Clone(c.revs[i+1:])
		c.log.Debug("compacted etcd's history", "revision", rev)
	case fleet.IsPermissionDenied(err):
		c.compactDenied = true
		c.log.Warn("cannot compact etcd (its root role is needed): run etcd with --auto-compaction-retention instead", "err", err)
	default:
		c.etcdError("compact")
		if !strings.Contains(err.Error(), "context canceled") {
			c.log.Warn("compact etcd", "err", err)
		}
	}
}

// Package coordinator is the daemon around the policy engine: it watches
// the fleet, teams and jobs in etcd, runs policy.Schedule, and writes each
// job's desired record (size, placement, or why it was stopped: one record,
// one put), a status and an event for every decision. Two coordinators
// can run for HA: leadership is an etcd election, and every write is a
// transaction that only succeeds while this coordinator is the leader.
package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// Config tunes the coordinator.
type Config struct {
	// Prefix is the etcd prefix ("" = /hyperpodrun).
	Prefix string
	// Identity names this coordinator in the election (default: hostname-pid).
	Identity string
	// Resync runs a cycle at least this often even without changes, for the
	// time-based rules (default 2s).
	Resync time.Duration
	// Debounce batches bursts of changes into one cycle (default 50ms).
	Debounce time.Duration
	// SessionTTL is the leader lease TTL in seconds (default 5).
	SessionTTL int
	// Engine tunes the policy engine.
	Engine policy.Config
	// MaxEventsPerJob and MaxEvents bound the decision history kept in etcd
	// (defaults 200 and 20,000); the oldest events go first.
	MaxEventsPerJob, MaxEvents int
	// PruneInterval is how often the history is pruned (default 30s).
	PruneInterval time.Duration
	// Now is the clock (default time.Now); the engine itself never reads it.
	Now    func() time.Time
	Logger *slog.Logger
	// OnDecision, when set, sees every decision (tests, the demo's timeline).
	OnDecision func(policy.Decision)
	// JobCredentials mints every admitted job an etcd user limited to its
	// own keys (etcdauth.JobRoleFor) before its desired record is written,
	// and revokes it when the job holds no nodes any more. It needs etcd
	// auth on and this client's user to hold etcd's root role.
	JobCredentials bool
}

// Coordinator is one coordinator instance.
type Coordinator struct {
	cfg   Config
	cli   *clientv3.Client
	store *fleet.Store
	log   *slog.Logger
	// minted are the jobs holding etcd credentials (JobCredentials); nil
	// until read.
	minted map[string]bool
}

// New returns a coordinator; Run starts it.
func New(cli *clientv3.Client, cfg Config) *Coordinator {
	if cfg.Resync <= 0 {
		cfg.Resync = 2 * time.Second
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = 50 * time.Millisecond
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 5
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxEventsPerJob <= 0 {
		cfg.MaxEventsPerJob = 200
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = 20000
	}
	if cfg.PruneInterval <= 0 {
		cfg.PruneInterval = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Identity == "" {
		cfg.Identity = defaultIdentity()
	}
	st := fleet.New(cli, cfg.Prefix)
	cfg.Prefix = st.Keys.Prefix()
	return &Coordinator{cfg: cfg, cli: cli, store: st, log: cfg.Logger.With("coordinator", cfg.Identity)}
}

// Run campaigns for leadership and, while leader, schedules on every
// change. It returns when ctx ends (resigning) or on an unrecoverable error.
func (c *Coordinator) Run(ctx context.Context) error {
	for {
		err := c.lead(ctx)
		if ctx.Err() != nil {
			return nil
		}
		c.log.Warn("lost leadership; campaigning again", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (c *Coordinator) lead(ctx context.Context) error {
	sess, err := concurrency.NewSession(c.cli, concurrency.WithTTL(c.cfg.SessionTTL), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("coordinator session: %w", err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, c.store.Keys.Leader())
	if err := el.Campaign(ctx, c.cfg.Identity); err != nil {
		return fmt.Errorf("campaign: %w", err)
	}
	c.log.Info("elected leader")
	c.minted = nil // another leader may have minted and revoked meanwhile
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		el.Resign(rctx)
		cancel()
	}()
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	leader := clientv3.Compare(clientv3.CreateRevision(el.Key()), "=", el.Rev())

	// Watch what the engine reads: nodes, teams, job specs.
	wch := c.cli.Watch(clientv3.WithRequireLeader(lctx), c.store.Keys.Root(), clientv3.WithPrefix(), clientv3.WithFilterDelete())
	del := c.cli.Watch(clientv3.WithRequireLeader(lctx), c.store.Keys.Root(), clientv3.WithPrefix(), clientv3.WithFilterPut())
	tick := time.NewTicker(c.cfg.Resync)
	defer tick.Stop()
	prune := time.NewTicker(c.cfg.PruneInterval)
	defer prune.Stop()
	dirty := true
	var debounce <-chan time.Time
	for {
		if dirty && debounce == nil {
			debounce = time.After(c.cfg.Debounce)
		}
		select {
		case <-lctx.Done():
			return lctx.Err()
		case <-sess.Done():
			return errors.New("leader session expired")
		case w, ok := <-wch:
			if !ok || w.Err() != nil {
				return fmt.Errorf("watch: %v", w.Err())
			}
			dirty = dirty || c.relevant(w.Events)
		case w, ok := <-del:
			if !ok || w.Err() != nil {
				return fmt.Errorf("watch: %v", w.Err())
			}
			dirty = dirty || c.relevant(w.Events)
		case <-tick.C:
			dirty = true
		case <-prune.C:
			c.pruneEvents(lctx)
		case <-debounce:
			debounce = nil
			dirty = false
			again, err := c.cycle(lctx, leader)
			if err != nil {
				if errors.Is(err, errNotLeader) {
					return err
				}
				c.log.Warn("cycle failed; retrying", "err", err)
			}
			// Preempted jobs are reconsidered by the next cycle (the engine
			// readmits them a cycle later): run it now, not at the resync.
			dirty = err != nil || again
		}
	}
}

func (c *Coordinator) relevant(evs []*clientv3.Event) bool {
	for _, e := range evs {
		k := string(e.Kv.Key)
		for _, p := range []string{c.store.Keys.NodesPrefix(), c.store.Keys.TeamsPrefix(), c.store.Keys.SpecsPrefix(), c.store.Keys.FinishedPrefix()} {
			if strings.HasPrefix(k, p) {
				return true
			}
		}
	}
	return false
}

var errNotLeader = errors.New("not the leader any more")

// NodeFromInventory is how the engine sees a registered node.
func NodeFromInventory(inv devices.Inventory) policy.Node {
	n := policy.Node{Name: inv.Node, Flavor: inv.Flavor, VCPUs: inv.VCPUs, Memory: policy.ByteSize(inv.MemoryBytes),
		Draining: inv.State == devices.StateDraining}
	for _, a := range inv.Accelerators {
		if a.Flavor != inv.Flavor {
			continue
		}
		n.Accelerators++
		if !a.Healthy {
			n.UnhealthyAccelerators++
		}
	}
	if n.Flavor == devices.FlavorCPU {
		// CPU nodes are scheduled in whole nodes: one unit each.
		n.Accelerators = 1
	}
	return n
}

// State reads the engine's input from etcd.
func (c *Coordinator) State(ctx context.Context) (policy.State, error) {
	st, _, _, err := c.read(ctx)
	return st, err
}

// read is State plus every job's desired record, by job, and the names of
// the jobs that have a spec.
func (c *Coordinator) read(ctx context.Context) (policy.State, map[string]fleet.Desired, map[string]bool, error) {
	st := policy.State{Now: c.cfg.Now(), Config: c.cfg.Engine}
	invs, bad, err := c.store.Nodes(ctx)
	if err != nil {
		return st, nil, nil, err
	}
	c.logBad("node", bad)
	for _, inv := range invs {
		st.Nodes = append(st.Nodes, NodeFromInventory(inv))
	}
	if st.Teams, bad, err = c.store.Teams(ctx); err != nil {
		return st, nil, nil, err
	}
	c.logBad("team", bad)
	specs, bad, err := c.store.Jobs(ctx)
	if err != nil {
		return st, nil, nil, err
	}
	c.logBad("job", bad)
	finished, bad, err := c.store.Finished(ctx)
	if err != nil {
		return st, nil, nil, err
	}
	c.logBad("finish record", bad)
	names := make(map[string]bool, len(specs))
	for _, s := range specs {
		names[s.Name] = true
		if _, done := finished[s.Name]; done {
			continue // succeeded or failed: its capacity is released
		}
		st.Jobs = append(st.Jobs, s.Job)
	}
	ds, bad, err := c.store.DesiredAll(ctx)
	if err != nil {
		return st, nil, nil, err
	}
	c.logBad("desired record", bad)
	desired := make(map[string]fleet.Desired, len(ds))
	for _, d := range ds {
		desired[d.Job] = d
		if d.Running() {
			st.Allocations = append(st.Allocations, d.Allocation)
		}
	}
	return st, desired, names, nil
}

// forgetDeleted removes what deleted jobs left behind (rendezvous, restart
// count, checkpoint record, desired record, status) once their nodes have
// left: a job submitted again under the same name starts afresh.
func (c *Coordinator) forgetDeleted(ctx context.Context, desired map[string]fleet.Desired, specs map[string]bool) {
	for job, d := range desired {
		if specs[job] || d.Stop == nil || ctx.Err() != nil {
			continue
		}
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		done, err := c.store.Forget(fctx, job)
		cancel()
		switch {
		case err != nil:
			c.log.Warn("cannot forget a deleted job yet", "job", job, "err", err)
		case done:
			c.log.Info("deleted job forgotten: its rendezvous, checkpoint record and status are gone", "job", job)
		}
	}
}

// pruneEvents bounds the decision history.
func (c *Coordinator) pruneEvents(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := c.store.PruneEvents(pctx, c.cfg.MaxEventsPerJob, c.cfg.MaxEvents)
	if err != nil {
		c.log.Warn("prune events", "err", err)
	} else if n > 0 {
		c.log.Info("pruned old events", "deleted", n)
	}
}

func (c *Coordinator) logBad(what string, bad []error) {
	for _, b := range bad {
		c.log.Warn("ignoring malformed "+what, "err", b)
	}
}

// Cycle runs the engine once and writes what changed, guarded by leader.
func (c *Coordinator) Cycle(ctx context.Context, leader clientv3.Cmp) error {
	_, err := c.cycle(ctx, leader)
	return err
}

// cycle is Cycle; again says a follow-up cycle is due (a job was preempted).
func (c *Coordinator) cycle(ctx context.Context, leader clientv3.Cmp) (again bool, err error) {
	st, desired, specs, err := c.read(ctx)
	if err != nil {
		return false, err
	}
	d := policy.Schedule(st)
	for _, p := range d.Problems {
		c.log.Warn("invalid input ignored", "object", p.Object, "name", p.Name, "err", p.Error)
	}
	statuses, bad, err := c.store.Statuses(ctx)
	if err != nil {
		return false, err
	}
	c.logBad("status", bad)
	ops, again, err := c.writes(d, desired, statuses)
	if err != nil {
		return false, err
	}
	if err := c.mintFor(ctx, d.Allocations); err != nil {
		return false, err
	}
	if c.cfg.OnDecision != nil {
		c.cfg.OnDecision(d)
	}
	// etcd caps a transaction at 128 operations by default; write in
	// chunks, each guarded by leadership. Each job's desired record is one
	// put, so a job never sees half a decision.
	for len(ops) > 0 {
		n := min(len(ops), 100)
		r, err := c.cli.Txn(ctx).If(leader).Then(ops[:n]...).Commit()
		if err != nil {
			return false, fmt.Errorf("write decision: %w", err)
		}
		if !r.Succeeded {
			return false, errNotLeader
		}
		ops = ops[n:]
	}
	c.forgetDeleted(ctx, desired, specs)
	running := make(map[string]bool, len(d.Allocations))
	for _, a := range d.Allocations {
		running[a.Job] = true
	}
	c.revokeEnded(ctx, running)
	return again, nil
}

// writes turns a decision into the etcd writes it needs: a job's desired
// record only when it changed, statuses when they changed, events, usage.
func (c *Coordinator) writes(d policy.Decision, desired map[string]fleet.Desired, statuses map[string]fleet.Status) (ops []clientv3.Op, again bool, err error) {
	add := func(op clientv3.Op, e error) {
		if e != nil && err == nil {
			err = e
		}
		ops = append(ops, op)
	}
	running := make(map[string]bool, len(d.Allocations))
	for _, a := range d.Allocations {
		running[a.Job] = true
		prev, had := desired[a.Job]
		if had && prev.Running() && reflect.DeepEqual(prev.Allocation, a) {
			continue
		}
		add(c.store.PutDesiredOp(fleet.Desired{Allocation: a, Generation: prev.Generation + 1}))
	}
	reasons := map[string]policy.Reason{}
	for _, r := range d.Reasons {
		reasons[r.Job] = r
	}
	jobs := make([]string, 0, len(desired))
	for job := range desired {
		jobs = append(jobs, job)
	}
	sort.Strings(jobs)
	for _, job := range jobs { // preempted, suspended or deleted
		prev := desired[job]
		if running[job] || !prev.Running() {
			continue
		}
		// The workers are told "preemption" or "shutdown", with the reason,
		// rather than "drain": the stop travels in the same record that
		// takes the nodes away.
		stop := fleet.Stop{Kind: fleet.StopShutdown, Reason: "the job finished or was deleted"}
		if r, ok := reasons[job]; ok {
			stop.Reason = r.Message
			if r.Kind == policy.KindPreempted {
				stop.Kind = fleet.StopPreemption
			}
		}
		add(c.store.PutDesiredOp(fleet.Desired{
			Allocation: api.Allocation{Job: job, Team: prev.Team, Flavor: prev.Flavor},
			Generation: prev.Generation + 1, Stop: &stop,
		}))
	}
	for _, job := range d.Released {
		ops = append(ops, c.store.DeleteStatusOp(job))
	}
	now := d.Now
	for _, r := range d.Reasons {
		prev, had := statuses[r.Job]
		s := fleet.Status{Reason: r, Time: now, Since: now}
		changed := !had || prev.Kind != r.Kind || prev.Code != r.Code || prev.FromSize != r.FromSize || prev.ToSize != r.ToSize || prev.Message != r.Message
		if had && prev.Kind == r.Kind && prev.Code == r.Code {
			s.Since = prev.Since
		}
		if changed {
			add(c.store.PutStatusOp(s))
		}
		again = again || r.Kind == policy.KindPreempted
		if event(r, prev.Reason, had) {
			add(c.store.PutEventOp(fleet.Event{Time: now, Reason: r}))
		}
	}
	add(c.store.PutUsageOp(d.Teams))
	if err != nil {
		return nil, false, fmt.Errorf("encode decision: %w", err)
	}
	return ops, again, nil
}

// event says whether a decision is worth an event: every change of size or
// kind, and pending reasons when their cause changes.
func event(r, prev policy.Reason, had bool) bool {
	switch r.Kind {
	case policy.KindRunning:
		return false
	case policy.KindPending, policy.KindSuspended, policy.KindInvalid:
		return !had || prev.Kind != r.Kind || prev.Code != r.Code
	}
	return true
}

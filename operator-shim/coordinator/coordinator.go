// Package coordinator is the daemon around the policy engine: it keeps an
// in-memory view of the fleet, teams and jobs fed by etcd watches (read
// whole only at start-up, after a compaction or a broken watch), runs
// policy.Schedule when an input changed or a time-based rule is due, and
// writes only what changed: each job's desired record (size, placement, or
// why it was stopped: one record, one put) with its per-node assignments
// in the same transaction, a status when its stable fields change, a
// deduplicated event, and the teams' usage when it changes. Two
// coordinators can run for HA: leadership is an etcd election, and every
// write is a transaction that only succeeds while this coordinator is the
// leader.
package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/utils/clock"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/idlegc"
	"github.com/hyperpodrun/hyperpodrun/internal/quietlease"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// Config tunes the coordinator.
type Config struct {
	// Prefix is the etcd prefix ("" = /hyperpodrun).
	Prefix string
	// Identity names this coordinator in the election (default: hostname-pid).
	Identity string
	// Resync runs a scheduling cycle at least this often even without a
	// change (default 10m): a safety net only. Input changes trigger a
	// cycle through the watch, and the time-based rules (the stable
	// period) wake one when they are due; a cycle without a change reads
	// nothing and writes nothing.
	Resync time.Duration
	// Debounce is the coalescing window: a cycle starts this long after
	// the last change of a burst of submits and finishes (default 10ms),
	// and at most burstWindows windows after its first (a burst with a
	// batch's transaction in it waits longer: burstHold), with every
	// change the watches have delivered by then; changes that arrive while a cycle
	// runs go into the next, which starts as soon as it ends. A batch
	// written in several transactions (finishes, then submits) is so
	// decided by one cycle, not admitted in part and reclaimed from by
	// the next (issue 27).
	Debounce time.Duration
	// CatchUp bounds how long a cycle waits for the view's watches to
	// agree on a revision (default 200ms): one watch per input prefix, and
	// etcd delivers each on its own, so a job submitted just after nodes
	// registered can arrive before them. When one watch has seen a later
	// revision than another, the coordinator asks etcd for a progress
	// notification and starts the cycle once every watch has caught up to
	// that revision, or after CatchUp.
	CatchUp time.Duration
	// watchDelay, in tests, delays what the watch of a prefix delivers.
	watchDelay func(prefix string) time.Duration
	// afterHousekeeping, in tests, is called after each housekeeping round.
	afterHousekeeping func()
	// SessionTTL is the leader lease TTL in seconds (default 5).
	SessionTTL int
	// Engine tunes the policy engine.
	Engine policy.Config
	// MaxEventsPerJob and MaxEvents bound the decision history kept in etcd
	// (defaults 200 and 20,000); the oldest events go first.
	MaxEventsPerJob, MaxEvents int
	// PruneInterval is how often housekeeping runs (default 10s): the
	// retention of finished jobs, forgetting deleted jobs whose nodes
	// have left, and compaction. It reads nothing while nothing is due.
	PruneInterval time.Duration
	// EventDedupWindow: the same decision about a job again within it
	// updates the job's latest event (count, last seen) instead of adding
	// one (default 1h).
	EventDedupWindow time.Duration
	// FinishedRetention is how long a finished job's records (spec, finish
	// record, desired record, status, events, rendezvous) are kept after it
	// finished (default 24h; negative: forever).
	FinishedRetention time.Duration
	// CompactRetention: the coordinator compacts etcd's history to the
	// revision it saw this long ago (default 10m; negative: never, for an
	// etcd that runs its own --auto-compaction). Needs etcd's root role
	// when auth is on; without it the coordinator says so once and stops
	// compacting.
	CompactRetention time.Duration
	// Tracer makes the decision spans (default: otel's global provider).
	Tracer trace.TracerProvider
	// OnCycle, when set, sees every cycle's figures (metrics). The
	// Decision's lists are the coordinator's and a later cycle overwrites
	// them (the engine's fast path renders into them): read them during
	// the call, and copy what is kept.
	OnCycle func(CycleStats)
	// OnLeader, when set, is told when this coordinator becomes leader and
	// when it stops being leader.
	OnLeader func(bool)
	// OnEtcdError, when set, counts failed etcd operations by kind
	// ("read", "write", "watch", "compact").
	OnEtcdError func(op string)
	// Now is the clock (default Clock.Now); the engine itself never reads it.
	Now func() time.Time
	// Clock ticks the resync and the housekeeping (default: the real
	// clock); tests step a fake one.
	Clock  clock.WithTicker
	Logger *slog.Logger
	// OnDecision, when set, sees every decision (tests, the demo's
	// timeline); as OnCycle's, its lists are overwritten by a later cycle.
	OnDecision func(policy.Decision)
	// JobCredentials mints every admitted job an etcd user limited to its
	// own keys (etcdauth.JobRoleFor) before its desired record is written,
	// and revokes it when the job holds no nodes any more. It needs etcd
	// auth on and this client's user to hold etcd's root role. The
	// credentials travel to the nodes in the job's assignments (only the
	// node's own etcd user reads those), and a job's user is revoked as
	// soon as its spec is deleted.
	JobCredentials bool
	// JobUIDFirst and JobUIDLast are the range (--job-uid-range) of the
	// uids the coordinator gives jobs: each admitted job gets one no other
	// live job holds, recorded in its desired record (Desired.UID) and
	// assignments, and kept until the job is forgotten. 0, 0: none.
	JobUIDFirst, JobUIDLast uint32
	// NodeEnrollment answers the agent pods' enrollments that
	// hyperpod-kube-controller approved (enroll-approved/): it creates or
	// re-passwords the node's user and seals the password to the pod
	// (etcdauth.ServeEnrollments). Needs etcd auth on and etcd's root role.
	NodeEnrollment bool
	// IdleGC starts Go's garbage collector at the end of a cycle that no
	// follow-up follows, when the next cycle's allocation could start one
	// (idlegc): the collection's mark then runs while the coordinator
	// waits, not during the next decision.
	IdleGC bool
	// IdleReturnAfter, with IdleGC, is how long the coordinator must have
	// waited since its last cycle before it returns the heap's free memory
	// to the operating system (idlegc.Config.ReturnAfter): a cold start or
	// a burst of cycles leaves hundreds of MB resident that an idle
	// coordinator does not need. 0: never.
	IdleReturnAfter time.Duration
}

// CycleStats are one scheduling cycle's figures.
type CycleStats struct {
	// Duration is the whole cycle: engine, diff and writes.
	Duration time.Duration
	// Engine is the part of it the engine took (a full cycle, or its fast
	// path).
	Engine time.Duration
	// Decision is the engine's output; its lists are valid during the
	// OnCycle call only (Config.OnCycle).
	Decision policy.Decision
	// Changed counts the jobs whose desired record was written, by the
	// kind of their decision.
	Changed map[policy.ReasonKind]int
	// Ops is the etcd operations written (puts and deletes).
	Ops int
	// Waited is how long each job admitted in this cycle was pending.
	Waited []time.Duration
	// Fast says the engine decided the cycle's submits on its fast path
	// (policy.Engine.Admit), without a full cycle.
	Fast bool
	// NextWake is when the coordinator runs its next cycle if no input
	// changes first (a stable period's end, a report's retry); zero: not
	// before the resync.
	NextWake time.Time
}

// Coordinator is one coordinator instance.
type Coordinator struct {
	cfg    Config
	cli    *clientv3.Client
	store  *fleet.Store
	log    *slog.Logger
	tracer trace.Tracer
	// minted are the jobs holding etcd credentials (JobCredentials); nil
	// until read. creds are those the coordinator knows the password of
	// (minted by it, or read from creds/), for the assignments.
	minted map[string]bool
	creds  map[string]*fleet.JobCreds
	// teamUsers are the teams whose etcd user this leader made sure of
	// (JobCredentials; teamusers.go).
	teamUsers map[string]bool
	// uids are the uids of the jobs the running cycle places.
	uids map[string]uint32
	// ignored are the reports ignored (logged once each).
	ignored map[string]bool
	// view is the in-memory copy of etcd; nil until loaded. stale says it
	// must be loaded again (a write failed half-way).
	view  *view
	stale bool
	// ran is the view's change count at the last cycle; lastCycle its
	// time; wake when a time-based rule is next due (zero: none).
	ran       uint64
	lastCycle time.Time
	wake      time.Time
	// engine runs the policy engine and keeps the last cycle's records
	// for its fast path (decide); ranSubmits is the view's submitChanges
	// at the last cycle.
	engine     policy.Engine
	ranSubmits uint64
	// ranOutside is the view's outside count at the last decision.
	ranOutside uint64
	// followUps counts the follow-up cycles run in a row (cycle);
	// followUp says the running cycle is only a follow-up (writes).
	followUps int
	followUp  bool
	// waited collects the pending times of the jobs a cycle admits.
	waited []time.Duration
	// problems are the invalid inputs logged last cycle (logged once).
	problems map[string]bool
	// compaction: revisions seen and when, and the last compacted.
	revs          []revAt
	compacted     int64
	compactDenied bool
	// etcdSeen is what the coordinator saw of etcd (its epoch, cluster
	// id, highest revision): checkEtcd finds a loss of etcd's data by it.
	etcdSeen fleet.EtcdView
	// reportsLeft says the last cycle left nodes' reports unprocessed
	// (an etcd error): its wake comes back for them (retryWake).
	reportsLeft bool
	// failedCycles counts the cycles in a row that failed (the leader
	// waits longer before each read after them: cycleRetryDelay).
	failedCycles int
	// term is this leader's term (nil outside lead; termCtx).
	term *leaderTerm
	// reportRetries counts the cycles in a row that left reports (the
	// retry backs off with it).
	reportRetries int
	// idleGC starts collections between cycles (Config.IdleGC); nil: off.
	idleGC burstGC
}

// burstGC is told when each cycle starts and ends, and whether a wait
// follows (idlegc.Collector; tests record the calls).
type burstGC interface {
	Begin()
	End(idle bool) bool
	Stop()
	Returned() idlegc.Returned
}

// MemoryReturns reports the idle coordinator's returns of memory to the
// operating system (Config.IdleReturnAfter) and their CPU.
func (c *Coordinator) MemoryReturns() idlegc.Returned {
	if c.idleGC == nil {
		return idlegc.Returned{}
	}
	return c.idleGC.Returned()
}

type revAt struct {
	t   time.Time
	rev int64
}

// New returns a coordinator; Run starts it.
func New(cli *clientv3.Client, cfg Config) *Coordinator {
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Minute
	}
	if cfg.CatchUp <= 0 {
		cfg.CatchUp = 200 * time.Millisecond
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = 10 * time.Millisecond
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 5
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Now == nil {
		cfg.Now = cfg.Clock.Now
	}
	if cfg.MaxEventsPerJob <= 0 {
		cfg.MaxEventsPerJob = 200
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = 20000
	}
	if cfg.PruneInterval <= 0 {
		cfg.PruneInterval = 10 * time.Second
	}
	if cfg.EventDedupWindow <= 0 {
		cfg.EventDedupWindow = time.Hour
	}
	if cfg.FinishedRetention == 0 {
		cfg.FinishedRetention = 24 * time.Hour
	}
	if cfg.CompactRetention == 0 {
		cfg.CompactRetention = 10 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Identity == "" {
		cfg.Identity = defaultIdentity()
	}
	if cfg.Tracer == nil {
		cfg.Tracer = otel.GetTracerProvider()
	}
	st := fleet.New(cli, cfg.Prefix)
	cfg.Prefix = st.Keys.Prefix()
	c := &Coordinator{cfg: cfg, cli: cli, store: st, log: cfg.Logger.With("coordinator", cfg.Identity),
		tracer: cfg.Tracer.Tracer("hyperpodrun/coordinator")}
	if cfg.IdleGC {
		c.idleGC = idlegc.New(idlegc.Config{ReturnAfter: cfg.IdleReturnAfter})
	}
	return c
}

// Run campaigns for leadership and, while leader, schedules on every
// change. It returns when ctx ends (resigning) or on an unrecoverable error.
func (c *Coordinator) Run(ctx context.Context) error {
	if c.idleGC != nil {
		defer c.idleGC.Stop()
	}
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

// errRelist ends a watch loop whose view must be read again.
var errRelist = errors.New("the view must be read again")

// errCycleFailed is errRelist after a failed cycle (the leader backs off
// before reading again: cycleRetryDelay).
var errCycleFailed = fmt.Errorf("%w: a cycle failed", errRelist)

func (c *Coordinator) lead(ctx context.Context) (err error) {
	// The session's lease is renewed on one timer (quietlease): clientv3's
	// keepalive loops would wake an idle coordinator three times a second.
	// Not ctx's cancellation: Campaign resigns on the client's context
	// when its context (the term, below) ends mid-campaign; that resign
	// gets 2 s (etcd may be out).
	sctx, scancel := context.WithCancel(context.WithoutCancel(ctx))
	defer scancel()
	scli, ql := quietlease.NewClient(sctx, c.cli)
	sess, err := concurrency.NewSession(scli, concurrency.WithTTL(c.cfg.SessionTTL), concurrency.WithContext(ctx))
	if err != nil {
		c.etcdError("session")
		return fmt.Errorf("coordinator session: %w", err)
	}
	defer sess.Close()
	// The term ends termMargin before the lease may end, unless a renewal
	// moves it: everything the leader does runs within it (lctx below),
	// and what no leadership compare can guard checks it (termCtx).
	margin := termMargin(c.cfg.SessionTTL)
	term, endTerm := ql.Context(ctx, sess.Lease(), margin)
	defer endTerm()
	defer context.AfterFunc(term, func() { time.AfterFunc(2*time.Second, scancel) })()
	c.term = &leaderTerm{ctx: term, end: func() time.Time {
		d, _ := ql.Deadline(sess.Lease())
		return d.Add(-margin) // long past once the lease is not kept alive
	}}
	defer func() {
		c.term = nil
		if err != nil && term.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", errNotInTerm, err)
		}
	}()
	el := concurrency.NewElection(sess, c.store.Keys.Leader())
	if err := el.Campaign(term, c.cfg.Identity); err != nil {
		return fmt.Errorf("campaign: %w", err)
	}
	c.log.Info("elected leader")
	c.failedCycles = 0 // a new term retries at once
	c.checkEtcd(term)
	if c.cfg.OnLeader != nil {
		c.cfg.OnLeader(true)
		defer c.cfg.OnLeader(false)
	}
	c.minted, c.creds = nil, nil // another leader may have minted and revoked meanwhile
	c.teamUsers = nil
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		el.Resign(rctx)
		cancel()
	}()
	lctx, cancel := context.WithCancel(term)
	defer cancel()
	defer c.serveEnrollments(lctx)()
	leader := clientv3.Compare(clientv3.CreateRevision(el.Key()), "=", el.Rev())
	backoff := 100 * time.Millisecond
	for {
		// Another leader may have written meanwhile: read everything.
		// The read is no cycle: the return of memory the last idle
		// cycle armed must not fall into it.
		if c.idleGC != nil {
			c.idleGC.Stop()
		}
		if err := c.reload(lctx); err != nil {
			if lctx.Err() != nil {
				return lctx.Err()
			}
			c.log.Warn("cannot read the fleet; retrying", "err", err, "in", backoff)
			if err := waitInTerm(lctx, sess, backoff); err != nil {
				return err
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		err := c.watchLoop(lctx, sess, leader)
		if !errors.Is(err, errRelist) {
			return err
		}
		if d := cycleRetryDelay(c.failedCycles); d > 0 && errors.Is(err, errCycleFailed) {
			c.log.Warn("cycles keep failing; waiting before reading the fleet again", "failed_in_a_row", c.failedCycles, "in", d)
			if err := waitInTerm(lctx, sess, d); err != nil {
				return err
			}
		}
	}
}

// waitInTerm waits d, or less when the leadership term ends first: it
// returns ctx's error when ctx ends and an error when the leader's session
// expires, nil once d has passed.
func waitInTerm(ctx context.Context, sess *concurrency.Session, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-sess.Done():
		return errors.New("leader session expired")
	case <-t.C:
		return nil
	}
}

// cycleRetryDelay is how long the leader waits before it reads the fleet
// again after failed cycles in a row: not at all after the first (a
// transient etcd error), then 100 ms doubling up to 30 s. A cycle that
// fails every time (etcd refusing writes: its space alarm, or a request
// it will never take) read the whole fleet again about 20 times a second
// before.
func cycleRetryDelay(failed int) time.Duration {
	if failed <= 1 {
		return 0
	}
	if failed > 10 {
		return 30 * time.Second
	}
	return min(100*time.Millisecond<<(failed-2), 30*time.Second)
}

// reload reads the whole view (start-up, compaction, a broken watch).
func (c *Coordinator) reload(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	snap, err := c.store.ReadSnapshot(rctx)
	if err != nil {
		c.etcdError("read")
		return err
	}
	v := newView(c.store.Keys, c.log)
	v.wantCreds = c.cfg.JobCredentials
	v.load(rctx, c.cli, snap, c.cfg.Now())
	c.view, c.stale = v, false
	c.observeRev(snap.Rev)
	c.sawRev(snap.Rev)
	c.log.Info("read the fleet", "revision", snap.Rev, "nodes", len(v.nodes), "teams", len(v.teams), "jobs", len(v.specs))
	return nil
}

// watched are the prefixes the view is fed from: what others write.
func (c *Coordinator) watched() []string {
	k := c.store.Keys
	return []string{k.NodesPrefix(), k.TeamsPrefix(), k.SpecsPrefix(), k.FinishedPrefix(), k.ReportsPrefix(), k.AlivePrefix()}
}

type watchMsg struct {
	resp   clientv3.WatchResponse
	closed bool
	// idx is the watch's index in watched().
	idx int
}

// behind reports whether some watch has reported a lower revision than
// another: the view may hold a change of one prefix without an earlier
// change of another.
func behind(revs []int64) bool {
	for _, r := range revs {
		if r < slices.Max(revs) {
			return true
		}
	}
	return false
}

// burstWindows bounds how long a burst of input changes holds its cycle
// back, in debounce windows from its first change.
const burstWindows = 8

// A watch response of at least bulkEvents input changes is taken for a
// transaction of a batch writer (etcd delivers a transaction's changes in
// one response to a watcher that keeps up; one that catches up may get
// several small ones together, and they only wait longer), and more of
// the batch is likely on its way: a burst with one waits bulkGapWindows
// debounce windows for its next change (at most maxBulkGap), and holds
// its cycle back bulkBurstWindows windows from its first (at most
// maxBulkHold; never less than a small burst). Under load a batch's
// transactions came more than one window apart, and the cycle that saw
// its first finishes started waiting jobs that the next one preempted
// for its submits (issue 27: 40-70 jobs a churn round, 8 writes each).
// The nodes' reports and liveness that arrive during the wait wait with
// it.
const (
	bulkEvents       = 16
	bulkGapWindows   = 10
	bulkBurstWindows = 100
	maxBulkGap       = time.Second
	maxBulkHold      = 10 * time.Second
)

// burstHold decides how long a burst of input changes that began held
// ago holds its cycle back after its latest change (window: the debounce
// window; bulk: a response of the burst was a bulk one): hold false when
// it held the cycle long enough, and the cycle keeps the time it had, at
// most one wait after the hold's bound.
func burstHold(window, held time.Duration, bulk bool) (wait time.Duration, hold bool) {
	if bulk {
		wait = max(window, min(bulkGapWindows*window, maxBulkGap))
		return wait, held < max(burstWindows*window, min(bulkBurstWindows*window, maxBulkHold))
	}
	return window, held < burstWindows*window
}

// watchLoop watches the inputs from the view's revision and runs a cycle
// after each burst of changes; it returns errRelist when the view must be
// read again (compaction, a broken watch, a failed write).
func (c *Coordinator) watchLoop(ctx context.Context, sess *concurrency.Session, leader clientv3.Cmp) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	msgs, revs := c.startWatches(wctx)
	apply := func(m watchMsg, dirty, caused *bool) error {
		if err := c.applyWatch(m, dirty, caused); err != nil {
			return err
		}
		revs[m.idx] = max(revs[m.idx], m.resp.Header.Revision)
		c.revokeDeleted(ctx)
		return nil
	}
	var catchUpSince time.Time // when the cycle due began waiting for the watches
	resync := c.cfg.Clock.NewTicker(min(c.cfg.Resync, time.Minute))
	defer resync.Stop()
	house := c.cfg.Clock.NewTicker(c.cfg.PruneInterval)
	defer house.Stop()
	var wakeT *time.Timer
	var wakeC <-chan time.Time
	defer func() {
		if wakeT != nil {
			wakeT.Stop()
		}
	}()
	dirty := true // the first cycle after a read (writes only what differs)
	// caused: an input change, a wake or the resync is among the reasons
	// for the next cycle (else it is only a follow-up).
	caused := true
	var debounce <-chan time.Time
	var burst time.Time // when the debounce due began
	bulk := false       // a response of the burst was a bulk one (burstHold)
	// batched are the watches whose changes come in batches (submits,
	// finishes) and hold a cycle back while they go on; the nodes'
	// steady reports and liveness do not.
	batched := make([]bool, len(c.watched()))
	for i, p := range c.watched() {
		batched[i] = p == c.store.Keys.SpecsPrefix() || p == c.store.Keys.FinishedPrefix()
	}
	for {
		if c.stale {
			return errRelist
		}
		if wakeT == nil && !c.wake.IsZero() {
			wakeT = time.NewTimer(max(0, c.wake.Sub(c.cfg.Now())))
			wakeC = wakeT.C
		}
		if dirty && debounce == nil {
			wait, _ := burstHold(c.cfg.Debounce, 0, bulk)
			debounce, burst = time.After(wait), time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sess.Done():
			return errors.New("leader session expired")
		case m := <-msgs:
			changed := false
			if err := apply(m, &changed, &caused); err != nil {
				return err
			}
			if changed && batched[m.idx] {
				bulk = bulk || len(m.resp.Events) >= bulkEvents
				if wait, hold := burstHold(c.cfg.Debounce, time.Since(burst), bulk); hold && debounce != nil {
					// The burst goes on: its cycle waits for its end.
					debounce = time.After(wait)
				}
			}
			dirty = dirty || changed
		case <-wakeC:
			wakeT, wakeC = nil, nil
			c.wake = time.Time{}
			dirty, caused = true, true
		case <-resync.C():
			if c.cfg.Now().Sub(c.lastCycle) >= c.cfg.Resync {
				dirty, caused = true, true
			}
		case <-house.C():
			c.housekeeping(ctx, leader)
			if c.cfg.afterHousekeeping != nil {
				c.cfg.afterHousekeeping()
			}
		case <-debounce:
			// What the watches already delivered joins this cycle.
			for drained := false; !drained; {
				select {
				case m := <-msgs:
					if err := apply(m, &dirty, &caused); err != nil {
						return err
					}
				default:
					drained = true
				}
			}
			if !c.caughtUp(wctx, revs, &catchUpSince) {
				debounce = time.After(time.Millisecond)
				continue
			}
			debounce, bulk = nil, false
			dirty = false
			if wakeT != nil { // the cycle computes the next wake
				wakeT.Stop()
				wakeT, wakeC = nil, nil
			}
			c.followUp, caused = !caused, false
			again, err := c.runCycle(ctx, leader)
			if err != nil {
				return err
			}
			// A cycle that changed allocations is followed by another at
			// once (preempted jobs are reconsidered, capacity freed is
			// used): now, not at the next input change or the resync.
			dirty = again
		}
	}
}

// runCycle runs one cycle between the idle collector's brackets and
// counts the failed ones in a row: errNotLeader as the cycle returned it,
// any other error as errCycleFailed (the view must be read again).
func (c *Coordinator) runCycle(ctx context.Context, leader clientv3.Cmp) (again bool, err error) {
	if c.idleGC != nil {
		c.idleGC.Begin()
	}
	again, err = c.cycle(ctx, leader)
	if c.idleGC != nil && c.idleGC.End(err == nil && !again) {
		c.log.Debug("garbage collection started while idle")
	}
	switch {
	case err == nil:
		c.failedCycles = 0
		return again, nil
	case errors.Is(err, errNotLeader):
		return false, err
	}
	c.failedCycles++
	c.log.Warn("cycle failed; reading the fleet again", "err", err)
	return false, errCycleFailed
}

// startWatches watches every prefix the coordinator keeps from the view's
// revision on. revs is the latest revision each watch has reported
// (events or a progress notification): it has delivered every change of
// its prefix up to there.
func (c *Coordinator) startWatches(wctx context.Context) (msgs chan watchMsg, revs []int64) {
	msgs = make(chan watchMsg)
	prefixes := c.watched()
	revs = make([]int64, len(prefixes))
	for i, p := range prefixes {
		revs[i] = c.view.rev
		wch := c.cli.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(c.view.rev+1))
		go func() {
			for w := range wch {
				if c.cfg.watchDelay != nil {
					time.Sleep(c.cfg.watchDelay(p))
				}
				select {
				case msgs <- watchMsg{resp: w, idx: i}:
				case <-wctx.Done():
					return
				}
			}
			select {
			case msgs <- watchMsg{closed: true, idx: i}:
			case <-wctx.Done():
			}
		}()
	}
	return msgs, revs
}

// caughtUp reports whether the view is consistent: every watch caught up
// to the latest revision any of them reported (etcd answers a progress
// request once its watchers are synced, asked when the wait begins at
// *since), or CatchUp passed since.
func (c *Coordinator) caughtUp(wctx context.Context, revs []int64, since *time.Time) bool {
	if behind(revs) {
		now := time.Now()
		if since.IsZero() {
			*since = now
			pctx, pcancel := context.WithTimeout(wctx, c.cfg.CatchUp)
			if err := c.cli.RequestProgress(pctx); err != nil {
				c.log.Debug("cannot ask etcd for the watches' progress", "err", err)
			}
			pcancel()
		}
		if now.Sub(*since) < c.cfg.CatchUp {
			return false
		}
		c.log.Debug("the watches did not catch up in time; deciding on what they delivered", "revisions", revs, "waited", now.Sub(*since))
	}
	*since = time.Time{}
	return true
}

var errNotLeader = errors.New("not the leader any more")

// applyWatch feeds one watch response into the view and sets dirty and
// caused when an input the engine reads changed; errRelist when the watch
// broke.
func (c *Coordinator) applyWatch(m watchMsg, dirty, caused *bool) error {
	if m.closed || m.resp.Canceled || m.resp.Err() != nil {
		c.etcdError("watch")
		if m.resp.CompactRevision > 0 {
			c.log.Info("watch fell behind a compaction; reading the fleet again", "compacted", m.resp.CompactRevision)
		} else {
			c.log.Warn("watch ended; reading the fleet again", "err", m.resp.Err())
		}
		return errRelist
	}
	c.observeRev(m.resp.Header.Revision)
	if c.view.apply(m.resp.Events, c.cfg.Now()) {
		*dirty, *caused = true, true
	}
	return nil
}

func (c *Coordinator) etcdError(op string) {
	if c.cfg.OnEtcdError != nil {
		c.cfg.OnEtcdError(op)
	}
}

// State reads the engine's input from etcd.
func (c *Coordinator) State(ctx context.Context) (policy.State, error) {
	if err := c.reload(ctx); err != nil {
		return policy.State{}, err
	}
	st, _ := c.view.state(c.cfg.Now(), c.cfg.Engine)
	return st, nil
}

// Cycle reads the fleet, runs the engine once and writes what changed,
// guarded by leader.
func (c *Coordinator) Cycle(ctx context.Context, leader clientv3.Cmp) error {
	if err := c.reload(ctx); err != nil {
		return err
	}
	_, err := c.cycle(ctx, leader)
	return err
}

// event says whether a decision is worth an event: every change of size or
// kind, and a suspended or invalid job's cause when it changes. A pending
// job's cause (its code) moves with everyone else's usage: the status has
// the current one, and the history records when the job started waiting,
// not each shift (at fleet scale one cohort filling up shifted a thousand
// pending jobs at once, two writes each).
func event(r, prev policy.Reason, had bool) bool {
	switch r.Kind {
	case policy.KindRunning:
		return false
	case policy.KindPending:
		return !had || prev.Kind != r.Kind
	case policy.KindSuspended, policy.KindInvalid:
		return !had || prev.Kind != r.Kind || prev.Code != r.Code
	}
	return true
}

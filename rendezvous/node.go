package rendezvous

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// Reason says why a round ended (and why the next one formed).
type Reason string

// Reasons reported by Next and recorded in Round.Reason.
const (
	// MemberLost: a member left (Leave, lease revoked), its lease expired,
	// or its agent did not acknowledge a proposed round in time.
	MemberLost Reason = "MemberLost"
	// MemberFailed: a member reported a worker failure (ReportFailure).
	MemberFailed Reason = "MemberFailed"
	// NodeWaiting: a node is waiting while the round is below its size
	// (MaxNodes, or the target when one is set).
	NodeWaiting Reason = "NodeWaiting"
	// TargetChanged: the job's target size changed the round's size.
	TargetChanged Reason = "TargetChanged"
	// NodeLeaving: a member is draining (Node.Drain), a planned change.
	NodeLeaving Reason = "NodeLeaving"
	// JobFailed: the job failed for good (Node.FailJob): its restarts are
	// spent. Every node ends; Join returns a *JobFailedError.
	JobFailed Reason = "JobFailed"
)

// ErrLeaseLost is wrapped by the errors of a node whose lease can no longer
// be proven alive (see Node.LeaseLost).
var ErrLeaseLost = errors.New("rendezvous: lease lost")

// ErrJobFinished is returned by Join when every member of the job's last
// round finished: the rendezvous is closed for good, as torch's is, so a
// late node does not run the job over again. Run it again under another
// --rdzv-id (a job submitted again through elasticctl gets a fresh one).
var ErrJobFinished = errors.New("rendezvous: the job has finished: its rendezvous is closed")

// ErrJobFailed is wrapped by Join's error once the job failed for good
// (Node.FailJob): its restarts are spent, so no node starts workers again.
// The error is a *JobFailedError carrying the failure summary.
var ErrJobFailed = errors.New("rendezvous: the job failed: its restarts are spent")

// JobFailedError is Join's error for a job that failed for good: Summary
// is the failure summary of the failed round (torchrun's text, root cause
// first), the same on every node; Detail says which node failed and why.
type JobFailedError struct {
	Job, Detail, Summary string
}

func (e *JobFailedError) Error() string {
	return fmt.Sprintf("rendezvous: job %q failed: %s", e.Job, e.Detail)
}

// Unwrap makes errors.Is(err, ErrJobFailed) hold.
func (e *JobFailedError) Unwrap() error { return ErrJobFailed }

// JobFinished reports whether the job's rendezvous is closed for good
// (every member of its last round finished), without joining it: the node
// agent asks it when a hyperpodrun ends. The read is bounded by 5s besides
// ctx.
func JobFinished(ctx context.Context, cli *clientv3.Client, prefix, job string) (bool, error) {
	k := newKeys(fleet.NormalizePrefix(prefix), job)
	ctx, cancel := context.WithTimeout(ctx, defaultFenceOpTimeout)
	defer cancel()
	r, err := cli.Get(ctx, k.Head)
	if err != nil {
		return false, fmt.Errorf("rendezvous: read %s: %w", k.Head, err)
	}
	if len(r.Kvs) == 0 {
		return false, nil
	}
	h, err := decodeHeader(k.Head, r.Kvs[0].Value)
	if err != nil {
		return false, err
	}
	return h.State == stateFinished, nil
}

// ErrClosed is wrapped by the errors of a node after Close, Leave or Finish.
var ErrClosed = errors.New("rendezvous: node closed")

// Member is one node of a round.
type Member struct {
	NodeID         string
	Addr           string
	LocalWorldSize int
	// GroupRank is the node's rank in the round (GROUP_RANK).
	GroupRank int
	// BaseRank is the global rank of the node's local rank 0.
	BaseRank int
}

// Round is a closed round that includes this node.
type Round struct {
	// Number increases with every round of the job.
	Number int64
	// Members lists every member in rank order when the round has at most
	// Config.MemberListLimit nodes; otherwise it is nil (see Node.Members).
	Members []Member
	// Self is this node's entry.
	Self Member
	// Rank is this node's group rank (GROUP_RANK).
	Rank int
	// NumNodes is the number of nodes in the round (GROUP_WORLD_SIZE).
	NumNodes int
	// WorldSize is the sum of the members' LocalWorldSize (WORLD_SIZE).
	WorldSize int
	// MasterAddr and MasterPort are rank 0's address and the free port it
	// chose for this round (MASTER_ADDR, MASTER_PORT).
	MasterAddr string
	MasterPort int
	// Target is the job's target node count the round honoured (clamped to
	// [MinNodes, MaxNodes]); 0 means none was set.
	Target int
	// Reason and Detail say why this round formed (empty for the first).
	Reason Reason
	Detail string
	// FailureSummary is, in a round formed after a worker failure
	// (MemberFailed), the failure summary the failing node reported.
	FailureSummary string

	headRev int64
}

// Change says why a round was superseded.
type Change struct {
	Reason Reason
	Detail string
	// Round is the number of the round record that superseded it.
	Round int64
	// NumNodes and WorldSize are the size of that round as proposed (0
	// while it waits for nodes). A proposal can still fail its
	// acknowledgements, so they are what is planned, not yet agreed.
	NumNodes, WorldSize int
	// ID identifies the proposal: the same on every member (for tracing
	// one change across agents); empty while the round waits for nodes.
	ID string
}

// Node is one agent's participation in a job's rendezvous. Its methods are
// safe for concurrent use.
type Node struct {
	cli *clientv3.Client
	cfg Config
	k   keys
	log *slog.Logger

	ctx    context.Context // node lifetime; cancelled by Close/Leave/Finish
	cancel context.CancelFunc
	wg     sync.WaitGroup

	regMu sync.Mutex // serialises registration

	mu         sync.Mutex
	registered bool
	lease      clientv3.LeaseID
	ttl        time.Duration
	memberRev  int64
	queueKey   string
	queueRev   int64           // the revision naming queueKey (its lease grant's; see election.go)
	leaseCtx   context.Context // cancelled when the lease is lost
	leaseStop  context.CancelFunc
	closed     bool
	lost       chan struct{}
	lostErr    error
	changed    chan struct{} // closed and replaced on every state change
	head       *header
	headRev    int64
	headErr    error
	joined     *Round // latest closed round including this node
	assigned   assignment
	returned   int64 // latest round number Join returned
	lastPort   int
	fenceAt    time.Time
	fenceTimer *time.Timer
	kaDone     <-chan struct{} // closed when the client's keepalive stream stopped
	ackDelay   time.Duration   // tests: a slow agent
	kaErr      error           // latest keepalive error
	kaErrAt    time.Time
	// rewatchHead cancels the current watch of the round record:
	// watchHead reads the record again and watches it anew.
	rewatchHead context.CancelFunc
}

// assignment caches this node's entry of a proposal.
type assignment struct {
	round   int64
	nonce   string
	in      bool
	self    Member
	members []Member
	port    int
}

// New validates cfg, fills its defaults and returns a node. It does no I/O:
// the node registers (lease, member key) on its first Join.
func New(cli *clientv3.Client, cfg Config) (*Node, error) {
	if cli == nil {
		return nil, errors.New("rendezvous: nil etcd client")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{
		cli:     cli,
		cfg:     cfg,
		k:       newKeys(cfg.Prefix, cfg.JobID),
		log:     cfg.Logger.With("job", cfg.JobID, "node", cfg.NodeID),
		ctx:     ctx,
		cancel:  cancel,
		lost:    make(chan struct{}),
		changed: make(chan struct{}),
	}
	return n, nil
}

// ID returns the node's id.
func (n *Node) ID() string { return n.cfg.NodeID }

// LeaseLost is closed when this node can no longer prove its lease alive:
// keepalives were not confirmed for TTL minus the fence margin, etcd
// reported the lease gone, or the node was closed (Close, Leave, Finish).
// It fires strictly before the server can expire the lease, so an agent
// that stops its workers at once never overlaps with a new round reusing
// its rank. After it fires the node is done (its methods return errors
// wrapping ErrLeaseLost or ErrClosed): Close it and create a new Node to
// rejoin; the same NodeID is accepted again once the old lease expired.
func (n *Node) LeaseLost() <-chan struct{} { return n.lost }

// Lease is the node's current etcd lease (0 before it registered): keys
// the agent keeps only while this node lives go under it.
func (n *Node) Lease() clientv3.LeaseID {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lease
}

// opTimeout bounds single etcd requests made on the node's behalf.
func (n *Node) opTimeout() time.Duration { return OpTimeout(n.cfg.LeaseTTL) }

// OpTimeout is the bound on etcd requests made for a node whose lease
// lasts ttl (0: DefaultLeaseTTL): the longer of 5 s and two TTLs. A Node
// bounds each attempt of its own requests by it; a Barrier or a
// RunningMarker given it bounds each operation, its retries of transient
// errors included. Every member of a round arrives and marks itself at
// once, and an etcd thousands of proposals behind answers "too many
// requests" to many of them for seconds (20,000 nodes in bench/rdzvscale):
// a shorter bound fails nodes whose lease is fine, and each failed node
// ends the round for every other.
func OpTimeout(ttl time.Duration) time.Duration {
	if ttl <= 0 {
		ttl = DefaultLeaseTTL
	}
	return max(5*time.Second, 2*ttl)
}

// goTracked starts a goroutine tracked by Close, labelled with the job and node
// (the labels let tests find leaked goroutines).
func (n *Node) goTracked(name string, f func()) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.wg.Add(1)
	n.mu.Unlock()
	go func() {
		defer n.wg.Done()
		pprof.Do(n.ctx, pprof.Labels("rdzv-job", n.cfg.JobID, "rdzv-node", n.cfg.NodeID, "rdzv-task", name), func(context.Context) { f() })
	}()
}

func (n *Node) broadcastLocked() {
	close(n.changed)
	n.changed = make(chan struct{})
}

func (n *Node) closedErr() error {
	return fmt.Errorf("%w (job %q node %q)", ErrClosed, n.cfg.JobID, n.cfg.NodeID)
}

// stateErrLocked reports why the node cannot take part any more, if so.
func (n *Node) stateErrLocked() error {
	if n.closed {
		return n.closedErr()
	}
	if n.lostErr != nil {
		return n.lostErr
	}
	return nil
}

// Join blocks until this node is a member of a closed round newer than any
// round Join returned before, and returns it. Nodes beyond the round's size
// wait as spares. It fails after Config.JoinTimeout, when ctx ends, when
// the lease is lost, or when the round record in etcd is malformed.
func (n *Node) Join(ctx context.Context) (*Round, error) {
	start := time.Now()
	if err := n.register(ctx); err != nil {
		return nil, err
	}
	timer := time.NewTimer(n.cfg.JoinTimeout)
	defer timer.Stop()
	// A node never waits silently for a round that should take it
	// (register_stall.go).
	stall := n.newWaitSupervisor()
	defer stall.stop()
	for {
		n.mu.Lock()
		if err := n.stateErrLocked(); err != nil {
			n.mu.Unlock()
			return nil, err
		}
		if n.headErr != nil {
			err := n.headErr
			n.mu.Unlock()
			return nil, err
		}
		if n.head != nil && n.head.State == stateFailed {
			err := &JobFailedError{Job: n.cfg.JobID, Detail: n.head.Detail, Summary: n.head.Summary}
			n.mu.Unlock()
			return nil, err
		}
		if n.head != nil && n.head.State == stateFinished {
			n.mu.Unlock()
			return nil, fmt.Errorf("%w (job %q node %q): run it again under another --rdzv-id", ErrJobFinished, n.cfg.JobID, n.cfg.NodeID)
		}
		if r := n.joined; r != nil && r.Number > n.returned && n.head != nil && n.head.Round == r.Number && n.head.State == stateClosed {
			first := n.returned == 0
			n.returned = r.Number
			lease, ttl := n.lease, n.ttl
			n.mu.Unlock()
			if first {
				n.keepaliveJoined(lease, ttl)
			}
			n.log.Debug("rendezvous: joined round", "round", r.Number, "rank", r.Rank, "nodes", r.NumNodes,
				"world", r.WorldSize, "master", net.JoinHostPort(r.MasterAddr, strconv.Itoa(r.MasterPort)), "took", time.Since(start))
			return r.clone(), nil
		}
		ch, h := n.changed, n.head
		n.mu.Unlock()
		select {
		case <-ch:
		case <-n.lost:
		case <-stall.check(ctx):
		case <-ctx.Done():
			return nil, fmt.Errorf("rendezvous: job %q node %q: join: %w", n.cfg.JobID, n.cfg.NodeID, ctx.Err())
		case <-timer.C:
			latest := "no round record yet"
			if h != nil {
				latest = fmt.Sprintf("latest round %d is %s with %d node(s)", h.Round, h.State, h.Nodes)
			}
			return nil, fmt.Errorf("rendezvous: job %q node %q: no round included this node within the join timeout %s (--nnodes %d:%d; %s); raise join_timeout in --rdzv-conf or start more nodes",
				n.cfg.JobID, n.cfg.NodeID, n.cfg.JoinTimeout, n.cfg.MinNodes, n.cfg.MaxNodes, latest)
		}
	}
}

// LeftOut blocks until a round newer than after has closed without this
// node (it waits as a spare, or leaves), and returns nil; it returns an
// error when ctx ends, the lease is lost, or a newer round includes this
// node (ErrIncluded). The agent uses it to release workers it kept alive
// for an in-process resize that this node is not part of.
func (n *Node) LeftOut(ctx context.Context, after int64) error {
	for {
		n.mu.Lock()
		if err := n.stateErrLocked(); err != nil {
			n.mu.Unlock()
			return err
		}
		if r := n.joined; r != nil && r.Number > after {
			n.mu.Unlock()
			return ErrIncluded
		}
		if h := n.head; h != nil && h.Round > after && h.State == stateClosed && n.assigned.round == h.Round && !n.assigned.in {
			n.mu.Unlock()
			return nil
		}
		ch := n.changed
		n.mu.Unlock()
		select {
		case <-ch:
		case <-n.lost:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ErrIncluded is LeftOut's answer when a newer round includes this node.
var ErrIncluded = errors.New("rendezvous: a newer round includes this node")

func (r *Round) clone() *Round {
	c := *r
	c.Members = slices.Clone(r.Members)
	return &c
}

// Next blocks until round r is superseded and says why. Rounds are
// superseded when a member is lost, a member reports a failure, a node waits
// while the round is below its size, or the target size changes it.
func (n *Node) Next(ctx context.Context, r *Round) (Change, error) {
	if r == nil {
		return Change{}, errors.New("rendezvous: Next needs the round returned by Join")
	}
	for {
		n.mu.Lock()
		if err := n.stateErrLocked(); err != nil {
			n.mu.Unlock()
			return Change{}, err
		}
		if n.headErr != nil {
			err := n.headErr
			n.mu.Unlock()
			return Change{}, err
		}
		if h := n.head; h != nil && h.Round > r.Number {
			c := Change{Reason: h.Reason, Detail: h.Detail, Round: h.Round}
			if h.State != stateOpen {
				c.NumNodes, c.WorldSize, c.ID = h.Nodes, h.World, h.Nonce
			}
			n.mu.Unlock()
			return c, nil
		}
		ch := n.changed
		n.mu.Unlock()
		select {
		case <-ch:
		case <-n.lost:
		case <-ctx.Done():
			return Change{}, fmt.Errorf("rendezvous: job %q node %q: waiting for round %d to change: %w", n.cfg.JobID, n.cfg.NodeID, r.Number, ctx.Err())
		}
	}
}

// ReportFailure records that this node's workers failed in round r and
// asks for a new round. It returns the job's restart count so far. The
// count (key <prefix>/jobs/<job>/restarts) grows by one when the round that
// follows a failure closes with every member of the failed round (reason
// MemberFailed); a failure that comes with a lost member (a node died and
// its peers' collectives broke) is a membership change and is not counted,
// nor is a report for a round that was already superseded.
//
// summary is the node's failure summary (torchrun's text); the next round
// carries the first report's as Round.FailureSummary, clipped to
// maxSummary bytes.
func (n *Node) ReportFailure(ctx context.Context, r *Round, detail, summary string) (int, error) {
	if r == nil {
		return 0, errors.New("rendezvous: ReportFailure needs the round returned by Join")
	}
	n.mu.Lock()
	err := n.stateErrLocked()
	n.mu.Unlock()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, n.opTimeout())
	defer cancel()
	fk := n.k.Failure(r.Number)
	rec, _ := json.Marshal(failureRec{Node: n.cfg.NodeID, Detail: detail, Summary: clipSummary(summary), Time: time.Now().UTC()})
	t, err := n.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(n.k.Head), "=", r.headRev),
		clientv3.Compare(clientv3.CreateRevision(fk), "=", 0),
	).Then(
		clientv3.OpPut(fk, string(rec)),
	).Commit()
	if err != nil {
		return 0, fmt.Errorf("rendezvous: job %q node %q: report failure of round %d: %w", n.cfg.JobID, n.cfg.NodeID, r.Number, err)
	}
	if t.Succeeded {
		n.log.Info("rendezvous: reported worker failure", "round", r.Number, "detail", detail)
		n.mu.Lock()
		closer := ""
		if h := n.head; h != nil && h.Round == r.Number {
			closer = h.Closer
		}
		n.mu.Unlock()
		if closer != "" && closer != n.cfg.NodeID {
			n.goTracked("supervise-closer", func() { n.superviseCloser(r.Number, closer) })
		}
	}
	return n.Restarts(ctx)
}

// superviseCloser keeps a dead closer from stalling the fast failure path.
// The node whose report opened round r's failure runs it: when the closer
// that wrote round r has not started the next round within AckTimeout
// (normally it does within milliseconds), it is presumed dead, just as a
// member that misses an acknowledgement is, and its lease is revoked, so
// the next node in the closer queue takes over at once instead of after
// the lease TTL. A closer that was alive after all loses its lease, fences
// its workers and rejoins as a new member; a failed round restarts every
// worker anyway.
func (n *Node) superviseCloser(r int64, closer string) {
	grace := n.cfg.AckTimeout
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for {
		n.mu.Lock()
		h, changed := n.head, n.changed
		n.mu.Unlock()
		if h != nil && h.Round > r {
			return // the closer acted
		}
		select {
		case <-n.ctx.Done():
			return
		case <-changed:
			continue
		case <-timer.C:
		}
		// A closer still writing the next round's member chunks (a large
		// job) is alive: give it another grace period.
		ctx, cancel := context.WithTimeout(n.ctx, n.opTimeout())
		g, err := n.cli.Get(ctx, n.k.RoundChunks(r+1), clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly())
		cancel()
		if err != nil || len(g.Kvs) > 0 {
			timer.Reset(grace)
			continue
		}
		break
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.opTimeout())
	defer cancel()
	m, err := n.cli.Get(ctx, n.k.Member(closer))
	if err != nil || len(m.Kvs) == 0 || m.Kvs[0].Lease == 0 {
		return // gone already: its successor is taking over
	}
	n.log.Warn("rendezvous: the closer did not act on the reported failure; revoking its lease so the next node takes over (dead agent?)",
		"closer", closer, "round", r, "waited", grace)
	if _, err := n.cli.Revoke(ctx, clientv3.LeaseID(m.Kvs[0].Lease)); err != nil && n.ctx.Err() == nil {
		n.log.Warn("rendezvous: revoke the silent closer's lease", "closer", closer, "err", err)
	}
}

// Drain marks this node as leaving: the closer proposes the next round
// without it at once, so every member sees a planned change (Next returns
// NodeLeaving with the smaller size) and can have its workers checkpoint
// before anything stops. The node stays a member until Leave.
func (n *Node) Drain(ctx context.Context) error {
	n.mu.Lock()
	err := n.stateErrLocked()
	lease := n.lease
	n.mu.Unlock()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, n.opTimeout())
	defer cancel()
	mk := n.k.Member(n.cfg.NodeID)
	rec, _ := json.Marshal(memberRec{Addr: n.cfg.Addr, LWS: n.cfg.LocalWorldSize, Leaving: true})
	// Only while this node's own record stands: never recreate it.
	t, err := n.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(mk), "=", lease)).
		Then(clientv3.OpPut(mk, string(rec), clientv3.WithLease(lease))).Commit()
	if err != nil {
		return fmt.Errorf("rendezvous: job %q node %q: mark leaving: %w", n.cfg.JobID, n.cfg.NodeID, err)
	}
	if !t.Succeeded {
		return fmt.Errorf("rendezvous: job %q node %q: mark leaving: %w", n.cfg.JobID, n.cfg.NodeID, ErrLeaseLost)
	}
	n.log.Info("rendezvous: draining: the next round goes on without this node")
	return nil
}

// Restarts returns the job's global failure-restart count.
func (n *Node) Restarts(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, n.opTimeout())
	defer cancel()
	c, _, problem, err := fleet.New(n.cli, n.cfg.Prefix).Counter(ctx, n.k.restarts, "restart count")
	if err != nil {
		return 0, fmt.Errorf("rendezvous: job %q: %w", n.cfg.JobID, err)
	}
	if problem != nil {
		n.log.Warn("rendezvous: malformed restart count", "err", problem)
	}
	return int(min(c, math.MaxInt32)), nil
}

// Members returns every member of round r in rank order (Round.Members is
// nil for rounds above Config.MemberListLimit). It fails once r has been
// superseded and its record removed.
func (n *Node) Members(ctx context.Context, r *Round) ([]Member, error) {
	if r == nil {
		return nil, errors.New("rendezvous: Members needs a round")
	}
	if r.Members != nil {
		return slices.Clone(r.Members), nil
	}
	n.mu.Lock()
	h := n.head
	n.mu.Unlock()
	if h == nil || h.Round != r.Number {
		return nil, fmt.Errorf("rendezvous: job %q: round %d was superseded; its member list is gone", n.cfg.JobID, r.Number)
	}
	ctx, cancel := context.WithTimeout(ctx, n.opTimeout())
	defer cancel()
	return n.readAll(ctx, h)
}

// Finish leaves after this node's workers succeeded in round r, without
// starting a new round for the others: the round is marked finishing, so
// members leaving it are not treated as lost. The node is closed afterwards.
func (n *Node) Finish(ctx context.Context, r *Round) error {
	if r == nil {
		return errors.New("rendezvous: Finish needs the round returned by Join")
	}
	n.mu.Lock()
	reg, qk := n.registered, n.queueKey
	err := n.stateErrLocked()
	n.mu.Unlock()
	if err != nil {
		return err
	}
	if reg {
		tctx, cancel := context.WithTimeout(ctx, n.opTimeout())
		dk := n.k.DoneKey(r.Number)
		mine := []clientv3.Op{
			clientv3.OpDelete(n.k.Member(n.cfg.NodeID)),
			clientv3.OpDelete(qk),
			clientv3.OpDelete(n.k.Ack(n.cfg.NodeID)),
		}
		_, err = n.cli.Txn(tctx).
			If(clientv3.Compare(clientv3.CreateRevision(dk), "=", 0)).
			Then(append([]clientv3.Op{clientv3.OpPut(dk, n.cfg.NodeID)}, mine...)...).
			Else(mine...).
			Commit()
		cancel()
		if err != nil {
			err = fmt.Errorf("rendezvous: job %q node %q: mark round %d finished: %w", n.cfg.JobID, n.cfg.NodeID, r.Number, err)
		}
	}
	return errors.Join(err, n.shutdown(ctx, true, "finished"))
}

// Leave revokes the node's lease: its keys vanish and the others notice at
// once. The node is closed afterwards (LeaseLost fires).
func (n *Node) Leave(ctx context.Context) error {
	return n.shutdown(ctx, true, "left")
}

// Close stops the node and revokes its lease (best effort, bounded to 2s),
// like Leave; it is safe to call more than once and after Leave or Finish.
func (n *Node) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return n.shutdown(ctx, true, "closed")
}

// crash stops the node without revoking its lease, as if its process died:
// the lease expires on the server after its TTL. For tests.
func (n *Node) crash() { _ = n.shutdown(context.Background(), false, "crashed") }

func (n *Node) shutdown(ctx context.Context, revoke bool, why string) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.fenceLocked(fmt.Errorf("%w: node %s", ErrClosed, why))
	reg, lease, kaDone := n.registered || n.lease != 0, n.lease, n.kaDone
	n.mu.Unlock()
	n.cancel()
	n.wg.Wait()
	if kaDone != nil {
		<-kaDone
	}
	if !reg || !revoke {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := n.cli.Revoke(ctx, lease); err != nil {
		return fmt.Errorf("rendezvous: job %q node %q: revoke lease %x: %w", n.cfg.JobID, n.cfg.NodeID, int64(lease), err)
	}
	n.log.Debug("rendezvous: lease revoked", "why", why)
	return nil
}

// newNonce names one proposal's chunks.
func newNonce() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

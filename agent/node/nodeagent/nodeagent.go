// Package nodeagent is the logic of hyperpod-agent, the per-node daemon: it
// registers the node's inventory (package devices) in etcd under a lease at
// <prefix>/nodes/<node>, keeps it current as health changes, marks the node
// draining before it leaves, and serves /healthz and Prometheus /metrics.
//
// Liveness is two leases of LeaseTTL. The inventory is under one whose id
// every reader of the record sees; since etcd lets any user keep any lease
// alive, that lease proves nothing. So the agent also writes
// <prefix>/alive/<node> under a second lease whose id it picks at random
// and never shows (package secretlease), a key only its own etcd user and
// the coordinator may read, and its record says so (Inventory.Liveness).
// The coordinator counts the node only while that key exists: a node whose
// agent dies is gone when the alive lease expires, and the coordinator
// then deletes its record too. A drained node is first rewritten with
// state "draining", then both leases are revoked and it disappears at
// once.
//
// Several agents can run in one process (the demo, tests): each has its own
// metrics registry and, optionally, its own HTTP listener.
package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/secretlease"
)

// Defaults.
const (
	DefaultListen          = "127.0.0.1:9400"
	DefaultLeaseTTL        = 10 * time.Second
	DefaultRefreshInterval = 5 * time.Second
)

// discoverTimeout bounds one discovery pass; etcdTimeout one etcd request.
const (
	discoverTimeout = 30 * time.Second
	etcdTimeout     = 5 * time.Second
)

// Config configures one node agent.
type Config struct {
	// NodeName is the node's name and etcd key segment (required).
	NodeName string
	// Prefix is the etcd key prefix (default fleet.DefaultPrefix).
	Prefix string
	// LeaseTTL is how long the node outlives a dead agent (default 10s,
	// rounded up to whole seconds; etcd may raise very small values).
	LeaseTTL time.Duration
	// RefreshInterval is how often the inventory is rediscovered (default 5s).
	// The key is rewritten only when the inventory changed.
	RefreshInterval time.Duration
	// Discover inventories the node (required), e.g.
	// DiscoverWith(devices.Options{...}). A partial inventory returned with
	// an error is still registered; an error without one is retried.
	Discover func(ctx context.Context) (*devices.Inventory, error)
	// HealthEvents, when set, triggers an immediate rediscovery on each
	// receive (devices.HealthMonitor.Changed).
	HealthEvents <-chan struct{}
	// Listen is the address of /healthz, /metrics and /inventory; empty
	// means no HTTP server. hyperpod-agent defaults it to DefaultListen.
	Listen string
	// Workloads runs the work placed on this node (optional).
	Workloads Workloads
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Workloads is the seam through which the node agent runs the work the
// coordinator places on its node: starting and stopping each job's
// hyperpodrun to match the coordinator's desired record (fleet.Desired).
type Workloads interface {
	// Run starts once the node is first registered and runs until ctx is
	// done (the agent stopping or crashing).
	Run(ctx context.Context, node Node) error
	// Drain stops the node's work gracefully. The agent calls it after the
	// node is marked draining in etcd and before it revokes its lease.
	Drain(ctx context.Context) error
}

// Node is what Workloads gets to know about its node.
type Node struct {
	Name   string
	Prefix string
	Client *clientv3.Client
	// Inventory returns the inventory last written to etcd.
	Inventory func() *devices.Inventory
}

// DiscoverWith returns a Config.Discover that runs devices.Discover with opts.
func DiscoverWith(opts devices.Options) func(context.Context) (*devices.Inventory, error) {
	return func(ctx context.Context) (*devices.Inventory, error) { return devices.Discover(ctx, opts) }
}

// Agent is one running node agent.
type Agent struct {
	cli     *clientv3.Client
	cfg     Config
	key     string
	alive   string // the alive key
	ttl     int64
	log     *slog.Logger
	ln      net.Listener
	metrics *metrics

	started atomic.Bool
	exited  chan struct{}
	drained chan struct{}

	// writer serialises the etcd writes of the node key; it is a channel so
	// that waiting for it honours contexts.
	writer chan struct{}

	mu         sync.Mutex // guards the fields below
	lease      clientv3.LeaseID
	aliveLease clientv3.LeaseID // 0 when the roles did not let the agent write its alive key
	registered bool
	draining   bool
	current    *devices.Inventory
	lastErr    string
	// view is what the agent saw of etcd when it registered (and the
	// highest revision since): checkEtcd compares it on each registration.
	view fleet.EtcdView
	// loss is the last time etcd lost its data, nil if never.
	loss *dataLoss
}

// New checks cfg and binds the HTTP listener (so a bad address fails
// here). Call Run; if Run is never called, Close releases the listener.
func New(cli *clientv3.Client, cfg Config) (*Agent, error) {
	if cli == nil {
		return nil, errors.New("nodeagent: nil etcd client")
	}
	if err := devices.ValidateNodeName(cfg.NodeName); err != nil {
		return nil, fmt.Errorf("nodeagent: %w", err)
	}
	if cfg.Discover == nil {
		return nil, errors.New("nodeagent: Config.Discover is required")
	}
	cfg.Prefix = fleet.NormalizePrefix(cfg.Prefix)
	if cfg.LeaseTTL < 0 || cfg.RefreshInterval < 0 {
		return nil, fmt.Errorf("nodeagent: negative lease TTL %s or refresh interval %s", cfg.LeaseTTL, cfg.RefreshInterval)
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.RefreshInterval == 0 {
		cfg.RefreshInterval = DefaultRefreshInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &Agent{
		cli:     cli,
		cfg:     cfg,
		key:     fleet.NewKeys(cfg.Prefix).Node(cfg.NodeName),
		alive:   fleet.NewKeys(cfg.Prefix).Alive(cfg.NodeName),
		ttl:     int64(math.Ceil(cfg.LeaseTTL.Seconds())),
		log:     cfg.Logger.With("node", cfg.NodeName),
		metrics: newMetrics(cfg.NodeName),
		exited:  make(chan struct{}),
		drained: make(chan struct{}),
		writer:  make(chan struct{}, 1),
		lastErr: "not registered yet",
	}
	if cfg.Listen != "" {
		ln, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("nodeagent: listen %s: %w", cfg.Listen, err)
		}
		a.ln = ln
	}
	return a, nil
}

// Addr is the HTTP server's address ("" without one).
func (a *Agent) Addr() string {
	if a.ln == nil {
		return ""
	}
	return a.ln.Addr().String()
}

// Key is the node's etcd key.
func (a *Agent) Key() string { return a.key }

// Inventory returns a copy of the inventory last written to etcd (nil
// before the first registration).
func (a *Agent) Inventory() *devices.Inventory {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.current.Clone()
}

// Close releases the HTTP listener of an agent whose Run was never called.
func (a *Agent) Close() error {
	if a.started.Load() || a.ln == nil {
		return nil
	}
	return a.ln.Close()
}

func (a *Agent) lockWriter(ctx context.Context) error {
	select {
	case a.writer <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *Agent) unlockWriter() { <-a.writer }

// Run registers the node and keeps its inventory current until ctx is done
// or Drain completes. Cancelling ctx stops the agent as if it had crashed:
// the lease is neither kept alive nor revoked, so the node disappears from
// etcd when the lease expires. Call Drain for a graceful exit. Run retries
// etcd failures forever and returns nil when stopped.
func (a *Agent) Run(ctx context.Context) error {
	if !a.started.CompareAndSwap(false, true) {
		return errors.New("nodeagent: Run called twice")
	}
	defer close(a.exited)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()

	if a.ln != nil {
		srv := &http.Server{Handler: a.handler(), ReadHeaderTimeout: 5 * time.Second}
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := srv.Serve(a.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.log.Error("http server stopped", "err", err)
			}
		}()
		go func() {
			defer wg.Done()
			<-ctx.Done()
			sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer scancel()
			_ = srv.Shutdown(sctx)
		}()
		a.log.Info("serving /healthz and /metrics", "addr", a.Addr())
	}

	ticker := time.NewTicker(a.cfg.RefreshInterval)
	defer ticker.Stop()
	var (
		keepAlive     <-chan *clientv3.LeaseKeepAliveResponse
		aliveKA       <-chan *clientv3.LeaseKeepAliveResponse
		stopKeepAlive = func() {}
		workloads     sync.Once
		backoff       = 200 * time.Millisecond
	)
	defer func() { stopKeepAlive() }()
	for {
		if !a.isRegistered() && !a.isDraining() {
			stopKeepAlive()
			kaCtx, kaCancel := context.WithCancel(ctx)
			ka, aka, err := a.register(ctx, kaCtx)
			if err != nil {
				kaCancel()
				a.setLastErr(err)
				if ctx.Err() == nil && !a.isDraining() {
					a.log.Warn("registration failed; retrying", "err", err, "in", backoff)
				}
				select {
				case <-ctx.Done():
					return nil
				case <-a.drained:
					return nil
				case <-time.After(backoff):
				}
				backoff = min(backoff*2, 5*time.Second)
				continue
			}
			backoff = 200 * time.Millisecond
			keepAlive, aliveKA, stopKeepAlive = ka, aka, kaCancel
			if a.cfg.Workloads != nil {
				workloads.Do(func() {
					wg.Add(1)
					go func() {
						defer wg.Done()
						node := Node{Name: a.cfg.NodeName, Prefix: a.cfg.Prefix, Client: a.cli, Inventory: a.Inventory}
						if err := a.cfg.Workloads.Run(ctx, node); err != nil && ctx.Err() == nil {
							a.log.Error("workloads stopped", "err", err)
						}
					}()
				})
			}
		}
		select {
		case <-ctx.Done():
			a.log.Info("agent stopped without draining; the node expires with its lease", "ttl", a.cfg.LeaseTTL)
			return nil
		case <-a.drained:
			return nil
		case resp, ok := <-keepAlive:
			if !ok {
				keepAlive = nil
				if !a.isDraining() {
					a.leaseLost(errors.New("lease keep-alive ended (etcd unreachable for longer than the lease TTL, or the lease was revoked)"))
				}
			} else if a.keepAliveSuspect(resp) {
				if !a.isDraining() {
					a.verifyEtcd(ctx)
				}
			} else {
				a.sawRevision(resp.Revision)
			}
		case _, ok := <-aliveKA:
			if !ok {
				aliveKA = nil
				if !a.isDraining() {
					a.leaseLost(errors.New("alive key's lease keep-alive ended (etcd unreachable for longer than the lease TTL, or the lease was revoked)"))
				}
			}
		case <-ticker.C:
			a.refresh(ctx)
			a.learnEpoch(ctx)
		case <-a.cfg.HealthEvents:
			a.refresh(ctx)
		}
	}
}

func (a *Agent) isRegistered() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.registered
}

func (a *Agent) isDraining() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.draining
}

func (a *Agent) setLastErr(err error) {
	a.mu.Lock()
	a.lastErr = err.Error()
	a.mu.Unlock()
}

func (a *Agent) leaseLost(err error) {
	a.mu.Lock()
	a.registered = false
	a.lastErr = err.Error()
	// Whichever of the two leases is left holds nothing the next
	// registration keeps: it is revoked, not left for others to extend.
	lease, aliveLease := a.lease, a.aliveLease
	a.mu.Unlock()
	a.revokeQuietly(lease)
	if aliveLease != 0 {
		a.revokeQuietly(aliveLease)
	}
	a.metrics.registered.Set(0)
	a.metrics.leaseLost.Inc()
	a.log.Warn("registration lost; re-registering", "err", err)
}

// discover runs one inventory pass and stamps it with this node's name.
func (a *Agent) discover(ctx context.Context) (*devices.Inventory, error) {
	dctx, cancel := context.WithTimeout(ctx, discoverTimeout)
	defer cancel()
	inv, err := a.cfg.Discover(dctx)
	if err != nil {
		a.metrics.discoveryErrors.Inc()
		if inv == nil {
			return nil, fmt.Errorf("discover: %w", err)
		}
		a.log.Warn("partial inventory", "err", err)
	}
	if inv == nil {
		return nil, errors.New("discover: no inventory")
	}
	inv = inv.Clone()
	inv.Node = a.cfg.NodeName
	inv.State = devices.StateReady
	if err := inv.Validate(); err != nil {
		a.metrics.discoveryErrors.Inc()
		return nil, fmt.Errorf("discover: invalid inventory: %w", err)
	}
	a.metrics.observe(inv)
	return inv, nil
}

// register grants the two leases, writes the alive key and the inventory
// under them in one transaction and starts keeping both alive (until kaCtx
// is done). The second channel is nil when the agent's etcd role may not
// write its alive key (roles from before alive keys): the node then
// registers as older agents did, on its record's lease alone.
func (a *Agent) register(ctx, kaCtx context.Context) (ka, aliveKA <-chan *clientv3.LeaseKeepAliveResponse, err error) {
	inv, err := a.discover(ctx)
	if err != nil {
		return nil, nil, err
	}
	// Did etcd lose its data since the last registration? Then the node's
	// jobs are stopped before it registers free.
	if err := a.checkEtcd(ctx); err != nil {
		return nil, nil, err
	}
	if note := a.lossNote(); note != "" {
		inv.Reasons = append(inv.Reasons, note)
	}
	gctx, gcancel := context.WithTimeout(ctx, etcdTimeout)
	grant, err := a.cli.Grant(gctx, a.ttl)
	gcancel()
	if err != nil {
		return nil, nil, fmt.Errorf("etcd lease grant: %w", err)
	}
	gctx, gcancel = context.WithTimeout(ctx, etcdTimeout)
	secret, err := secretlease.Grant(gctx, a.cli, a.ttl)
	gcancel()
	if err != nil {
		a.revokeQuietly(grant.ID)
		return nil, nil, fmt.Errorf("etcd lease grant for the alive key: %w", err)
	}
	aliveLease := secret.ID
	revoke := func() {
		a.revokeQuietly(grant.ID)
		if aliveLease != 0 {
			a.revokeQuietly(aliveLease)
		}
	}
	if err := a.lockWriter(ctx); err != nil {
		revoke()
		return nil, nil, err
	}
	defer a.unlockWriter()
	if a.isDraining() {
		revoke()
		return nil, nil, errors.New("draining")
	}
	inv.Liveness = devices.LivenessAliveKey
	err = a.putRegistration(ctx, inv, grant.ID, aliveLease)
	if errors.Is(err, rpctypes.ErrPermissionDenied) {
		a.log.Warn("this agent's etcd role may not write its alive key; registering on the record's lease alone, "+
			"which anyone can keep alive after the agent is gone: run elasticctl auth bootstrap again to update the roles",
			"key", a.alive, "err", err)
		a.revokeQuietly(aliveLease)
		aliveLease, inv.Liveness = 0, ""
		err = a.putRegistration(ctx, inv, grant.ID, 0)
	}
	if err != nil {
		revoke()
		return nil, nil, err
	}
	ka, err = a.cli.KeepAlive(kaCtx, grant.ID)
	if err == nil && aliveLease != 0 {
		aliveKA, err = a.cli.KeepAlive(kaCtx, aliveLease)
	}
	if err != nil {
		revoke()
		return nil, nil, fmt.Errorf("etcd lease keep-alive: %w", err)
	}
	a.mu.Lock()
	a.lease, a.aliveLease, a.registered, a.current, a.lastErr = grant.ID, aliveLease, true, inv, ""
	a.metrics.registered.Set(1) // under mu, so /healthz and the gauge agree
	a.mu.Unlock()
	a.metrics.writes.Inc()
	a.log.Info("registered", "key", a.key, "lease", fmt.Sprintf("%x", int64(grant.ID)), "ttl_s", a.ttl,
		"liveness", inv.Liveness, "flavor", inv.Flavor, "accelerators", len(inv.Accelerators),
		"healthy_gpus", inv.Healthy(devices.KindNVIDIA), "healthy_neuron", inv.Healthy(devices.KindNeuron))
	return ka, aliveKA, nil
}

// putRegistration writes the inventory under lease and, when aliveLease
// is not 0, the alive key under aliveLease, in one transaction: the
// coordinator never sees a record that declares an alive key without it.
func (a *Agent) putRegistration(ctx context.Context, inv *devices.Inventory, lease, aliveLease clientv3.LeaseID) error {
	data, err := json.Marshal(inv)
	if err != nil {
		return fmt.Errorf("encode inventory: %w", err)
	}
	ops := []clientv3.Op{clientv3.OpPut(a.key, string(data), clientv3.WithLease(lease))}
	if aliveLease != 0 {
		ops = append([]clientv3.Op{clientv3.OpPut(a.alive, a.cfg.NodeName, clientv3.WithLease(aliveLease))}, ops...)
	}
	pctx, pcancel := context.WithTimeout(ctx, etcdTimeout)
	defer pcancel()
	r, err := a.cli.Txn(pctx).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("etcd put %s: %w", a.key, err)
	}
	a.sawRevision(r.Header.Revision)
	return nil
}

func (a *Agent) revokeQuietly(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = a.cli.Revoke(ctx, id)
}

// refresh rediscovers and rewrites the key when the inventory changed.
func (a *Agent) refresh(ctx context.Context) {
	inv, err := a.discover(ctx)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("refresh failed; keeping the registered inventory", "err", err)
		}
		return
	}
	if err := a.lockWriter(ctx); err != nil {
		return
	}
	defer a.unlockWriter()
	if note := a.lossNote(); note != "" {
		inv.Reasons = append(inv.Reasons, note)
	}
	a.mu.Lock()
	if a.current != nil {
		inv.Liveness = a.current.Liveness
	}
	lease, skip := a.lease, !a.registered || a.draining || inv.Equal(a.current)
	a.mu.Unlock()
	if skip {
		return
	}
	data, err := json.Marshal(inv)
	if err != nil {
		return
	}
	pctx, pcancel := context.WithTimeout(ctx, etcdTimeout)
	_, err = a.cli.Put(pctx, a.key, string(data), clientv3.WithLease(lease))
	pcancel()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			a.mu.Lock()
			a.registered = false
			a.lastErr = "lease expired"
			a.mu.Unlock()
			a.metrics.registered.Set(0)
			a.metrics.leaseLost.Inc()
			a.log.Warn("lease expired; re-registering")
			return
		}
		if ctx.Err() == nil {
			a.log.Warn("inventory update failed", "err", err)
		}
		return
	}
	a.metrics.writes.Inc()
	a.log.Info("inventory changed", "healthy_gpus", inv.Healthy(devices.KindNVIDIA),
		"healthy_neuron", inv.Healthy(devices.KindNeuron), "reasons", inv.Reasons)
	a.mu.Lock()
	a.current = inv
	a.mu.Unlock()
}

// Drain is the graceful exit (SIGTERM): it marks the node draining in etcd,
// drains its Workloads, revokes the lease (the key disappears at once) and
// stops Run. Watchers of the key see the "draining" write before the
// delete. Calling Drain again is a no-op. If etcd cannot be reached the node
// still expires with its lease.
func (a *Agent) Drain(ctx context.Context) error {
	a.mu.Lock()
	if a.draining {
		a.mu.Unlock()
		return nil
	}
	a.draining = true // from here on, register and refresh write nothing
	a.mu.Unlock()
	a.metrics.draining.Set(1)
	a.log.Info("draining")

	var errs []error
	// Wait for a write in flight, so that "draining" is the last value.
	if err := a.lockWriter(ctx); err != nil {
		errs = append(errs, err)
	} else {
		a.unlockWriter()
	}
	a.mu.Lock()
	lease, aliveLease, registered, cur := a.lease, a.aliveLease, a.registered, a.current.Clone()
	a.mu.Unlock()
	if registered && cur != nil {
		cur.State = devices.StateDraining
		cur.UpdatedAt = time.Now().UTC()
		if data, err := json.Marshal(cur); err != nil {
			errs = append(errs, err)
		} else if _, err := a.cli.Put(ctx, a.key, string(data), clientv3.WithLease(lease)); err != nil {
			errs = append(errs, fmt.Errorf("mark %s draining: %w", a.key, err))
		} else {
			a.metrics.writes.Inc()
		}
	}
	if a.cfg.Workloads != nil {
		if err := a.cfg.Workloads.Drain(ctx); err != nil {
			errs = append(errs, fmt.Errorf("drain workloads: %w", err))
		}
	}
	if registered {
		// The record's lease first: watchers see the record go, not
		// the coordinator deleting it for want of its alive key.
		if _, err := a.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			errs = append(errs, fmt.Errorf("revoke lease: %w", err))
		}
		if aliveLease != 0 {
			if _, err := a.cli.Revoke(ctx, aliveLease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				errs = append(errs, fmt.Errorf("revoke the alive key's lease: %w", err))
			}
		}
	}
	a.mu.Lock()
	a.registered = false
	a.mu.Unlock()
	a.metrics.registered.Set(0)
	close(a.drained)
	if a.started.Load() {
		select {
		case <-a.exited:
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
		}
	} else if a.ln != nil {
		_ = a.ln.Close()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nodeagent: drain: %w", err)
	}
	a.log.Info("drained; leases revoked")
	return nil
}

// health reports whether the node is registered, for /healthz.
func (a *Agent) health() (bool, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.draining:
		return false, "draining"
	case a.registered:
		return true, fmt.Sprintf("ok: %s registered (lease %x)", a.key, int64(a.lease))
	default:
		return false, "not registered: " + a.lastErr
	}
}

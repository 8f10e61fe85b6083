package jobrunner

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// processFleet is the fleet of the end-to-end tests that run jobs as
// processes: a real coordinator and real node agents on one etcd, each
// node with one healthy accelerator of e2eFlavor, whose runners start
// real hyperpodruns. Their log and the jobs' output are printed when the
// test fails.
type processFleet struct {
	t   *testing.T
	cli *clientv3.Client
	eps []string
	hpr string
	log *slog.Logger
	// logs is what the coordinator and the agents logged; out, the jobs'
	// output.
	logs, out *syncBuf
}

// newProcessFleet is the fleet on cli (whose endpoints the runners hand
// to hyperpodrun) running hpr; nothing runs until startCoordinator and
// startAgent.
func newProcessFleet(t *testing.T, cli *clientv3.Client, endpoints []string, hpr string) *processFleet {
	t.Helper()
	f := &processFleet{t: t, cli: cli, eps: endpoints, hpr: hpr, logs: &syncBuf{}, out: &syncBuf{}}
	f.log = slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	// Registered first, so it runs after the agents and the coordinator
	// have stopped.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s\njobs' output:\n%s", f.logs.String(), f.out.String())
		}
	})
	return f
}

// startCoordinator runs a coordinator until the test ends, with cfg's
// settings and the fleet's quick ones: no stable period, a resync every
// 200 ms, 2 s sessions, the fleet's log.
func (f *processFleet) startCoordinator(cfg coordinator.Config) {
	cfg.Engine = policy.Config{MinStablePeriod: -1}
	cfg.Resync, cfg.SessionTTL = 200*time.Millisecond, 2
	cfg.Logger = f.log.With("component", "coordinator")
	coord := coordinator.New(f.cli, cfg)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { coord.Run(ctx); close(done) }()
	f.t.Cleanup(func() { stop(); <-done })
}

// startAgent runs node's agent (3 s lease, metrics on a free loopback
// port) until the test ends, with a runner of cfg's settings and the
// fleet's: its hyperpodrun, etcd endpoints, 2 s rendezvous lease, output,
// log, a fresh TempDir and a 200 ms restart backoff.
func (f *processFleet) startAgent(node string, cfg Config) (*Runner, *nodeagent.Agent) {
	f.t.Helper()
	// Short: the control socket's path must fit in 107 bytes.
	tmp, err := os.MkdirTemp("", "hpa")
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { os.RemoveAll(tmp) })
	log := f.log.With("component", "agent", "node", node)
	cfg.Hyperpodrun, cfg.Endpoints, cfg.RdzvConf, cfg.Output, cfg.Logger, cfg.TempDir = f.hpr, f.eps, "lease_ttl=2", f.out, log, tmp
	cfg.BackoffBase = 200 * time.Millisecond
	r := New(cfg)
	agent, err := nodeagent.New(f.cli, nodeagent.Config{NodeName: node, LeaseTTL: 3 * time.Second, Workloads: r, Logger: log, Listen: "127.0.0.1:0",
		Discover: func(context.Context) (*devices.Inventory, error) {
			return &devices.Inventory{Node: node, Flavor: e2eFlavor, Flavors: []string{e2eFlavor}, VCPUs: 8, MemoryBytes: 8 << 30, UpdatedAt: time.Now().UTC(),
				Accelerators: []devices.Accelerator{{Kind: devices.KindNVIDIA, Index: 0, Flavor: e2eFlavor, Healthy: true}}}, nil
		}})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { agent.Run(ctx); close(done) }()
	f.t.Cleanup(func() { stop(); <-done })
	return r, agent
}

package nodeagent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

const (
	prefix = "/hyperpodrun"
	ttl    = 2 * time.Second
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

var host = devices.StaticHost(devices.HostInfo{Hostname: "h", VCPUs: 32, MemoryBytes: 256 << 30, BootID: "b"})

func startEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := etcdembed.Start(ctx, etcdembed.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := srv.Client()
	if err != nil {
		srv.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cli.Close()
		srv.Close()
	})
	return cli
}

func fixture(node string) (sysfs, dev string) {
	base := filepath.Join("..", "..", "..", "devices", "testdata", "neuron", node)
	return filepath.Join(base, "sys", "devices", "virtual", "neuron_device"), filepath.Join(base, "dev")
}

func noNVML() nvml.Interface {
	return &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
}

// gpuNode is go-nvml's fake DGX A100 with an event set the test feeds.
func gpuNode() (*dgxa100.Server, chan nvml.EventData) {
	srv := dgxa100.New()
	events := make(chan nvml.EventData, 8)
	set := &mock.EventSet{
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			select {
			case ev := <-events:
				return ev, nvml.SUCCESS
			case <-time.After(time.Duration(ms) * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	for _, d := range srv.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeXidCriticalError, nvml.SUCCESS }
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	}
	return srv, events
}

// watcher records every event under the nodes prefix.
type watcher struct {
	mu     sync.Mutex
	events []*clientv3.Event
	notify chan struct{}
}

func watchNodes(t *testing.T, cli *clientv3.Client) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{notify: make(chan struct{}, 1)}
	wch := cli.Watch(ctx, fleet.NewKeys(prefix).NodesPrefix(), clientv3.WithPrefix())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for resp := range wch {
			w.mu.Lock()
			w.events = append(w.events, resp.Events...)
			w.mu.Unlock()
			select {
			case w.notify <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// forNode returns the events of one node's key, in order.
func (w *watcher) forNode(node string) []*clientv3.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*clientv3.Event
	for _, ev := range w.events {
		if string(ev.Kv.Key) == fleet.NewKeys(prefix).Node(node) {
			out = append(out, ev)
		}
	}
	return out
}

// waitFor polls cond on every watch event (and every 50ms) until deadline.
func (w *watcher) waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := time.After(within)
	for !cond() {
		select {
		case <-w.notify:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%s: not within %s", what, within)
		}
	}
	return time.Since(start)
}

// lastInventory decodes the latest PUT of a node (nil if its last event is a
// DELETE or there is none).
func (w *watcher) lastInventory(t *testing.T, node string) *devices.Inventory {
	evs := w.forNode(node)
	if len(evs) == 0 || evs[len(evs)-1].Type != mvccpb.PUT {
		return nil
	}
	kv := evs[len(evs)-1].Kv
	inv, err := devices.ParseInventory(string(kv.Key), kv.Value)
	if err != nil {
		t.Fatalf("stored inventory: %v", err)
	}
	return inv
}

type running struct {
	agent  *nodeagent.Agent
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, cli *clientv3.Client, cfg nodeagent.Config) *running {
	t.Helper()
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = ttl
	}
	if cfg.RefreshInterval == 0 {
		cfg.RefreshInterval = 200 * time.Millisecond
	}
	cfg.Logger = quiet
	a, err := nodeagent.New(cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{agent: a, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		r.wait(t)
	})
	return r
}

func (r *running) wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		r.done <- nil // later waits return at once
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s")
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Several node agents against one etcd: every inventory appears; a health
// event shows up within seconds; a crashed agent's node disappears within
// its lease TTL without being marked; a drained one is marked draining
// before it is deleted; nothing leaks afterwards.
func TestAgentsAgainstEmbeddedEtcd(t *testing.T) {
	cli := startEtcd(t)
	w := watchNodes(t, cli)

	gpuSrv, gpuEvents := gpuNode()
	gpuOpts := devices.Options{NVML: gpuSrv, NeuronSysfsRoot: filepath.Join(t.TempDir(), "none"), Host: host}
	mon := devices.WatchHealth(context.Background(), gpuOpts, quiet)
	defer mon.Close()
	gpuOpts.Health = mon
	trnSysfs, trnDev := fixture("trn2")

	gpu := start(t, cli, nodeagent.Config{NodeName: "gpu-1", Prefix: prefix, Listen: "127.0.0.1:0",
		Discover: nodeagent.DiscoverWith(gpuOpts), HealthEvents: mon.Changed(), RefreshInterval: time.Hour})
	trn := start(t, cli, nodeagent.Config{NodeName: "trn2-1", Prefix: prefix,
		Discover: nodeagent.DiscoverWith(devices.Options{NVML: noNVML(), NeuronSysfsRoot: trnSysfs, DevRoot: trnDev, Host: host})})
	cpu := start(t, cli, nodeagent.Config{NodeName: "cpu-1", Prefix: prefix,
		Discover: nodeagent.DiscoverWith(devices.Options{NVML: noNVML(), NeuronSysfsRoot: filepath.Join(t.TempDir(), "none"), Host: host})})

	// Inventories appear.
	want := map[string]string{"gpu-1": "nvidia-a100-40gb", "trn2-1": "trainium2", "cpu-1": "cpu"}
	w.waitFor(t, 10*time.Second, "all three inventories registered", func() bool {
		for node, flavor := range want {
			inv := w.lastInventory(t, node)
			if inv == nil || inv.Flavor != flavor || inv.State != devices.StateReady {
				return false
			}
		}
		return true
	})
	if inv := w.lastInventory(t, "trn2-1"); inv.NeuronCores() != 64 || len(inv.NeuronDevices()) != 16 || inv.VCPUs != 32 {
		t.Errorf("trn2-1 inventory: %d cores, %d devices", inv.NeuronCores(), len(inv.NeuronDevices()))
	}
	resp, err := cli.Get(context.Background(), fleet.NewKeys(prefix).NodesPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 3 {
		t.Fatalf("nodes in etcd: %v %v", resp, err)
	}

	// /healthz and /metrics.
	// The watch can see the PUT a moment before the agent records that its
	// write succeeded, so /healthz is polled until the deadline.
	base := "http://" + gpu.agent.Addr()
	var code int
	var body string
	w.waitFor(t, 5*time.Second, "/healthz reports registered", func() bool {
		code, body = get(t, base+"/healthz")
		return code == 200
	})
	if !strings.Contains(body, "registered") {
		t.Errorf("/healthz = %d %q", code, body)
	}
	_, metrics := get(t, base+"/metrics")
	for _, line := range []string{`hyperpod_agent_gpus{node="gpu-1"} 8`, `hyperpod_agent_gpus_healthy{node="gpu-1"} 8`,
		`hyperpod_agent_neuron_devices{node="gpu-1"} 0`, `hyperpod_agent_registered{node="gpu-1"} 1`} {
		if !strings.Contains(metrics, line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	if code, body := get(t, base+"/inventory"); code != 200 || !strings.Contains(body, `"flavor": "nvidia-a100-40gb"`) {
		t.Errorf("/inventory = %d %.200q", code, body)
	}

	// A critical XID reaches etcd within seconds (refresh interval is an
	// hour here: the health event itself triggers the update).
	gpuEvents <- nvml.EventData{Device: gpuSrv.Devices[6], EventType: nvml.EventTypeXidCriticalError, EventData: 79,
		GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	took := w.waitFor(t, 5*time.Second, "GPU 6 unhealthy in etcd", func() bool {
		inv := w.lastInventory(t, "gpu-1")
		return inv != nil && !inv.Accelerators[6].Healthy
	})
	t.Logf("XID 79 visible in etcd after %s", took)
	if inv := w.lastInventory(t, "gpu-1"); inv.Healthy(devices.KindNVIDIA) != 7 || inv.Accelerators[6].HealthReason != "critical XID 79" {
		t.Errorf("gpu-1 after XID: %d healthy, reason %q", inv.Healthy(devices.KindNVIDIA), inv.Accelerators[6].HealthReason)
	}
	// Like /healthz, the gauges follow the write a moment after the watch
	// sees it.
	w.waitFor(t, 5*time.Second, "/metrics shows 7 healthy GPUs", func() bool {
		_, metrics = get(t, base+"/metrics")
		return strings.Contains(metrics, `hyperpod_agent_gpus_healthy{node="gpu-1"} 7`)
	})

	// Crash: stop keep-alives without revoking. The key outlives the agent,
	// then disappears within the lease TTL, never marked draining.
	crashed := time.Now()
	trn.cancel()
	trn.wait(t)
	if r, err := cli.Get(context.Background(), fleet.NewKeys(prefix).Node("trn2-1")); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("crashed node's key vanished at once (revoked?): %v %v", r, err)
	}
	w.waitFor(t, ttl+3*time.Second, "crashed node deleted", func() bool {
		evs := w.forNode("trn2-1")
		return len(evs) > 0 && evs[len(evs)-1].Type == mvccpb.DELETE
	})
	gone := time.Since(crashed)
	t.Logf("crashed node deleted %s after its agent stopped (lease TTL %s)", gone, ttl)
	// The lease runs out at most TTL after the last keep-alive (sent every
	// TTL/3); etcd revokes expired leases on a 500ms tick.
	if gone > ttl+1500*time.Millisecond {
		t.Errorf("crashed node lived %s, lease TTL is %s", gone, ttl)
	}
	for _, ev := range w.forNode("trn2-1") {
		if ev.Type == mvccpb.PUT && strings.Contains(string(ev.Kv.Value), `"state":"draining"`) {
			t.Errorf("crashed node was marked draining")
		}
	}

	// Drain (SIGTERM): marked draining, then deleted at once, in that order.
	before := len(w.forNode("cpu-1"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cpu.agent.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	cpu.wait(t)
	w.waitFor(t, 5*time.Second, "drained node deleted", func() bool {
		evs := w.forNode("cpu-1")
		return len(evs) > before && evs[len(evs)-1].Type == mvccpb.DELETE
	})
	evs := w.forNode("cpu-1")[before:]
	if len(evs) != 2 || evs[0].Type != mvccpb.PUT || evs[1].Type != mvccpb.DELETE {
		t.Fatalf("drain events %v, want PUT(draining) then DELETE", describe(evs))
	}
	inv, err := devices.ParseInventory("cpu-1", evs[0].Kv.Value)
	if err != nil || inv.State != devices.StateDraining {
		t.Fatalf("drain PUT: state %q err %v", inv.State, err)
	}
	if err := cpu.agent.Drain(ctx); err != nil {
		t.Errorf("second Drain: %v", err)
	}

	// The GPU node drains too; its HTTP server goes away with it.
	if err := gpu.agent.Drain(ctx); err != nil {
		t.Fatalf("Drain gpu-1: %v", err)
	}
	gpu.wait(t)
	if r, err := cli.Get(context.Background(), fleet.NewKeys(prefix).NodesPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Errorf("nodes left in etcd: %v %v", r, err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Errorf("HTTP server still up after drain")
	}
	mon.Close()
	assertNoLeaks(t)
}

func describe(evs []*clientv3.Event) string {
	var s []string
	for _, ev := range evs {
		s = append(s, fmt.Sprintf("%s %s", ev.Type, ev.Kv.Value))
	}
	return strings.Join(s, "; ")
}

// assertNoLeaks fails if any goroutine of the agent or devices packages is
// still running.
func assertNoLeaks(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		var leaked []string
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "hyperpodrun/agent/node/nodeagent.") || strings.Contains(g, "hyperpodrun/devices.") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines leaked:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A lease lost while the agent lives (etcd partitioned past the TTL, or an
// operator revoking it) is noticed, and the node re-registers.
func TestAgentReregistersAfterLeaseLoss(t *testing.T) {
	cli := startEtcd(t)
	w := watchNodes(t, cli)
	r := start(t, cli, nodeagent.Config{NodeName: "n1", Prefix: prefix, Listen: "127.0.0.1:0",
		Discover: nodeagent.DiscoverWith(devices.Options{DisableNVML: true, DisableNeuron: true, Host: host})})
	w.waitFor(t, 10*time.Second, "registered", func() bool { return w.lastInventory(t, "n1") != nil })
	lease := clientv3.LeaseID(w.forNode("n1")[0].Kv.Lease)
	if _, err := cli.Revoke(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	w.waitFor(t, 10*time.Second, "re-registered under a new lease", func() bool {
		evs := w.forNode("n1")
		last := evs[len(evs)-1]
		return last.Type == mvccpb.PUT && clientv3.LeaseID(last.Kv.Lease) != lease
	})
	if _, m := get(t, "http://"+r.agent.Addr()+"/metrics"); !strings.Contains(m, `hyperpod_agent_lease_lost_total{node="n1"} 1`) {
		t.Errorf("lease loss not counted")
	}
}

// A Neuron device going bad (uncorrected ECC counter in sysfs) is in etcd
// within the refresh interval.
func TestAgentNeuronHealthChange(t *testing.T) {
	cli := startEtcd(t)
	w := watchNodes(t, cli)
	root := t.TempDir()
	src := filepath.Join("..", "..", "..", "devices", "testdata", "neuron", "trn1")
	if err := os.CopyFS(root, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	sysfs := filepath.Join(root, "sys", "devices", "virtual", "neuron_device")
	start(t, cli, nodeagent.Config{NodeName: "trn1-1", Prefix: prefix, Discover: nodeagent.DiscoverWith(
		devices.Options{NVML: noNVML(), NeuronSysfsRoot: sysfs, DevRoot: filepath.Join(root, "dev"), Host: host})})
	w.waitFor(t, 10*time.Second, "registered", func() bool { return w.lastInventory(t, "trn1-1") != nil })

	ecc := filepath.Join(sysfs, "neuron9", "stats", "hardware", "mem_ecc_uncorrected")
	if err := os.WriteFile(ecc, []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	took := w.waitFor(t, 5*time.Second, "neuron9 unhealthy in etcd", func() bool {
		inv := w.lastInventory(t, "trn1-1")
		return inv != nil && !inv.Accelerators[9].Healthy
	})
	t.Logf("ECC error visible in etcd after %s", took)
	if inv := w.lastInventory(t, "trn1-1"); inv.Healthy(devices.KindNeuron) != 15 || !strings.Contains(inv.Accelerators[9].HealthReason, "2 uncorrected HBM ECC errors") {
		t.Errorf("after ECC: %d healthy, %q", inv.Healthy(devices.KindNeuron), inv.Accelerators[9].HealthReason)
	}
}

// Discovery failures are retried (and reported on /healthz); a partial
// inventory (with an error) is registered.
func TestAgentDiscoveryFailures(t *testing.T) {
	cli := startEtcd(t)
	w := watchNodes(t, cli)
	var mu sync.Mutex
	calls := 0
	discover := func(ctx context.Context) (*devices.Inventory, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= 2 {
			return nil, errors.New("sysfs on fire")
		}
		return &devices.Inventory{Node: "ignored", Flavor: "cpu", Flavors: []string{"cpu"}, VCPUs: 4,
			Reasons: []string{"neuron: bad file"}}, errors.New("neuron: bad file")
	}
	r := start(t, cli, nodeagent.Config{NodeName: "flaky", Prefix: prefix, Listen: "127.0.0.1:0", Discover: discover})
	w.waitFor(t, 10*time.Second, "registered after failures", func() bool { return w.lastInventory(t, "flaky") != nil })
	inv := w.lastInventory(t, "flaky")
	if inv.Node != "flaky" || inv.VCPUs != 4 || len(inv.Reasons) != 1 {
		t.Errorf("registered %+v", inv)
	}
	if _, m := get(t, "http://"+r.agent.Addr()+"/metrics"); !strings.Contains(m, "hyperpod_agent_discovery_errors_total") {
		t.Errorf("no discovery error metric")
	}
}

func TestAgentHealthzBeforeRegistration(t *testing.T) {
	cli := startEtcd(t)
	block := make(chan struct{})
	r := start(t, cli, nodeagent.Config{NodeName: "slow", Prefix: prefix, Listen: "127.0.0.1:0",
		Discover: func(ctx context.Context) (*devices.Inventory, error) {
			select {
			case <-block:
			case <-ctx.Done():
			}
			return nil, errors.New("not yet")
		}})
	defer close(block)
	var code int
	var body string
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get("http://" + r.agent.Addr() + "/healthz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			code, body = resp.StatusCode, string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "not registered") {
		t.Errorf("/healthz = %d %q", code, body)
	}
}

// fakeWorkloads records the seam's calls.
type fakeWorkloads struct {
	cli      *clientv3.Client
	started  chan nodeagent.Node
	runDone  chan struct{}
	drainSaw chan string
}

func (f *fakeWorkloads) Run(ctx context.Context, node nodeagent.Node) error {
	f.started <- node
	<-ctx.Done()
	close(f.runDone)
	return nil
}

func (f *fakeWorkloads) Drain(ctx context.Context) error {
	r, err := f.cli.Get(ctx, fleet.NewKeys(prefix).Node("w1"))
	if err != nil || len(r.Kvs) != 1 {
		f.drainSaw <- "key missing"
		return nil
	}
	inv, _ := devices.ParseInventory("w1", r.Kvs[0].Value)
	f.drainSaw <- inv.State
	return nil
}

// Workloads start once the node is registered and are drained while the
// node is marked draining, before the lease goes.
func TestAgentWorkloadsSeam(t *testing.T) {
	cli := startEtcd(t)
	f := &fakeWorkloads{cli: cli, started: make(chan nodeagent.Node, 1), runDone: make(chan struct{}), drainSaw: make(chan string, 1)}
	r := start(t, cli, nodeagent.Config{NodeName: "w1", Prefix: prefix, Workloads: f,
		Discover: nodeagent.DiscoverWith(devices.Options{DisableNVML: true, DisableNeuron: true, Host: host})})
	select {
	case node := <-f.started:
		if node.Name != "w1" || node.Prefix != prefix || node.Client != cli || node.Inventory() == nil || node.Inventory().Flavor != "cpu" {
			t.Errorf("Workloads.Run got %+v", node)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Workloads.Run not started")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.agent.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := <-f.drainSaw; got != devices.StateDraining {
		t.Errorf("Workloads.Drain saw the node %q, want draining", got)
	}
	select {
	case <-f.runDone:
	case <-time.After(5 * time.Second):
		t.Fatal("Workloads.Run not stopped after drain")
	}
	r.wait(t)
	assertNoLeaks(t)
}

func TestNewValidatesConfig(t *testing.T) {
	cli := startEtcd(t)
	disc := nodeagent.DiscoverWith(devices.Options{DisableNVML: true, DisableNeuron: true, Host: host})
	for _, c := range []struct {
		cfg  nodeagent.Config
		want string
	}{
		{nodeagent.Config{NodeName: "a/b", Discover: disc}, "invalid node name"},
		{nodeagent.Config{NodeName: "n"}, "Discover is required"},
		{nodeagent.Config{NodeName: "n", Discover: disc, LeaseTTL: -time.Second}, "negative"},
		{nodeagent.Config{NodeName: "n", Discover: disc, Listen: "256.0.0.1:bad"}, "listen"},
	} {
		if _, err := nodeagent.New(cli, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
	if _, err := nodeagent.New(nil, nodeagent.Config{NodeName: "n", Discover: disc}); err == nil {
		t.Error("New accepted a nil client")
	}
	// An agent that never runs releases its listener on Close; Drain
	// before Run is harmless and Run then returns at once.
	a, err := nodeagent.New(cli, nodeagent.Config{NodeName: "n", Discover: disc, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Error(err)
	}
	b, _ := nodeagent.New(cli, nodeagent.Config{NodeName: "n", Discover: disc})
	if err := b.Drain(context.Background()); err != nil {
		t.Error(err)
	}
	if err := b.Run(context.Background()); err != nil {
		t.Error(err)
	}
	if err := b.Run(context.Background()); err == nil {
		t.Error("second Run accepted")
	}
}

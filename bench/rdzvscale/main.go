// Command rdzvscale measures the etcd rendezvous at scale: N in-process
// participants, each its own rendezvous.Node with its own lease (sharing a
// small pool of etcd clients), against one embedded etcd, timed from the
// first Join until every participant holds the closed round, and (-ready)
// until every participant has also passed the round's ready barrier
// (rendezvous.Barrier) and holds its running marker
// (rendezvous.RunningMarker): the path a real job takes before its
// workers may start, as agent/elastic walks it.
//
//	go run ./bench/rdzvscale -n 1000,10000
//	go run ./bench/rdzvscale -ready -n 1000,10000,20000 -events-at 10000
//
// It prints one line per size, e.g.
//
//	BENCH rdzv_close_1000_nodes 0.42 s anchor=torch-etcd-256-nodes:97s target=1
//	BENCH rdzv_ready_10000_nodes 1.9 s target=2
//	BENCH rdzv_ready_10000_nodes_watch_events 30012 events
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	if os.Getenv(serveEnv) == "1" {
		os.Exit(serveEtcd())
	}
	os.Exit(benchMain())
}

func benchMain() int {
	sizes := flag.String("n", "1000,10000", "comma-separated participant counts")
	clients := flag.Int("clients", 16, "etcd clients shared by the participants")
	ttl := flag.Duration("lease-ttl", rendezvous.DefaultLeaseTTL, "lease TTL of every participant")
	nproc := flag.Int("nproc", 8, "local world size of every participant")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the measured runs here")
	memprofile := flag.String("memprofile", "", "write an allocation profile here at exit")
	flag.StringVar(&goroutineDump, "goroutines", "", "dump every goroutine here once all participants joined")
	gogc := flag.Int("gogc", 400, "GC percent of this process (0: Go's default, or $GOGC); the simulation keeps every participant's heap and etcd's in one process, which no deployment does")
	authAt := flag.Int("auth-at", 1000, "also run this size with etcd auth on (the job's own user, as the coordinator mints it) and print it beside the same run's figure without; 0: skip")
	ready := flag.Bool("ready", false, "measure to every participant past the ready barrier and holding its running marker (rdzv_ready_*), not to the closed round (rdzv_close_*)")
	eventsAt := flag.Int("events-at", 0, "with -ready: also print the watch events etcd delivered (all watchers, summed) for this size; 0: skip")
	flag.DurationVar(&sizeTimeout, "timeout", 4*time.Minute, "give up on a size after this long (its Join timeout; the run's deadline is a minute more)")
	flag.BoolVar(&etcdProcess, "etcd-process", true, "run etcd in a process of its own, as every deployment does (false: in this process, where the nodes' garbage collections stop it too)")
	verbose := flag.Bool("v", false, "log progress and the rendezvous' decisions and warnings to stderr")
	flag.Parse()

	var ns []int
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			fatalf("bad -n entry %q", s)
		}
		ns = append(ns, n)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fatalf("%v", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatalf("%v", err)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	if *gogc > 0 {
		debug.SetGCPercent(*gogc)
	}
	gcPercent := debug.SetGCPercent(-1)
	debug.SetGCPercent(gcPercent)
	level := slog.LevelError + 1
	if *verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	where := "in this process"
	if etcdProcess {
		where = "in a process of its own"
	}
	fmt.Printf("# rdzvscale: one embedded etcd per size, %s, with UnsafeNoFsync (no fsync: benchmark only); each participant its own Node and lease (TTL %s), sharing %d clients; GOMAXPROCS %d, GOGC %d\n",
		where, *ttl, *clients, runtime.GOMAXPROCS(0), gcPercent)
	failed := false
	baseline := runtime.NumGoroutine()
	for _, n := range ns {
		if *ready {
			secs, events, err := runReady(n, *clients, *ttl, *nproc, logger)
			if err != nil {
				fmt.Fprintf(os.Stderr, "rdzvscale: %d nodes to ready: %v\n", n, err)
				failed = true
				continue
			}
			target := ""
			if n == 10000 {
				target = " target=2"
			}
			fmt.Printf("BENCH rdzv_ready_%d_nodes %.2f s%s\n", n, secs, target)
			if n == *eventsAt {
				fmt.Printf("BENCH rdzv_ready_%d_nodes_watch_events %d events\n", n, events)
			}
			continue
		}
		secs, err := run(n, *clients, *ttl, *nproc, false, logger)
		if err != nil {
			fmt.Fprintf(os.Stderr, "rdzvscale: %d nodes: %v\n", n, err)
			failed = true
			continue
		}
		fmt.Printf("BENCH rdzv_close_%d_nodes %.2f s anchor=torch-etcd-256-nodes:97s target=%s\n", n, secs, strconv.FormatFloat(float64(n)/1000, 'f', -1, 64))
	}
	if n := *authAt; n > 0 && !*ready {
		// Auth off and on back to back, after the runs above warmed the
		// process (the first run of a size pays for the heap's growth).
		off, err := run(n, *clients, *ttl, *nproc, false, logger)
		var on float64
		if err == nil {
			on, err = run(n, *clients, *ttl, *nproc, true, logger)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "rdzvscale: %d nodes, auth off then on: %v\n", n, err)
			failed = true
		} else {
			fmt.Printf("BENCH rdzv_close_%d_nodes_auth %.2f s anchor=auth-off:%.2fs target=%s\n", n, on, off, strconv.FormatFloat(float64(n)/1000, 'f', -1, 64))
		}
	}
	// Everything run started must be gone: nodes, clients, the server.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > baseline && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > baseline {
		fmt.Fprintf(os.Stderr, "rdzvscale: %d goroutines still running after cleanup (started with %d)\n", g, baseline)
		failed = true
	}
	if *memprofile != "" {
		f, err := os.Create(*memprofile)
		if err != nil {
			fatalf("%v", err)
		}
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			fatalf("%v", err)
		}
		f.Close()
	}
	if failed {
		return 1
	}
	return 0
}

var (
	goroutineDump string
	sizeTimeout   = 4 * time.Minute
	etcdProcess   = true
)

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "rdzvscale: "+format+"\n", args...)
	os.Exit(2)
}

// run measures one size to the closed round and frees everything it
// started.
func run(n, nclients int, ttl time.Duration, nproc int, auth bool, logger *slog.Logger) (float64, error) {
	secs, _, err := measure(n, nclients, ttl, nproc, auth, false, logger)
	return secs, err
}

// runReady measures one size to every participant past the ready barrier
// and holding its running marker, and counts the watch events etcd
// delivered meanwhile.
func runReady(n, nclients int, ttl time.Duration, nproc int, logger *slog.Logger) (float64, int64, error) {
	return measure(n, nclients, ttl, nproc, false, true, logger)
}

// measure times one size and frees everything it started.
// With auth, etcd auth is on and every participant connects as the job's
// own user (etcdauth.Mint), as hyperpodrun does under a coordinator that
// mints credentials: etcd checks that user's permission on every request.
func measure(n, nclients int, ttl time.Duration, nproc int, auth, ready bool, logger *slog.Logger) (secs float64, events int64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), sizeTimeout+time.Minute)
	defer cancel()
	srv, err := startEtcd(ctx, etcdProcess)
	if err != nil {
		return 0, 0, err
	}
	defer srv.Close()
	job := fmt.Sprintf("bench-%d", n)
	connect := func() (*clientv3.Client, error) {
		return etcdconn.Connect(ctx, etcdconn.Options{Endpoints: srv.endpoints})
	}
	if auth {
		connect, err = authedClients(ctx, srv.endpoints, job)
		if err != nil {
			return 0, 0, err
		}
	}
	clis := make([]*clientv3.Client, min(nclients, n))
	for i := range clis {
		if clis[i], err = connect(); err != nil {
			return 0, 0, err
		}
	}
	defer func() {
		for _, c := range clis {
			c.Close()
		}
	}()
	nodes := make([]*rendezvous.Node, n)
	for i := range nodes {
		nodes[i], err = rendezvous.New(clis[i%len(clis)], rendezvous.Config{
			JobID: job, NodeID: fmt.Sprintf("node-%05d", i), Addr: "127.0.0.1", LocalWorldSize: nproc,
			MinNodes: n, MaxNodes: n, LeaseTTL: ttl, JoinTimeout: sizeTimeout, Logger: logger,
		})
		if err != nil {
			return 0, 0, err
		}
	}
	defer closeAll(nodes)

	rounds := make([]*rendezvous.Round, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	var joined, lastJoin atomic.Int64 // lastJoin: when the last Join returned, since start
	cpu0, ecpu0 := cpuTime(), srv.cpu()
	ops0 := etcdOps(srv)
	start := time.Now()
	logger.Info("rdzvscale: start", "nodes", n)
	for i, nd := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rounds[i], errs[i] = nd.Join(ctx)
			for at := int64(time.Since(start)); ; {
				if last := lastJoin.Load(); at <= last || lastJoin.CompareAndSwap(last, at) {
					break
				}
			}
			if errs[i] == nil && ready {
				errs[i] = startWorkers(ctx, clis[i%len(clis)], job, nd, rounds[i], ttl)
			}
			joined.Add(1)
		}()
	}
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if time.Since(start) > 30*time.Second {
					continue
				}
				logger.Info("rdzvscale: progress", "elapsed", time.Since(start).Round(time.Millisecond), "joined", joined.Load(), "goroutines", runtime.NumGoroutine())
			}
		}
	}()
	wg.Wait()
	close(stop)
	elapsed := time.Since(start)
	if goroutineDump != "" {
		if f, err := os.Create(goroutineDump); err == nil {
			_ = pprof.Lookup("goroutine").WriteTo(f, 2)
			f.Close()
		}
	}
	cpu, ecpu := cpuTime()-cpu0, srv.cpu()-ecpu0
	ops := etcdOps(srv).minus(ops0)
	events = ops.events
	logger.Info("rdzvscale: done", "nodes", n, "elapsed", elapsed.Round(time.Millisecond), "cpu", cpu.Round(time.Millisecond), "etcd_cpu", ecpu.Round(time.Millisecond))
	if ready {
		joinedAt := time.Duration(lastJoin.Load())
		fmt.Printf("# %d nodes: every Join returned at %.2f s, every node past the barrier and marked %.2f s later; CPU %s\n",
			n, joinedAt.Seconds(), (elapsed - joinedAt).Seconds(), cpuSplit(cpu, ecpu, 1))
	}
	fmt.Printf("# %d nodes, per node: CPU %s; %s\n", n, cpuSplit(cpu, ecpu, n), ops.perNode(n))
	if err := errors.Join(errs...); err != nil {
		return 0, 0, err
	}
	// Every participant must hold the same round with a distinct rank.
	seen := make([]bool, n)
	for _, r := range rounds {
		if r.Number != rounds[0].Number || r.NumNodes != n || r.WorldSize != n*nproc || r.MasterPort != rounds[0].MasterPort || seen[r.Rank] {
			return 0, 0, fmt.Errorf("inconsistent round: %+v vs %+v", r, rounds[0])
		}
		seen[r.Rank] = true
	}
	return elapsed.Seconds(), events, nil
}

// cpuSplit renders the CPU of the nodes (this process) and of etcd (its
// process; with etcd in this process, one figure for both), divided by n.
func cpuSplit(nodes, etcd time.Duration, n int) string {
	unit, scale := "s", float64(time.Second)
	if n > 1 {
		unit, scale = "ms", float64(time.Millisecond)
	}
	f := func(d time.Duration) float64 { return float64(d) / scale / float64(n) }
	if !etcdProcess {
		return fmt.Sprintf("%.2f %s (etcd and the nodes)", f(nodes), unit)
	}
	return fmt.Sprintf("%.2f %s (etcd %.2f, the nodes %.2f)", f(nodes+etcd), unit, f(etcd), f(nodes))
}

// startWorkers walks what agent/elastic does between a closed round and
// its workers' start (round.go's barrier and markRunning): arrive at the
// round's ready barrier (rank 0 prunes older barriers), wait for every
// member, wait for older workers of other nodes to be gone, and mark this
// node's workers running under its lease.
func startWorkers(ctx context.Context, cli *clientv3.Client, job string, nd *rendezvous.Node, r *rendezvous.Round, ttl time.Duration) error {
	// The bound agent/elastic gives them: with the 5 s default, nodes
	// answered "too many requests" for longer failed their round at
	// 20,000 nodes on a loaded machine, where the agent would have waited.
	timeout := rendezvous.OpTimeout(ttl)
	b := rendezvous.NewBarrier(cli, "", job, r.Number, r.NumNodes, nd.ID(), timeout)
	if err := b.Arrive(ctx); err != nil {
		return err
	}
	if r.Rank == 0 {
		if err := b.PruneOlder(ctx); err != nil {
			return err
		}
	}
	if err := b.Wait(ctx); err != nil {
		return err
	}
	m := rendezvous.NewRunningMarker(cli, "", job, nd.ID(), nd.Lease(), timeout)
	if err := m.WaitOlderGone(ctx, r.Number, nil); err != nil {
		return err
	}
	return m.Mark(ctx, r.Number)
}

// opCounts is what etcd has handled so far: raft proposals committed
// (every write: a put, a transaction, a lease grant or revoke), the gRPC
// messages received per method (a unary call is one; a watch's create and
// cancel requests and each lease keepalive are one each), and the watch
// events delivered to watchers (all watchers, summed:
// etcd_debugging_mvcc_events_total; -1 when unknown).
type opCounts struct {
	proposals float64
	msgs      map[string]float64
	events    int64
}

// etcdOps reads the counts from one gathering of etcd's metrics.
func etcdOps(srv *etcdServer) opCounts {
	c := opCounts{msgs: map[string]float64{}, events: -1}
	mfs, err := srv.gather()
	if err != nil {
		return c
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "etcd_server_proposals_committed_total":
			for _, m := range mf.GetMetric() {
				c.proposals += m.GetGauge().GetValue()
			}
		case "grpc_server_msg_received_total":
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "grpc_method" {
						c.msgs[l.GetValue()] += m.GetCounter().GetValue()
					}
				}
			}
		case "etcd_debugging_mvcc_events_total":
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			c.events = int64(sum)
		}
	}
	return c
}

func (c opCounts) minus(o opCounts) opCounts {
	d := opCounts{proposals: c.proposals - o.proposals, msgs: map[string]float64{}, events: -1}
	if c.events >= 0 && o.events >= 0 {
		d.events = c.events - o.events
	}
	for k, v := range c.msgs {
		if v -= o.msgs[k]; v > 0 {
			d.msgs[k] = v
		}
	}
	return d
}

// perNode renders the counts divided by n, methods sorted by name.
func (c opCounts) perNode(n int) string {
	names := make([]string, 0, len(c.msgs))
	for k := range c.msgs {
		names = append(names, k)
	}
	slices.Sort(names)
	var b strings.Builder
	fmt.Fprintf(&b, "etcd writes (raft proposals) %.2f; gRPC messages", c.proposals/float64(n))
	for _, k := range names {
		fmt.Fprintf(&b, " %s %.2f", k, c.msgs[k]/float64(n))
	}
	return b.String()
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// closeAll revokes every participant's lease, a few at a time.
func closeAll(nodes []*rendezvous.Node) {
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	for _, nd := range nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			_ = nd.Close()
			<-sem
		}()
	}
	wg.Wait()
}

// authedClients bootstraps etcd auth on the etcd at endpoints, mints job's
// credentials and returns a constructor of clients logged in as the job's
// user.
func authedClients(ctx context.Context, endpoints []string, job string) (func() (*clientv3.Client, error), error) {
	open, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: endpoints})
	if err != nil {
		return nil, err
	}
	defer open.Close()
	dir, err := os.MkdirTemp("", "rdzvscale-auth-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	k := fleet.NewKeys("")
	if _, err := etcdauth.Bootstrap(ctx, open, k, nil, dir); err != nil {
		return nil, err
	}
	rootPW, err := etcdconn.ReadPassword(filepath.Join(dir, etcdauth.RootUser+".password"), "", "root")
	if err != nil {
		return nil, err
	}
	root, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: endpoints, User: etcdauth.RootUser, Password: rootPW})
	if err != nil {
		return nil, err
	}
	defer root.Close()
	creds, err := etcdauth.Mint(ctx, root, k, job)
	if err != nil {
		return nil, err
	}
	return func() (*clientv3.Client, error) {
		return etcdconn.Connect(ctx, etcdconn.Options{Endpoints: endpoints, User: creds.User, Password: creds.Password})
	}, nil
}

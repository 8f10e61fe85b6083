package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// benchRun is one size's run: the etcd, the bench's client, the job
// generator and the tally of the coordinator's writes.
type benchRun struct {
	o    options
	z    size
	etcd *etcdServer
	cli  *clientv3.Client
	k    fleet.Keys
	g    *gen
	t    *tally
	// agentEvents counts the events the simulated agents' watches got.
	agentEvents atomic.Int64
}

// results are the figures one run prints.
type results struct {
	cold                    time.Duration
	coldPuts, coldDels      int
	idleCPU                 time.Duration
	idlePuts                int
	sent, perCycle          float64
	idleWakeups             float64         // context switches per 2 s
	lat                     []time.Duration // sorted
	inOrder                 []string
	cycles, cycleS, engineS float64
	puts, dels, changed     []int
	ops                     []int // etcd's put and delete requests less the bench's own (-1: unknown)
	events                  []int
	kinds                   []map[string]int
	churnTime               time.Duration
	s0, s1                  *clientv3.StatusResponse
	rss                     float64
	// The coordinator's returns of memory to the OS before the idle
	// window (--idle-return-after) and their CPU, and its RSS in the
	// idle window.
	returns   float64
	returnCPU time.Duration
	idleRSS   float64
}

func bench(o options, z size, tmp string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp(tmp, z.String())
	if err != nil {
		return err
	}
	etcd, err := startEtcd(ctx, o.etcdBin, dir)
	if err != nil {
		return err
	}
	defer etcd.stop()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.endpoint}, DialTimeout: 5 * time.Second, MaxCallRecvMsgSize: 1 << 30})
	if err != nil {
		return err
	}
	defer cli.Close()
	b := &benchRun{o: o, z: z, etcd: etcd, cli: cli, k: fleet.NewKeys(""), g: &gen{rng: rand.New(rand.NewPCG(o.seed, 7)), teams: z.teams},
		t: &tally{jobs: map[string]bool{}, byKind: map[string]int{}, statusAt: map[string]chan struct{}{}, running: map[string]bool{}, seq: map[string][]string{}}}
	if err := b.writeFleet(ctx, fleet.New(cli, "")); err != nil {
		return err
	}
	r0, err := cli.Get(ctx, "probe")
	if err != nil {
		return err
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	b.t.watch(wctx, cli, b.k, r0.Header.Revision+1)

	port := freePort()
	start := time.Now()
	pid, logName, stop, err := b.startCoordinator(dir, port)
	if err != nil {
		return err
	}
	defer stop()
	var res results
	if err := b.waitColdStart(ctx, start, logName, port); err != nil {
		return err
	}
	b.t.mu.Lock()
	res.cold = b.t.last.Sub(start) // to the cold start's last write
	b.t.mu.Unlock()
	res.coldPuts, res.coldDels, _ = b.t.reset()
	acli, err := b.watchAgents(wctx)
	if err != nil {
		return err
	}
	defer acli.Close()
	b.awaitReturn(ctx, port, &res)
	b.measureIdle(pid, &res)
	if err := b.measureSubmits(ctx, port, &res); err != nil {
		return err
	}
	if err := b.churn(ctx, &res); err != nil {
		return err
	}
	res.rss = rssMB(pid)
	b.report(&res)
	return nil
}

// writeFleet writes the teams (nominal quotas cover the fleet, 10 cohorts,
// half preempt), the nodes under leases (one per 100 nodes, kept alive)
// and the jobs.
func (b *benchRun) writeFleet(ctx context.Context, st *fleet.Store) error {
	z, k := b.z, b.k
	nominal := z.nodes * 8 / z.teams
	var ops []clientv3.Op
	for i := 0; i < z.teams; i++ {
		t := policy.Team{Name: fmt.Sprintf("team-%03d", i), Cohort: fmt.Sprintf("cohort-%d", i%10), Weight: float64(1 + i%3),
			Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: nominal}}}
		if i%2 == 0 {
			t.Preemption = policy.PreemptLowerPriority
		}
		bs, _ := json.Marshal(t)
		ops = append(ops, clientv3.OpPut(k.Team(t.Name), string(bs)))
	}
	var lease clientv3.LeaseID
	for i := 0; i < z.nodes; i++ {
		if i%100 == 0 {
			l, err := b.cli.Grant(ctx, 120)
			if err != nil {
				return err
			}
			lease = l.ID
			ka, err := b.cli.KeepAlive(ctx, lease)
			if err != nil {
				return err
			}
			go func() {
				for range ka {
				}
			}()
		}
		inv := devices.Inventory{Node: fmt.Sprintf("node-%05d", i), Flavor: flavor, VCPUs: 192, MemoryBytes: 2 << 40, State: devices.StateReady}
		for a := 0; a < 8; a++ {
			inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNVIDIA, Index: a, Flavor: flavor, Healthy: true})
		}
		op, err := st.PutNodeOp(inv, clientv3.WithLease(lease))
		if err != nil {
			return err
		}
		ops = append(ops, op)
	}
	now := time.Now()
	for i := 0; i < z.jobs; i++ {
		ops = append(ops, specOp(k, b.g.job(now.Add(-time.Duration(z.jobs-i)*time.Millisecond))))
	}
	if err := putAll(ctx, b.cli, ops); err != nil {
		return fmt.Errorf("write the fleet: %w", err)
	}
	return nil
}

// startCoordinator starts the coordinator binary on the bench's etcd; stop
// sends SIGTERM and kills it after 10 s.
func (b *benchRun) startCoordinator(dir string, port int) (pid int, logName string, stop func(), err error) {
	cmd := exec.Command(b.o.coordinator, append([]string{"--etcd-endpoints", b.etcd.endpoint, "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--compact-retention", "5s", "--id", "bench"}, strings.Fields(b.o.coordinatorFlags)...)...)
	logf, err := os.Create(filepath.Join(dir, "coordinator.log"))
	if err != nil {
		return 0, "", nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return 0, "", nil, err
	}
	stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	return cmd.Process.Pid, logf.Name(), stop, nil
}

// waitColdStart waits for every job decided, then for the coordinator to
// settle: no write for a second and no cycle for settleFor (the follow-up
// cycle after the cold start's runs seconds of engine and diff before its
// first write at 20,000 nodes: a quiet second alone let its writes land in
// the idle window).
func (b *benchRun) waitColdStart(ctx context.Context, start time.Time, logName string, port int) error {
	for {
		n, err := b.decided(ctx)
		if err == nil && n >= b.z.jobs {
			break
		}
		if time.Since(start) > 5*time.Minute {
			return fmt.Errorf("the coordinator decided %d of %d jobs in 5m (log: %s)", n, b.z.jobs, logName)
		}
		time.Sleep(250 * time.Millisecond)
	}
	const settleFor = 5 * time.Second
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
		_, n0, _ := cycleSeconds(port)
		b.t.quiet(time.Second, time.Minute)
		time.Sleep(settleFor)
		b.t.mu.Lock()
		last := b.t.last
		b.t.mu.Unlock()
		if _, n1, _ := cycleSeconds(port); n1 == n0 && time.Since(last) >= settleFor {
			return nil
		}
	}
	return fmt.Errorf("the coordinator did not settle in 2m after the cold start (log: %s)", logName)
}

// decided counts the jobs the coordinator decided: those with a status
// record or a desired record (a job running as admitted has no status).
func (b *benchRun) decided(ctx context.Context) (int, error) {
	jobs := map[string]bool{}
	for _, p := range []string{b.k.StatusPrefix(), b.k.DesiredPrefix()} {
		r, err := b.cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return len(jobs), err
		}
		for _, kv := range r.Kvs {
			jobs[strings.TrimPrefix(string(kv.Key), p)] = true
		}
	}
	return len(jobs), nil
}

// watchAgents opens the agents' watches: one per node on its own
// assignments, counted in agentEvents.
func (b *benchRun) watchAgents(ctx context.Context) (*clientv3.Client, error) {
	acli, err := clientv3.New(clientv3.Config{Endpoints: []string{b.etcd.endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	for i := 0; i < min(b.z.nodes, b.o.agents); i++ {
		ch := acli.Watch(ctx, b.k.NodeAssignments(fmt.Sprintf("node-%05d", i)), clientv3.WithPrefix())
		go func() {
			for w := range ch {
				b.agentEvents.Add(int64(len(w.Events)))
			}
		}()
	}
	time.Sleep(time.Second) // the watches are registered
	return acli, nil
}

// awaitReturn waits for the settled coordinator to be idle for good: no
// cycle due within 3 minutes (a stable period's end brings one without an
// input change) and --idle-return-after (plus 5 s) past its last cycle, by
// which time it returned its memory to the operating system where that
// pays, as every coordinator does that waits that long. The idle window
// then measures the coordinator's steady wait. The returns' CPU is the
// coordinator's own count (getrusage around each). An older binary (no
// such series) is not waited for.
func (b *benchRun) awaitReturn(ctx context.Context, port int, res *results) {
	after := idleReturnAfter(b.o.coordinatorFlags)
	t0 := time.Now()
	lastCycle, lastCycles := t0, -1.0 // the settle saw no cycle for 5 s
	for time.Since(t0) < 4*time.Minute && ctx.Err() == nil {
		m, err := scrape(port)
		if err != nil {
			time.Sleep(500 * time.Millisecond)
			continue
		}
		returns, ok := m["hyperpod_coordinator_memory_returns_total"]
		if !ok {
			fmt.Printf("# %s: the coordinator reports no memory returns (an older binary): the idle window starts at once\n", b.z)
			return
		}
		if cycles := m["hyperpod_coordinator_cycle_seconds_count"]; cycles > 0 && cycles != lastCycles {
			if lastCycles >= 0 {
				lastCycle = time.Now()
			}
			lastCycles = cycles
		}
		wake := m["hyperpod_coordinator_next_wake_timestamp_seconds"]
		until := time.Until(time.Unix(0, int64(wake*1e9)))
		// A wake just past is soon too: its cycle may not have run yet
		// (or not been counted).
		wakeSoon := wake > 0 && until > -10*time.Second && until < 3*time.Minute
		if !wakeSoon && time.Since(lastCycle) >= after+5*time.Second {
			res.returns = returns
			res.returnCPU = time.Duration(m["hyperpod_coordinator_memory_return_cpu_seconds_total"] * float64(time.Second))
			fmt.Printf("# %s: the coordinator idle for good %s after the cold start's settle\n", b.z, time.Since(t0).Round(time.Second))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Printf("# %s: the coordinator was not idle for good within %s: the idle window starts now\n", b.z, time.Since(t0).Round(time.Second))
}

// idleReturnAfter is the coordinator's --idle-return-after as the bench's
// -coordinator-flags set it, else its default (30 s).
func idleReturnAfter(flags string) time.Duration {
	f := strings.Fields(flags)
	for i, a := range f {
		v, ok := strings.CutPrefix(strings.TrimLeft(a, "-"), "idle-return-after")
		switch {
		case !ok:
			continue
		case v == "" && i+1 < len(f):
			v = f[i+1]
		default:
			v = strings.TrimPrefix(v, "=")
		}
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return 30 * time.Second
}

// measureIdle measures the coordinator's CPU, its writes and the bytes
// etcd sends while nothing changes.
func (b *benchRun) measureIdle(pid int, res *results) {
	if b.o.keep {
		fmt.Println("# idle window starts at", time.Now().UTC().Format(time.RFC3339Nano))
	}
	res.idleRSS = rssMB(pid)
	cpu0, sent0, wake0 := cpuTime(pid), b.etcd.sentBytes(), wakeups(pid)
	time.Sleep(b.o.idle)
	if b.o.keep {
		fmt.Println("# idle window ends at", time.Now().UTC().Format(time.RFC3339Nano))
	}
	res.idleCPU = cpuTime(pid) - cpu0
	res.idleWakeups = float64(wakeups(pid)-wake0) / (b.o.idle.Seconds() / 2)
	res.sent = b.etcd.sentBytes() - sent0
	res.perCycle = float64(res.idleCPU.Microseconds()) / 1000 / (b.o.idle.Seconds() / 2)
	res.idlePuts, _, _ = b.t.reset()
}

// measureSubmits submits jobs one at a time and measures submit ->
// decision written, and the coordinator's cycles meanwhile.
func (b *benchRun) measureSubmits(ctx context.Context, port int, res *results) error {
	if b.o.keep {
		fmt.Println("# submits start at", time.Now().UTC().Format(time.RFC3339Nano))
	}
	cs0, cc0, ce0 := cycleSeconds(port)
	var lat []time.Duration
	for i := 0; i < b.o.submits; i++ {
		j := b.g.job(time.Now())
		j.PerNode.Accelerators, j.MinNodes, j.MaxNodes, j.Elastic = 1, 0, 0, false
		if b.o.elasticSubmits {
			j.PerNode.Accelerators, j.MinNodes, j.MaxNodes, j.Elastic = 8, 1, 4, true
		}
		ch := make(chan struct{})
		b.t.mu.Lock()
		b.t.statusAt[j.Name] = ch
		b.t.mu.Unlock()
		t0 := time.Now()
		if _, err := b.cli.Do(ctx, specOp(b.k, j)); err != nil {
			return err
		}
		select {
		case <-ch:
			lat = append(lat, time.Since(t0))
		case <-time.After(30 * time.Second):
			return fmt.Errorf("job %s: no status in 30s", j.Name)
		}
		time.Sleep(150 * time.Millisecond)
	}
	for _, l := range lat {
		res.inOrder = append(res.inOrder, fmt.Sprintf("%.0f", ms(l)))
	}
	slices.Sort(lat)
	res.lat = lat
	cs1, cc1, ce1 := cycleSeconds(port)
	res.cycles, res.cycleS, res.engineS = cc1-cc0, cs1-cs0, ce1-ce0
	b.t.quiet(500*time.Millisecond, 10*time.Second)
	b.t.reset()
	return nil
}

// churn runs the churn rounds: 1% of the jobs finish and 1% are submitted
// in each, counting the coordinator's writes and the agents' events.
func (b *benchRun) churn(ctx context.Context, res *results) error {
	var err error
	if res.s0, err = b.cli.Status(ctx, b.etcd.endpoint); err != nil {
		return err
	}
	b.agentEvents.Store(0)
	churnStart := time.Now()
	for r := 0; r < b.o.rounds; r++ {
		n := b.z.jobs / 100
		b.t.mu.Lock()
		var running []string
		for j, on := range b.t.running {
			if on {
				running = append(running, j)
			}
		}
		b.t.mu.Unlock()
		slices.Sort(running)
		b.g.rng.Shuffle(len(running), func(a, c int) { running[a], running[c] = running[c], running[a] })
		var ops []clientv3.Op
		for _, j := range running[:min(n, len(running))] {
			bs, _ := json.Marshal(fleet.Finish{Outcome: fleet.Succeeded, Node: "bench", Time: time.Now()})
			ops = append(ops, clientv3.OpPut(b.k.Finish(j), string(bs)))
		}
		for i := 0; i < n; i++ {
			ops = append(ops, specOp(b.k, b.g.job(time.Now())))
		}
		b.agentEvents.Store(0)
		ops0, put := b.etcd.writeOps(), time.Now()
		if err := putAll(ctx, b.cli, ops); err != nil {
			return err
		}
		b.t.quietAfter(put, 2*time.Second, 30*time.Second)
		if ops0 >= 0 {
			res.ops = append(res.ops, int(b.etcd.writeOps()-ops0)-len(ops))
		}
		res.kinds = append(res.kinds, b.t.kinds())
		fmt.Printf("# %s: churn round %d, per-job write sequences: %s\n", b.z, r+1, strings.Join(b.t.sequences(12), "; "))
		p, d, c := b.t.reset()
		res.puts, res.dels, res.changed = append(res.puts, p), append(res.dels, d), append(res.changed, c)
		res.events = append(res.events, int(b.agentEvents.Load()))
	}
	res.churnTime = time.Since(churnStart)
	res.s1, err = b.cli.Status(ctx, b.etcd.endpoint)
	return err
}

// report prints the run's figures: comment lines and BENCH lines.
func (b *benchRun) report(res *results) {
	z, o := b.z, b.o
	med := func(xs []int) float64 {
		ys := slices.Clone(xs)
		slices.Sort(ys)
		return float64(ys[len(ys)/2])
	}
	s0, s1 := res.s0, res.s1
	growthPerRound := float64(s1.DbSize-s0.DbSize) / float64(o.rounds) / 1e6
	fmt.Printf("# %s: cold start %.1fs (%d puts, %d deletes); idle %s: coordinator CPU %s, %d coordinator writes, etcd sent %.0f bytes to all clients (incl. the bench's lease keep-alives)\n",
		z, res.cold.Seconds(), res.coldPuts, res.coldDels, o.idle, res.idleCPU, res.idlePuts, res.sent)
	fmt.Printf("# %s: churn rounds of %d finished + %d submitted (%s in all): puts %v, deletes %v, jobs changed %v, agent watch events %v; puts by record %v; db %.1f -> %.1f MB (in use %.1f -> %.1f MB)\n",
		z, z.jobs/100, z.jobs/100, res.churnTime.Round(time.Millisecond), res.puts, res.dels, res.changed, res.events, res.kinds,
		float64(s0.DbSize)/1e6, float64(s1.DbSize)/1e6, float64(s0.DbSizeInUse)/1e6, float64(s1.DbSizeInUse)/1e6)
	fmt.Printf("# %s: submit -> decision written, ms, in submit order: %s\n", z, strings.Join(res.inOrder, " "))
	if res.cycles > 0 {
		fmt.Printf("# %s: during the submits, %.0f cycles of %.1f ms on average, %.1f ms of it the engine (policy.Schedule), the rest the diff and etcd writes\n",
			z, res.cycles, 1000*res.cycleS/res.cycles, 1000*res.engineS/res.cycles)
	}
	lat := res.lat
	name := "coordinator_daemon_" + z.String()
	submits := name
	if o.elasticSubmits {
		submits += "_elastic"
	}
	fmt.Printf("BENCH %s_submit_to_decision_median %.1f ms anchor=780 target=100\n", submits, ms(lat[len(lat)/2]))
	fmt.Printf("BENCH %s_submit_to_decision_max %.1f ms anchor=1700 target=250\n", submits, ms(lat[len(lat)-1]))
	fmt.Printf("BENCH %s_idle_cpu_per_2s %.2f ms anchor=594 target=5\n", name, res.perCycle)
	fmt.Printf("BENCH %s_idle_wakeups_per_2s %.1f context_switches\n", name, res.idleWakeups)
	if res.returns > 0 {
		per := res.returnCPU / time.Duration(res.returns)
		fmt.Printf("# %s: before the idle window the coordinator returned its heap's free memory to the OS %.0f times, with %s of its CPU each (once per wait of --idle-return-after, 30 s by default)\n",
			z, res.returns, per.Round(100*time.Microsecond))
		fmt.Printf("BENCH %s_memory_return_cpu %.1f ms\n", name, ms(per))
	}
	fmt.Printf("BENCH %s_idle_rss %.0f MB\n", name, res.idleRSS)
	if res.sent >= 0 {
		fmt.Printf("BENCH %s_idle_etcd_bytes_per_min %.0f bytes anchor=650000000\n", name, res.sent/o.idle.Minutes())
	}
	mc := med(res.changed)
	fmt.Printf("BENCH %s_puts_per_churn_round %.0f puts target=%.0f\n", name, med(res.puts), 3*mc)
	fmt.Printf("BENCH %s_writes_per_churn_round %.0f puts+deletes target=%.0f\n", name, med(res.puts)+med(res.dels), 3*mc)
	if len(res.ops) > 0 {
		// etcd's own count: a range delete (the history's bound) is one
		// request, where the watch above sees one delete per key.
		fmt.Printf("# %s: etcd put and delete requests of the coordinator per churn round (etcd_mvcc_put_total + etcd_mvcc_delete_total, less the bench's): %v\n", z, res.ops)
		fmt.Printf("BENCH %s_etcd_write_requests_per_churn_round %.0f requests target=%.0f\n", name, med(res.ops), 3*mc)
	}
	fmt.Printf("BENCH %s_agent_watch_events_per_churn_round %.0f events anchor=1000000 target=%.0f\n", name, med(res.events), 10*mc)
	fmt.Printf("BENCH %s_db_growth_per_min %.2f MB anchor=36 (one round per 10 s: 6 rounds a minute)\n", name, 6*growthPerRound)
	fmt.Printf("BENCH %s_rss %.0f MB\n", name, res.rss)
}

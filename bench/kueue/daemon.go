package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// runDaemon runs the scenario through the coordinator daemon and etcd in
// real time, instead of calling the engine: the workloads are job specs
// put in etcd at their creation times, the coordinator (in this process,
// on an embedded etcd with fsync on) decides and writes desired records,
// and this program plays the node agents: a workload runs from the
// desired record that places it until its runtime is over, then its finish
// record is written. A preempted or moved workload restarts from scratch.
func runDaemon(st policy.State, wls []*workload, totalNominal int, moves bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		return err
	}
	defer srv.Close()
	cli, err := srv.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	store := fleet.New(cli, "")
	if err := seedFleet(ctx, cli, store, st); err != nil {
		return err
	}
	rev, err := cli.Get(ctx, "probe")
	if err != nil {
		return err
	}
	var cycles int
	var cycleTime, engineTime time.Duration
	co := coordinator.New(cli, coordinator.Config{
		Identity: "kueue-bench", Debounce: 5 * time.Millisecond, Engine: policy.Config{DisableMoves: !moves},
		CompactRetention: 30 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnCycle: func(s coordinator.CycleStats) { cycles++; cycleTime += s.Duration; engineTime += s.Engine },
	})
	cctx, stop := context.WithCancel(ctx)
	coDone := make(chan struct{})
	go func() { co.Run(cctx); close(coDone) }()
	defer func() { stop(); <-coDone }()
	wch := cli.Watch(ctx, store.Keys.DesiredPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev.Header.Revision+1))

	if p := os.Getenv("KUEUE_CPUPROFILE"); p != "" {
		f, err := os.Create(p)
		if err == nil {
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
	}
	sim := newAgentSim(cli, store.Keys, wls)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for sim.finished < len(wls) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d workloads finished in 10 minutes", sim.finished, len(wls))
		case wr := <-wch:
			if err := sim.desired(wr); err != nil {
				return err
			}
		case <-tick.C:
			if err := sim.tick(ctx); err != nil {
				return err
			}
		}
	}
	wall := time.Since(sim.start)
	sim.account(wall, 0)
	usage := 100 * sim.usedInt / wall.Seconds() / float64(totalNominal)
	fmt.Printf("# Kueue baseline through the coordinator daemon and an embedded etcd (fsync on), real time: %d workloads, 30 queues in 5 cohorts; pool %d nodes; moves %v\n",
		len(wls), len(st.Nodes), moves)
	fmt.Printf("# this program writes the specs at their creation times and the finish records at the end of their runtimes (the node agents' part); %d coordinator cycles, %.1f ms mean, %.1f ms of it the engine (the rest: diff, etcd writes); %d evictions\n",
		cycles, float64(cycleTime.Microseconds())/1000/float64(max(cycles, 1)), float64(engineTime.Microseconds())/1000/float64(max(cycles, 1)), sim.evictions)
	fmt.Printf("BENCH kueue_baseline_daemon_wall %.1f s anchor=351 target=90\n", wall.Seconds())
	fmt.Printf("BENCH kueue_baseline_daemon_usage %.1f %% anchor=58.7 target=85\n", usage)
	return nil
}

// seedFleet writes the teams and the nodes (under one lease, kept alive).
func seedFleet(ctx context.Context, cli *clientv3.Client, store *fleet.Store, st policy.State) error {
	for _, t := range st.Teams {
		if err := store.PutTeam(ctx, t); err != nil {
			return err
		}
	}
	l, err := cli.Grant(ctx, 600)
	if err != nil {
		return err
	}
	ka, err := cli.KeepAlive(ctx, l.ID)
	if err != nil {
		return err
	}
	go func() {
		for range ka {
		}
	}()
	for _, n := range st.Nodes {
		inv := devices.Inventory{Node: n.Name, Flavor: n.Flavor, State: devices.StateReady}
		for i := 0; i < n.Accelerators; i++ {
			inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNVIDIA, Index: i, Flavor: n.Flavor, Healthy: true})
		}
		op, err := store.PutNodeOp(inv, clientv3.WithLease(l.ID))
		if err != nil {
			return err
		}
		if _, err := cli.Do(ctx, op); err != nil {
			return err
		}
	}
	return nil
}

// agentSim plays the node agents in real time: it submits each workload
// at its creation time, runs it from the desired record that places it,
// and writes its finish record when its runtime is over.
type agentSim struct {
	cli    *clientv3.Client
	k      fleet.Keys
	wls    []*workload
	byName map[string]*workload
	// start is when the run began; epoch the submit times' origin.
	start, epoch                    time.Time
	next, finished, used, evictions int
	// usedInt integrates the units in use over time (unit-seconds).
	usedInt    float64
	lastChange time.Duration
	nodesOf    map[string][]string
	running    map[*workload]bool // the workloads running now
}

func newAgentSim(cli *clientv3.Client, k fleet.Keys, wls []*workload) *agentSim {
	a := &agentSim{cli: cli, k: k, wls: wls, byName: make(map[string]*workload, len(wls)),
		nodesOf: map[string][]string{}, running: map[*workload]bool{}}
	for _, w := range wls {
		a.byName[w.spec.Name] = w
	}
	a.start = time.Now()
	a.epoch = a.start
	return a
}

// account changes the units in use at now by delta.
func (a *agentSim) account(now time.Duration, delta int) {
	a.usedInt += float64(a.used) * (now - a.lastChange).Seconds()
	a.lastChange = now
	a.used += delta
}

// desired starts, moves or stops workloads as their desired records say.
func (a *agentSim) desired(wr clientv3.WatchResponse) error {
	if err := wr.Err(); err != nil {
		return fmt.Errorf("watch desired records: %w", err)
	}
	now := time.Since(a.start)
	for _, e := range wr.Events {
		if e.Type != clientv3.EventTypePut {
			continue
		}
		d, err := fleet.DecodeDesired(string(e.Kv.Key), e.Kv.Value)
		if err != nil {
			return err
		}
		w := a.byName[d.Job]
		if w == nil || w.done {
			continue
		}
		switch {
		case d.Running() && !w.running:
			w.running, w.admitted = true, true
			a.running[w] = true
			w.started, w.end = now, now+w.runtime
			a.account(now, w.units)
		case d.Running() && !sameNodes(a.nodesOf[d.Job], d.Nodes):
			w.started, w.end = now, now+w.runtime // moved: restarts from scratch
			a.evictions++
		case !d.Running() && w.running:
			w.running = false
			delete(a.running, w)
			a.account(now, -w.units)
			w.evicted++
			a.evictions++
		}
		a.nodesOf[d.Job] = d.Nodes
	}
	return nil
}

// tick submits the workloads created by now and finishes those whose
// runtime is over.
func (a *agentSim) tick(ctx context.Context) error {
	now := time.Since(a.start)
	var ops []clientv3.Op
	for a.next < len(a.wls) && a.wls[a.next].create <= now {
		w := a.wls[a.next]
		w.spec.SubmitTime = a.epoch.Add(w.create)
		b, _ := json.Marshal(fleet.JobSpec{Job: w.spec, Run: fleet.RunSpec{Script: "workload"}})
		ops = append(ops, clientv3.OpPut(a.k.Spec(w.spec.Team, w.spec.Name), string(b)))
		a.next++
	}
	for w := range a.running {
		if w.end <= now {
			delete(a.running, w)
			w.running, w.done = false, true
			a.account(now, -w.units)
			a.finished++
			b, _ := json.Marshal(fleet.Finish{Outcome: fleet.Succeeded, Node: "bench", Time: a.epoch.Add(now)})
			ops = append(ops, clientv3.OpPut(a.k.Finish(w.spec.Name), string(b)))
		}
	}
	for len(ops) > 0 {
		n := min(len(ops), 100)
		if _, err := a.cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			return err
		}
		ops = ops[n:]
	}
	return nil
}

func sameNodes(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kueue:", err)
	os.Exit(1)
}

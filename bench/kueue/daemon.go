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
	k := store.Keys
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
	wch := cli.Watch(ctx, k.DesiredPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev.Header.Revision+1))

	byName := make(map[string]*workload, len(wls))
	for _, w := range wls {
		byName[w.spec.Name] = w
	}
	put := func(ops []clientv3.Op) error {
		for len(ops) > 0 {
			n := min(len(ops), 100)
			if _, err := cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
				return err
			}
			ops = ops[n:]
		}
		return nil
	}
	if p := os.Getenv("KUEUE_CPUPROFILE"); p != "" {
		f, err := os.Create(p)
		if err == nil {
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
	}
	start := time.Now()
	epoch := start
	next, finished, used, evictions := 0, 0, 0, 0
	var usedInt float64
	lastChange := time.Duration(0)
	account := func(now time.Duration, delta int) {
		usedInt += float64(used) * (now - lastChange).Seconds()
		lastChange = now
		used += delta
	}
	nodesOf := map[string][]string{}
	running := map[*workload]bool{} // the workloads running now
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for finished < len(wls) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d workloads finished in 10 minutes", finished, len(wls))
		case wr := <-wch:
			if err := wr.Err(); err != nil {
				return fmt.Errorf("watch desired records: %w", err)
			}
			now := time.Since(start)
			for _, e := range wr.Events {
				if e.Type != clientv3.EventTypePut {
					continue
				}
				d, err := fleet.DecodeDesired(string(e.Kv.Key), e.Kv.Value)
				if err != nil {
					return err
				}
				w := byName[d.Job]
				if w == nil || w.done {
					continue
				}
				switch {
				case d.Running() && !w.running:
					w.running, w.admitted = true, true
					running[w] = true
					w.started, w.end = now, now+w.runtime
					account(now, w.units)
				case d.Running() && !sameNodes(nodesOf[d.Job], d.Nodes):
					w.started, w.end = now, now+w.runtime // moved: restarts from scratch
					evictions++
				case !d.Running() && w.running:
					w.running = false
					delete(running, w)
					account(now, -w.units)
					w.evicted++
					evictions++
				}
				nodesOf[d.Job] = d.Nodes
			}
		case <-tick.C:
			now := time.Since(start)
			var ops []clientv3.Op
			for next < len(wls) && wls[next].create <= now {
				w := wls[next]
				w.spec.SubmitTime = epoch.Add(w.create)
				b, _ := json.Marshal(fleet.JobSpec{Job: w.spec, Run: fleet.RunSpec{Script: "workload"}})
				ops = append(ops, clientv3.OpPut(k.Spec(w.spec.Team, w.spec.Name), string(b)))
				next++
			}
			for w := range running {
				if w.end <= now {
					delete(running, w)
					w.running, w.done = false, true
					account(now, -w.units)
					finished++
					b, _ := json.Marshal(fleet.Finish{Outcome: fleet.Succeeded, Node: "bench", Time: epoch.Add(now)})
					ops = append(ops, clientv3.OpPut(k.Finish(w.spec.Name), string(b)))
				}
			}
			if err := put(ops); err != nil {
				return err
			}
		}
	}
	wall := time.Since(start)
	account(wall, 0)
	usage := 100 * usedInt / wall.Seconds() / float64(totalNominal)
	fmt.Printf("# Kueue baseline through the coordinator daemon and an embedded etcd (fsync on), real time: %d workloads, 30 queues in 5 cohorts; pool %d nodes; moves %v\n",
		len(wls), len(st.Nodes), moves)
	fmt.Printf("# this program writes the specs at their creation times and the finish records at the end of their runtimes (the node agents' part); %d coordinator cycles, %.1f ms mean, %.1f ms of it the engine (the rest: diff, etcd writes); %d evictions\n",
		cycles, float64(cycleTime.Microseconds())/1000/float64(max(cycles, 1)), float64(engineTime.Microseconds())/1000/float64(max(cycles, 1)), evictions)
	fmt.Printf("BENCH kueue_baseline_daemon_wall %.1f s anchor=351 target=90\n", wall.Seconds())
	fmt.Printf("BENCH kueue_baseline_daemon_usage %.1f %% anchor=58.7 target=85\n", usage)
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

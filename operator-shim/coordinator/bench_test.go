package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// benchFleet writes a fleet of nodes (8 GPUs each, under leases), teams
// and jobs shaped like bench/coordinator_daemon's into etcd.
func benchFleet(b *testing.B, cli *clientv3.Client, nodes, jobs, teams int, rng *rand.Rand) func(time.Time) policy.Job {
	b.Helper()
	ctx := context.Background()
	st := fleet.New(cli, "")
	k := st.Keys
	const flavor = "nvidia-h100-80gb"
	var ops []clientv3.Op
	nominal := nodes * 8 / teams
	for i := 0; i < teams; i++ {
		t := policy.Team{Name: fmt.Sprintf("team-%03d", i), Cohort: fmt.Sprintf("cohort-%d", i%10), Weight: float64(1 + i%3),
			Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: nominal}}}
		if i%2 == 0 {
			t.Preemption = policy.PreemptLowerPriority
		}
		raw, _ := json.Marshal(t)
		ops = append(ops, clientv3.OpPut(k.Team(t.Name), string(raw)))
	}
	l, err := cli.Grant(ctx, 3600)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < nodes; i++ {
		inv := devices.Inventory{Node: fmt.Sprintf("node-%05d", i), Flavor: flavor, VCPUs: 192, MemoryBytes: 2 << 40, State: devices.StateReady}
		for a := 0; a < 8; a++ {
			inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNVIDIA, Index: a, Flavor: flavor, Healthy: true})
		}
		op, _ := st.PutNodeOp(inv, clientv3.WithLease(l.ID))
		ops = append(ops, op)
	}
	id := 0
	gen := func(now time.Time) policy.Job {
		id++
		u := rng.Float64()
		p := rng.IntN(100)
		j := policy.Job{Name: fmt.Sprintf("job-%06d", id), Team: fmt.Sprintf("team-%03d", int(u*u*float64(teams))), Priority: &p, SubmitTime: now}
		x := rng.Float64()
		gpus := 64
		for _, c := range []struct {
			p float64
			g int
		}{{0.60, 1}, {0.70, 2}, {0.82, 4}, {0.94, 8}, {0.98, 16}, {0.995, 32}} {
			if x < c.p {
				gpus = c.g
				break
			}
		}
		if gpus <= 8 {
			j.PerNode.Accelerators = gpus
			return j
		}
		n := gpus / 8
		j.PerNode.Accelerators = 8
		j.MinNodes, j.MaxNodes = n, n
		if rng.IntN(3) == 0 {
			j.Elastic = true
			j.MinNodes, j.MaxNodes = max(1, n/2), n*2
		}
		return j
	}
	now := time.Now()
	for i := 0; i < jobs; i++ {
		j := gen(now.Add(-time.Duration(jobs-i) * time.Millisecond))
		raw, _ := json.Marshal(fleet.JobSpec{Job: j, Run: fleet.RunSpec{Script: "train.py"}})
		ops = append(ops, clientv3.OpPut(k.Spec(j.Team, j.Name), string(raw)))
	}
	for len(ops) > 0 {
		n := min(len(ops), 100)
		if _, err := cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			b.Fatal(err)
		}
		ops = ops[n:]
	}
	return gen
}

// BenchmarkSubmitCycle measures the coordinator's cycle after one job is
// submitted (the path from a submit to its decision, less the watch and
// the debounce) on a steady fleet of 5,000 nodes, 10,000 jobs and 100
// teams on the embedded etcd: the engine, the write diff and the etcd
// writes.
func BenchmarkSubmitCycle(b *testing.B) {
	_, cli := etcdtest.Start(b)
	ctx := context.Background()
	verifyWrites = false // it would time the full comparison too
	defer func() { verifyWrites = true }()
	gen := benchFleet(b, cli, 5000, 10000, 100, rand.New(rand.NewPCG(1, 7)))
	c := New(cli, Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	leader := clientv3.Compare(clientv3.CreateRevision("bench-no-such-key"), "=", 0)
	if err := c.reload(ctx); err != nil {
		b.Fatal(err)
	}
	var engine time.Duration
	c.cfg.OnCycle = func(s CycleStats) { engine += s.Engine }
	for i := 0; ; i++ {
		again, err := c.cycle(ctx, leader)
		if err != nil {
			b.Fatal(err)
		}
		if !again || i > 5 {
			break
		}
	}
	k := c.store.Keys
	if f := os.Getenv("COORD_BENCH_CPUPROFILE"); f != "" {
		out, err := os.Create(f)
		if err != nil {
			b.Fatal(err)
		}
		pprof.StartCPUProfile(out)
		defer pprof.StopCPUProfile()
	}
	var total time.Duration
	c.cfg.OnCycle = func(s CycleStats) { engine += s.Engine; total += s.Duration }
	b.ResetTimer()
	engine = 0
	for i := 0; i < b.N; i++ {
		j := gen(time.Now())
		j.PerNode.Accelerators, j.MinNodes, j.MaxNodes, j.Elastic = 1, 0, 0, false
		key := k.Spec(j.Team, j.Name)
		c.view.setSpec(key, specRec{job: j, createRev: int64(1e9 + i)})
		c.view.changed++
		if _, err := c.cycle(ctx, leader); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(engine.Microseconds())/1000/float64(b.N), "engine-ms/op")
	b.ReportMetric(float64((total-engine).Microseconds())/1000/float64(b.N), "diff+write-ms/op")
}

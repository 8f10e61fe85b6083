package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// followUpFleet is a small mixed fleet (8-accelerator nodes, teams in two
// cohorts, jobs of every shape) on which the engine needs more than one
// cycle to settle.
func followUpFleet(seed uint64) policy.State {
	rng := rand.New(rand.NewPCG(seed, 5))
	st := policy.State{Now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Config: policy.Config{MinStablePeriod: -1}}
	for i := 0; i < 12; i++ {
		st.Nodes = append(st.Nodes, policy.Node{Name: fmt.Sprintf("n%02d", i), Flavor: "trainium2", Accelerators: 8})
	}
	for i := 0; i < 4; i++ {
		st.Teams = append(st.Teams, policy.Team{Name: fmt.Sprintf("t%d", i), Cohort: fmt.Sprintf("c%d", i%2), Weight: float64(1 + i%2),
			Preemption: policy.PreemptLowerPriority, Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 24}}})
	}
	for i := 0; i < 40; i++ {
		j := policy.Job{Name: fmt.Sprintf("j%02d", i), Team: fmt.Sprintf("t%d", rng.IntN(4)), Priority: ptr(rng.IntN(10)),
			SubmitTime: st.Now.Add(time.Duration(i-100) * time.Second)}
		switch r := rng.IntN(10); {
		case r < 5:
			j.PerNode.Accelerators = 1 << rng.IntN(4)
		case r < 8:
			j.PerNode.Accelerators, j.MinNodes = 8, 1+rng.IntN(3)
		default:
			j.PerNode.Accelerators, j.MinNodes, j.MaxNodes, j.Elastic = 8, 1, 2+rng.IntN(4), true
		}
		st.Jobs = append(st.Jobs, j)
	}
	return st
}

func sizes(allocs []policy.Allocation) map[string]int {
	m := map[string]int{}
	for _, a := range allocs {
		m[a.Job] = a.Size
	}
	return m
}

// A cycle that changed allocations is followed by another at once, until
// the engine settles: on these fleets the second cycle on the same inputs
// admits or resizes more jobs (capacity freed by the first), and without
// the follow-up those jobs waited for the next change in the fleet, which
// on a quiet fleet may never come. The daemon, given the fleet and nothing
// after, ends where the engine run to its fixed point offline ends.
func TestFollowUpCyclesReachTheEnginesFixedPoint(t *testing.T) {
	for _, seed := range []uint64{112, 124, 166} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			st := followUpFleet(seed)
			// Offline: the engine fed its own allocations until they stop changing.
			var want map[string]int
			cycles := 0
			for c := 0; c < 20; c++ {
				d := policy.Schedule(st)
				s := sizes(d.Allocations)
				if maps.Equal(s, want) {
					break
				}
				cycles++
				want = s
				st.Allocations = d.Allocations
				st.Now = st.Now.Add(time.Second)
			}
			if cycles < 2 {
				t.Fatalf("the engine settles in %d cycle on this fleet: the test shows nothing", cycles)
			}

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, cli := etcdtest.Start(t)
			fs := fleet.New(cli, "")
			for _, n := range st.Nodes {
				inv := devices.Inventory{Node: n.Name, Flavor: n.Flavor}
				for d := 0; d < n.Accelerators; d++ {
					inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNeuron, Index: d, Flavor: n.Flavor, Healthy: true})
				}
				etcdtest.RegisterNode(t, cli, inv)
			}
			for _, tm := range st.Teams {
				if err := fs.PutTeam(ctx, tm); err != nil {
					t.Fatal(err)
				}
			}
			// Every job in one transaction: the first cycle sees them all,
			// as the offline one did.
			var ops []clientv3.Op
			for _, j := range st.Jobs {
				raw, err := json.Marshal(fleet.JobSpec{Job: j, Run: fleet.RunSpec{Script: "train.py"}})
				if err != nil {
					t.Fatal(err)
				}
				ops = append(ops, clientv3.OpPut(fs.Keys.Spec(j.Team, j.Name), string(raw)))
			}
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
			var cc cycleCounter
			c := New(cli, Config{Engine: policy.Config{MinStablePeriod: -1}, OnCycle: cc.observe,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			runCoordinator(t, ctx, c)
			// Settled: no cycle for a second (the resync is 10m away).
			last, since := -1, time.Now()
			until(t, "the coordinator settles", func() bool {
				n, _ := cc.get()
				if n != last {
					last, since = n, time.Now()
				}
				return n > 0 && time.Since(since) > time.Second
			})
			got := map[string]int{}
			for _, j := range st.Jobs {
				d, err := fs.Desired(ctx, j.Name)
				if err == nil && d.Running() {
					got[j.Name] = d.Size
				}
			}
			if !maps.Equal(got, want) {
				t.Errorf("after %d cycles the daemon holds sizes %v; the engine settles (in %d cycles) at %v", last, got, cycles, want)
			}
		})
	}
}

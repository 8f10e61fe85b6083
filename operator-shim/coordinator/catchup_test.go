package coordinator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

func TestBehind(t *testing.T) {
	for _, tc := range []struct {
		revs []int64
		want bool
	}{
		{[]int64{9, 9, 9, 9}, false},
		{[]int64{9, 12, 9, 9}, true},
		{[]int64{12, 12, 12, 11}, true},
		{[]int64{12}, false},
	} {
		if got := behind(tc.revs); got != tc.want {
			t.Errorf("behind(%v) = %v, want %v", tc.revs, got, tc.want)
		}
	}
}

// The view is fed by one watch per input prefix, and etcd delivers each
// on its own: here the nodes' watch is held back 400 ms, so a job
// submitted just after three more nodes registered reaches the
// coordinator before those nodes. The coordinator waits until every watch
// has caught up to the job's revision (a progress request), so it admits
// the elastic job at the four nodes the fleet has then. Deciding on what
// had arrived, it admitted the job at the one node it knew and the stable
// period then held its growth (seen in make demo as a needless 1 -> 4
// resize five seconds later).
func TestDecidesOnAConsistentView(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cli := etcdtest.Start(t)
	fs := fleet.New(cli, "")
	node := func(name string) {
		inv := devices.Inventory{Node: name, Flavor: "trainium2"}
		for d := 0; d < 8; d++ {
			inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNeuron, Index: d, Flavor: "trainium2", Healthy: true})
		}
		etcdtest.RegisterNode(t, cli, inv)
	}
	node("n0")
	if err := fs.PutTeam(ctx, policy.Team{Name: "research", Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 32}}}); err != nil {
		t.Fatal(err)
	}
	var cc cycleCounter
	k := fleet.NewKeys("")
	c := New(cli, Config{Engine: policy.Config{MinStablePeriod: time.Hour}, OnCycle: cc.observe, CatchUp: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		watchDelay: func(p string) time.Duration {
			if p == k.NodesPrefix() {
				return 400 * time.Millisecond
			}
			return 0
		}})
	runCoordinator(t, ctx, c)
	until(t, "the coordinator's first cycle", func() bool { n, _ := cc.get(); return n > 0 })
	for i := 1; i < 4; i++ {
		node(fmt.Sprintf("n%d", i))
	}
	if err := fs.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "sweep", Team: "research", Flavor: "trainium2",
		PerNode: policy.Resources{Accelerators: 8}, MinNodes: 1, MaxNodes: 4, Elastic: true},
		Run: fleet.RunSpec{Script: "train.py"}}); err != nil {
		t.Fatal(err)
	}
	var d *fleet.Desired
	until(t, "sweep's first decision", func() bool {
		var err error
		d, err = fs.Desired(ctx, "sweep")
		return err == nil && d != nil
	})
	if d.Size != 4 || d.Generation != 1 {
		t.Fatalf("sweep's first desired record: size %d, generation %d; want it admitted at the 4 nodes the fleet had when it was submitted", d.Size, d.Generation)
	}
}

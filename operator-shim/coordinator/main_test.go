package coordinator

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Every cycle of every test checks its incremental write diff against a
// full comparison of the decision with the view (verifyDiff).
func TestMain(m *testing.M) {
	verifyWrites = true
	os.Exit(m.Run())
}

// putNeuronNodes registers nodes n00, n01, ... (count of them) of flavor,
// 8 healthy Neuron devices each, under one lease of an hour, as node
// agents report them.
func putNeuronNodes(t *testing.T, ctx context.Context, cli *clientv3.Client, st *fleet.Store, flavor string, count int) {
	t.Helper()
	lease, err := cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < count; i++ {
		putNeuronNode(t, ctx, cli, st, flavor, i, lease.ID)
	}
}

// putNeuronNode registers node n<i> of flavor, 8 healthy Neuron devices,
// under lease.
func putNeuronNode(t *testing.T, ctx context.Context, cli *clientv3.Client, st *fleet.Store, flavor string, i int, lease clientv3.LeaseID) {
	t.Helper()
	inv := devices.Inventory{Node: fmt.Sprintf("n%02d", i), Flavor: flavor}
	for d := 0; d < 8; d++ {
		inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNeuron, Index: d, Flavor: flavor, Healthy: true})
	}
	op, err := st.PutNodeOp(inv, clientv3.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Do(ctx, op); err != nil {
		t.Fatal(err)
	}
}

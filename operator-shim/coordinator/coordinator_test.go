package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

func setup(t *testing.T) (*clientv3.Client, context.Context) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	_, cli := etcdtest.Start(t)
	for i := 0; i < 3; i++ {
		inv := devices.Inventory{Node: fmt.Sprintf("n%d", i), Flavor: "trainium2"}
		for d := 0; d < 16; d++ {
			inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNeuron, Index: d, Flavor: "trainium2", Healthy: true})
		}
		b, _ := json.Marshal(inv)
		cli.Put(ctx, "/hyperpodrun/nodes/"+inv.Node, string(b))
	}
	st := fleet.New(cli, "")
	st.PutTeam(ctx, policy.Team{Name: "a", Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 48}}})
	return cli, ctx
}

func waitTarget(t *testing.T, ctx context.Context, cli *clientv3.Client, job, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		r, err := cli.Get(ctx, "/hyperpodrun/jobs/"+job+"/target")
		if err == nil && len(r.Kvs) == 1 && string(r.Kvs[0].Value) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("target of %s never became %s", job, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWritesAllocationTargetPlacementAndFailsOver(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	start := func(id string) (context.CancelFunc, chan struct{}) {
		c := New(cli, Config{Identity: id, Resync: 100 * time.Millisecond, SessionTTL: 2, Engine: policy.Config{MinStablePeriod: -1}})
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { c.Run(cctx); close(done) }()
		return cancel, done
	}
	stop1, done1 := start("one")
	stop2, done2 := start("two")
	defer func() { stop2(); <-done2 }()
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 3, Elastic: true}})
	waitTarget(t, ctx, cli, "j", "3")
	a, err := st.Allocation(ctx, "j")
	if err != nil || len(a.Nodes) != 3 {
		t.Fatalf("allocation %+v %v", a, err)
	}
	r, _ := cli.Get(ctx, "/hyperpodrun/jobs/j/placement")
	var placement []string
	if len(r.Kvs) != 1 || json.Unmarshal(r.Kvs[0].Value, &placement) != nil || len(placement) != 3 {
		t.Fatalf("placement %v", r.Kvs)
	}
	// The leader goes away; the other coordinator takes over and keeps scheduling.
	stop1()
	<-done1
	st.UpdateJob(ctx, "j", func(j *fleet.JobSpec) error { j.MaxNodes = 2; return nil })
	waitTarget(t, ctx, cli, "j", "2")
	s, err := st.Status(ctx, "j")
	if err != nil || s.Kind != policy.KindShrunk {
		t.Errorf("status %+v %v", s, err)
	}
	// A finished job releases its capacity.
	st.MarkFinished(ctx, "j", fleet.Finish{Outcome: fleet.Succeeded, Node: "n0"})
	waitTarget(t, ctx, cli, "j", "0")
	if _, err := st.Allocation(ctx, "j"); err == nil {
		t.Error("finished job still allocated")
	}
}

func TestMalformedInputsAreIgnoredNotFatal(t *testing.T) {
	cli, ctx := setup(t)
	cli.Put(ctx, "/hyperpodrun/nodes/bad", "{not json")
	cli.Put(ctx, "/hyperpodrun/specs/bad", "[]")
	st := fleet.New(cli, "")
	st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "ok", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}})
	c := New(cli, Config{Resync: 100 * time.Millisecond})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitTarget(t, ctx, cli, "ok", "1")
}

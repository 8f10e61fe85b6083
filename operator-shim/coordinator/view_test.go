package coordinator

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// The view follows watch events as the full read would see the records:
// the oldest spec owns a name, finished jobs leave the engine's input, a
// node needs a lease, and only changes the engine sees count as changes.
func TestViewFollowsWatchEvents(t *testing.T) {
	k := fleet.NewKeys("")
	v := newView(k, slog.New(slog.NewTextHandler(io.Discard, nil)))
	v.load(context.TODO(), nil, &fleet.CoordinatorSnapshot{Rev: 1}, time.Now())
	rev := int64(1)
	put := func(key string, val any, lease int64) *clientv3.Event {
		rev++
		b, _ := json.Marshal(val)
		return &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(key), Value: b, CreateRevision: rev, ModRevision: rev, Version: 1, Lease: lease}}
	}
	del := func(key string) *clientv3.Event {
		rev++
		return &clientv3.Event{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}}
	}
	jobs := func() []string {
		st, _ := v.state(time.Now(), policy.Config{})
		var out []string
		for _, j := range st.Jobs {
			out = append(out, j.Team+"/"+j.Name)
		}
		slices.Sort(out)
		return out
	}
	spec := func(team, name string) fleet.JobSpec {
		return fleet.JobSpec{Job: policy.Job{Name: name, Team: team, PerNode: policy.Resources{Accelerators: 1}}, Run: fleet.RunSpec{Script: "x"}}
	}
	now := time.Now()
	if !v.apply([]*clientv3.Event{put(k.Spec("a", "j"), spec("a", "j"), 0), put(k.Spec("b", "j"), spec("b", "j"), 0), put(k.Spec("b", "k"), spec("b", "k"), 0)}, now) {
		t.Fatal("new specs are no change")
	}
	if got := jobs(); !slices.Equal(got, []string{"a/j", "b/k"}) {
		t.Errorf("jobs %v, want a/j (the older spec of j) and b/k", got)
	}
	v.apply([]*clientv3.Event{del(k.Spec("a", "j"))}, now)
	if got := jobs(); !slices.Equal(got, []string{"b/j", "b/k"}) {
		t.Errorf("after a/j was deleted: jobs %v, want b/j to own the name", got)
	}
	v.apply([]*clientv3.Event{put(k.Finish("k"), fleet.Finish{Outcome: fleet.Succeeded}, 0)}, now)
	if got := jobs(); !slices.Equal(got, []string{"b/j"}) {
		t.Errorf("after k finished: jobs %v, want b/j only", got)
	}
	if !v.refresh["j"] || !v.refresh["k"] {
		t.Errorf("created specs are not marked for a re-read of their records: %v", v.refresh)
	}
	// Nodes: a lease is required; a rewrite the engine does not see is no change.
	inv := devices.Inventory{Node: "n", Flavor: "f", State: devices.StateReady,
		Accelerators: []devices.Accelerator{{Kind: devices.KindNVIDIA, Flavor: "f", Healthy: true}}}
	if v.apply([]*clientv3.Event{put(k.Node("n"), inv, 0)}, now) {
		t.Error("a node without a lease changed the view")
	}
	if !v.apply([]*clientv3.Event{put(k.Node("n"), inv, 7)}, now) {
		t.Error("a registered node is no change")
	}
	inv.UpdatedAt = time.Now()
	if v.apply([]*clientv3.Event{put(k.Node("n"), inv, 7)}, now) {
		t.Error("a node rewritten with only a new timestamp counts as a change")
	}
	inv.State = devices.StateDraining
	if !v.apply([]*clientv3.Event{put(k.Node("n"), inv, 7)}, now) {
		t.Error("a draining node is no change")
	}
	if st, _ := v.state(now, policy.Config{}); len(st.Nodes) != 1 || !st.Nodes[0].Draining {
		t.Errorf("nodes %+v, want n draining", st.Nodes)
	}
	if !v.apply([]*clientv3.Event{del(k.Node("n"))}, now) {
		t.Error("a node that left is no change")
	}
	if st, _ := v.state(now, policy.Config{}); len(st.Nodes) != 0 {
		t.Errorf("nodes %+v after the node left", st.Nodes)
	}
	// A malformed update keeps the last good value.
	rev++
	bad := &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(k.Spec("b", "j")), Value: []byte("{oops"), CreateRevision: 3, ModRevision: rev}}
	v.apply([]*clientv3.Event{bad}, now)
	if got := jobs(); !slices.Equal(got, []string{"b/j"}) {
		t.Errorf("after a malformed update: jobs %v, want b/j kept", got)
	}
}

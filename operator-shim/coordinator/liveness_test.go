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
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// nodeCounts: which node records the engine sees.
func TestNodeCountsRules(t *testing.T) {
	for _, tc := range []struct {
		rule     string
		liveness string
		alive    bool
		want     bool
	}{
		{"a record on its lease alone counts (older agents, hand-written records)", "", false, true},
		{"a record on its lease alone ignores a stray alive key", "", true, true},
		{"a record declaring an alive key counts while the key exists", devices.LivenessAliveKey, true, true},
		{"a record declaring an alive key does not count without it, whoever keeps its lease alive", devices.LivenessAliveKey, false, false},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := nodeCounts(tc.liveness, tc.alive); got != tc.want {
				t.Errorf("nodeCounts(liveness %q, alive %v) = %v, want %v", tc.liveness, tc.alive, got, tc.want)
			}
		})
	}
}

// The view leaves out a node whose declared alive key goes (and marks its
// record for deletion, by the lease it saw), takes it back when the key
// returns, and treats records without the declaration as before.
func TestViewFollowsAliveKeys(t *testing.T) {
	k := fleet.NewKeys("")
	v := newView(k, slog.New(slog.NewTextHandler(io.Discard, nil)))
	aliveKV := &mvccpb.KeyValue{Key: []byte(k.Alive("a")), Value: []byte("a"), Lease: 99}
	rec := func(node, liveness string, lease int64) *mvccpb.KeyValue {
		b, _ := json.Marshal(devices.Inventory{Node: node, Flavor: devices.FlavorCPU, State: devices.StateReady, Liveness: liveness})
		return &mvccpb.KeyValue{Key: []byte(k.Node(node)), Value: b, Lease: lease}
	}
	// Loaded: a declares its key and has it; b declares it and lacks it;
	// c is an older agent's record.
	v.load(context.TODO(), nil, &fleet.CoordinatorSnapshot{Rev: 1, Alive: []*mvccpb.KeyValue{aliveKV},
		Nodes: []*mvccpb.KeyValue{rec("a", devices.LivenessAliveKey, 1), rec("b", devices.LivenessAliveKey, 2), rec("c", "", 3)}}, time.Now())
	nodes := func() []string {
		st, _ := v.state(time.Now(), policy.Config{})
		var out []string
		for _, n := range st.Nodes {
			out = append(out, n.Name)
		}
		return out
	}
	if got := nodes(); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("loaded: nodes %v, want a and c (b's alive key is missing)", got)
	}
	if want := map[string]int64{"b": 2}; !mapsEqual(v.dead, want) {
		t.Errorf("dead %v, want %v", v.dead, want)
	}
	delete(v.dead, "b")
	ev := func(typ mvccpb.Event_EventType, kv *mvccpb.KeyValue) []*clientv3.Event {
		return []*clientv3.Event{{Type: typ, Kv: kv}}
	}
	if !v.apply(ev(mvccpb.DELETE, &mvccpb.KeyValue{Key: aliveKV.Key}), time.Now()) {
		t.Error("a's alive key going is no change")
	}
	if got := nodes(); !slices.Equal(got, []string{"c"}) {
		t.Errorf("a's alive key gone: nodes %v, want c", got)
	}
	if want := map[string]int64{"a": 1}; !mapsEqual(v.dead, want) {
		t.Errorf("dead %v, want %v", v.dead, want)
	}
	// a registers again: the alive key and a record under a new lease.
	v.apply(append(ev(mvccpb.PUT, aliveKV), ev(mvccpb.PUT, rec("a", devices.LivenessAliveKey, 4))...), time.Now())
	if got := nodes(); !slices.Equal(got, []string{"a", "c"}) || len(v.dead) != 0 {
		t.Errorf("a back: nodes %v, dead %v", got, v.dead)
	}
	// An alive key of a node on its lease alone changes nothing.
	if v.apply(ev(mvccpb.PUT, &mvccpb.KeyValue{Key: []byte(k.Alive("c")), Lease: 5}), time.Now()) {
		t.Error("c's stray alive key is a change")
	}
	if v.apply(ev(mvccpb.DELETE, &mvccpb.KeyValue{Key: []byte(k.Alive("c"))}), time.Now()) || len(v.dead) != 0 {
		t.Errorf("c's stray alive key going is a change (dead %v)", v.dead)
	}
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		if y, ok := b[k]; !ok || x != y {
			return false
		}
	}
	return true
}

// waitFor polls cond until it holds or within passes; it returns how long
// it took.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return testutil.Eventually(t, within, what, testutil.True(cond))
}

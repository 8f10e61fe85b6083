package coordinator

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// The view reads names from keys through the layout owner's parsers: a
// node's inventory counts only at its own key, so a record under another
// node's key, an extra segment or a ".." names no node the engine sees.
func TestViewTakesNodesOnlyFromTheirOwnKeys(t *testing.T) {
	k := fleet.NewKeys("")
	inv := func(node string) []byte {
		b, _ := json.Marshal(devices.Inventory{Node: node, Flavor: devices.FlavorCPU, State: devices.StateReady})
		return b
	}
	for _, tc := range []struct {
		rule  string
		key   string
		names string // the node the record names
		want  bool   // the engine sees n1
	}{
		{rule: "an inventory at its node's key counts", key: k.Node("n1"), names: "n1", want: true},
		{rule: "an inventory naming another node than its key is ignored", key: k.Node("evil"), names: "n1"},
		{rule: "a key with an extra segment names no node", key: k.Node("n1") + "/x", names: "n1"},
		{rule: "a dot-dot key names no node", key: k.NodesPrefix() + "..", names: "n1"},
		{rule: "a key under another prefix names no node", key: fleet.NewKeys("/other").Node("n1"), names: "n1"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			sees := func(v *view) bool {
				st, _ := v.state(time.Now(), policy.Config{})
				for _, n := range st.Nodes {
					if n.Name == "n1" {
						return true
					}
				}
				return false
			}
			kv := &mvccpb.KeyValue{Key: []byte(tc.key), Value: inv(tc.names), Lease: 7, CreateRevision: 2, ModRevision: 2}
			// Read at start-up, and from the watch.
			loaded := newView(k, slog.New(slog.NewTextHandler(io.Discard, nil)))
			loaded.load(context.Background(), nil, &fleet.CoordinatorSnapshot{Rev: 2, Nodes: []*mvccpb.KeyValue{kv}}, time.Now())
			if got := sees(loaded); got != tc.want {
				t.Errorf("loaded: the engine sees n1: %v, want %v", got, tc.want)
			}
			watched := newView(k, slog.New(slog.NewTextHandler(io.Discard, nil)))
			watched.load(context.Background(), nil, &fleet.CoordinatorSnapshot{Rev: 1}, time.Now())
			watched.apply([]*clientv3.Event{{Type: clientv3.EventTypePut, Kv: kv}}, time.Now())
			if got := sees(watched); got != tc.want {
				t.Errorf("watched: the engine sees n1: %v, want %v", got, tc.want)
			}
		})
	}
}

package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

func TestEtcdDataLost(t *testing.T) {
	seen := fleet.EtcdView{ClusterID: 7, Revision: 100, Epoch: "e1", EpochKnown: true}
	for _, tc := range []struct {
		rule        string
		before, now fleet.EtcdView
		want        string
	}{
		{"first view: nothing remembered", fleet.EtcdView{}, fleet.EtcdView{ClusterID: 7, Revision: 3}, fleet.LossNone},
		{"same cluster, same epoch, revision moved on", seen, fleet.EtcdView{ClusterID: 7, Revision: 180, Epoch: "e1", EpochKnown: true}, fleet.LossNone},
		{"same revision is no loss", seen, seen, fleet.LossNone},
		{"another cluster id: a new cluster", seen, fleet.EtcdView{ClusterID: 8, Revision: 500, Epoch: "e1", EpochKnown: true}, fleet.LossClusterChanged},
		{"another epoch: wiped and a coordinator wrote a new one", seen, fleet.EtcdView{ClusterID: 7, Revision: 900, Epoch: "e2", EpochKnown: true}, fleet.LossEpochChanged},
		{"epoch gone: wiped, no coordinator yet", seen, fleet.EtcdView{ClusterID: 7, Revision: 400, EpochKnown: true}, fleet.LossEpochGone},
		{"revision went backwards: wiped or an older snapshot restored", seen, fleet.EtcdView{ClusterID: 7, Revision: 40, Epoch: "e1", EpochKnown: true}, fleet.LossRevisionBackward},
		{"epoch unreadable now: the revision alone decides (no loss)", seen, fleet.EtcdView{ClusterID: 7, Revision: 120}, fleet.LossNone},
		{"epoch unreadable now: the revision alone decides (loss)", seen, fleet.EtcdView{ClusterID: 7, Revision: 20}, fleet.LossRevisionBackward},
		{"no epoch remembered (no coordinator then): a new one is no loss", fleet.EtcdView{ClusterID: 7, Revision: 50, EpochKnown: true}, fleet.EtcdView{ClusterID: 7, Revision: 60, Epoch: "e1", EpochKnown: true}, fleet.LossNone},
		{"cluster id unknown (0) is not compared", seen, fleet.EtcdView{Revision: 150, Epoch: "e1", EpochKnown: true}, fleet.LossNone},
	} {
		if got := fleet.EtcdDataLost(tc.before, tc.now); got != tc.want {
			t.Errorf("%s: EtcdDataLost = %q, want %q", tc.rule, got, tc.want)
		}
	}
}

func TestEtcdViewLater(t *testing.T) {
	before := fleet.EtcdView{ClusterID: 7, Revision: 100, Epoch: "e1", EpochKnown: true}
	// A lagging read (a lower revision judged no loss is impossible, but
	// an unreadable epoch is not): the remembered epoch and revision stay.
	got := before.Later(fleet.EtcdView{ClusterID: 7, Revision: 90})
	if got.Revision != 100 || got.Epoch != "e1" || !got.EpochKnown {
		t.Errorf("Later kept %+v, want revision 100 and epoch e1", got)
	}
	got = fleet.EtcdView{ClusterID: 7, Revision: 10, EpochKnown: true}.Later(fleet.EtcdView{ClusterID: 7, Revision: 20, Epoch: "e9", EpochKnown: true})
	if got.Epoch != "e9" || got.Revision != 20 {
		t.Errorf("Later = %+v, want the first epoch seen, e9, at 20", got)
	}
}

// The coordinator writes the epoch once: a second call returns the same
// record, and ObserveEtcd sees it with etcd's cluster id and revision.
func TestEnsureEpochWritesOnce(t *testing.T) {
	_, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v0, err := st.ObserveEtcd(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v0.Epoch != "" || !v0.EpochKnown {
		t.Fatalf("before any coordinator: %+v, want no epoch", v0)
	}
	e1, created, err := st.EnsureEpoch(ctx)
	if err != nil || !created || e1.ID == "" {
		t.Fatalf("EnsureEpoch = %+v, %v, %v; want a new epoch", e1, created, err)
	}
	e2, created, err := st.EnsureEpoch(ctx)
	if err != nil || created || e2.ID != e1.ID {
		t.Fatalf("second EnsureEpoch = %+v, %v, %v; want %s kept", e2, created, err, e1.ID)
	}
	v1, err := st.ObserveEtcd(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v1.Epoch != e1.ID || v1.ClusterID == 0 || v1.Revision <= v0.Revision {
		t.Errorf("ObserveEtcd = %+v, want epoch %s, a cluster id and a revision past %d", v1, e1.ID, v0.Revision)
	}
	if loss := fleet.EtcdDataLost(v0.Later(v1), v1); loss != fleet.LossNone {
		t.Errorf("the epoch's creation judged a loss: %s", loss)
	}
}

package elastic

import (
	"testing"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

func TestDataLost(t *testing.T) {
	seen := wipeState{etcd: fleet.EtcdView{ClusterID: 7, Revision: 500, Epoch: "e1", EpochKnown: true}, round: 4, checkpointRev: 40}
	same := fleet.EtcdView{ClusterID: 7, Revision: 520, Epoch: "e1", EpochKnown: true}
	for _, tc := range []struct {
		name, want string
		v          wipeView
	}{
		{"first round: nothing to compare", ruleWipeNone, wipeView{Etcd: fleet.EtcdView{ClusterID: 7, Revision: 3}, Round: 1}},
		{"the next round, records kept: no loss", ruleWipeNone, wipeView{Before: seen, Etcd: same, Round: 5, CheckpointRev: 40}},
		{"the same round again (a rejoin before the closer moved on): no loss", ruleWipeNone, wipeView{Before: seen, Etcd: same, Round: 4, CheckpointRev: 40}},
		{"wiped: the epoch is gone", ruleWipeEtcdPrefix + fleet.LossEpochGone, wipeView{Before: seen, Etcd: fleet.EtcdView{ClusterID: 7, Revision: 30, EpochKnown: true}, Round: 1}},
		{"restored from an older snapshot: the revision went back", ruleWipeEtcdPrefix + fleet.LossRevisionBackward, wipeView{Before: seen, Etcd: fleet.EtcdView{ClusterID: 7, Revision: 300, Epoch: "e1", EpochKnown: true}, Round: 5, CheckpointRev: 40}},
		{"wiped, a new epoch written since", ruleWipeEtcdPrefix + fleet.LossEpochChanged, wipeView{Before: seen, Etcd: fleet.EtcdView{ClusterID: 7, Revision: 900, Epoch: "e2", EpochKnown: true}, Round: 5, CheckpointRev: 40}},
		{"another cluster", ruleWipeEtcdPrefix + fleet.LossClusterChanged, wipeView{Before: seen, Etcd: fleet.EtcdView{ClusterID: 8, Revision: 900, Epoch: "e1", EpochKnown: true}, Round: 5, CheckpointRev: 40}},
		{"the job's rounds started over", ruleWipeRoundBackwards, wipeView{Before: seen, Etcd: same, Round: 1, CheckpointRev: 40}},
		{"the checkpoint record vanished", ruleWipeCheckpointGone, wipeView{Before: seen, Etcd: same, Round: 5}},
		{"the checkpoint record was created again (a late commit into the wiped etcd)", ruleWipeCheckpointNew, wipeView{Before: seen, Etcd: same, Round: 5, CheckpointRev: 12}},
		{"no checkpoint seen before: any record is new", ruleWipeNone, wipeView{Before: wipeState{etcd: same, round: 4}, Etcd: same, Round: 5, CheckpointRev: 12}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if rule, detail := dataLost(tc.v); rule != tc.want {
				t.Errorf("rule %q (%s), want %q", rule, detail, tc.want)
			}
		})
	}
}

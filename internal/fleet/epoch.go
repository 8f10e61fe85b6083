package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Epoch is the fleet's epoch record (Keys.Epoch): a random id the
// coordinator writes once, when the key is absent. etcd keeps it for as
// long as it keeps its data, so a different epoch (or none) seen by a
// component that remembers one means etcd lost its data: a wipe of its
// data directory, or a new cluster (docs/disaster-recovery.md).
type Epoch struct {
	ID      string    `json:"id"`
	Created time.Time `json:"created"`
}

// NewEpoch returns a fresh epoch created at now.
func NewEpoch(now time.Time) (Epoch, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Epoch{}, fmt.Errorf("random epoch id: %w", err)
	}
	return Epoch{ID: hex.EncodeToString(b[:]), Created: now.UTC()}, nil
}

// EnsureEpoch writes a fresh epoch record unless one exists, and returns
// the record etcd holds afterwards and whether this call created it.
func (s *Store) EnsureEpoch(ctx context.Context) (e Epoch, created bool, err error) {
	fresh, err := NewEpoch(time.Now())
	if err != nil {
		return Epoch{}, false, err
	}
	key := s.Keys.Epoch()
	op, err := putOp(key, fresh)
	if err != nil {
		return Epoch{}, false, err
	}
	r, err := s.Cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(op).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return Epoch{}, false, fmt.Errorf("write %s: %w", key, err)
	}
	if r.Succeeded {
		return fresh, true, nil
	}
	kvs := r.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Epoch{}, false, fmt.Errorf("read %s: deleted while written", key)
	}
	if err := json.Unmarshal(kvs[0].Value, &e); err != nil || e.ID == "" {
		return Epoch{}, false, fmt.Errorf("malformed epoch record at %s: %q", key, ClipKey(kvs[0].Value))
	}
	return e, false, nil
}

// EtcdView is what a component saw of etcd at one moment: its cluster id,
// the store's revision (from a linearizable read) and the fleet's epoch
// ("" when the record is absent or could not be read).
type EtcdView struct {
	ClusterID uint64
	Revision  int64
	Epoch     string
	// EpochKnown is false when the epoch could not be read (not
	// permitted, malformed): then the epoch is not compared.
	EpochKnown bool
}

// ObserveEtcd reads the epoch record (every role may read coordinator/)
// with a linearizable read and returns what it saw. A malformed record
// leaves EpochKnown false; an unreachable etcd is an error.
func (s *Store) ObserveEtcd(ctx context.Context) (EtcdView, error) {
	key := s.Keys.Epoch()
	r, err := s.Cli.Get(ctx, key)
	if err != nil {
		return EtcdView{}, fmt.Errorf("read %s: %w", key, err)
	}
	v := EtcdView{ClusterID: r.Header.ClusterId, Revision: r.Header.Revision, EpochKnown: true}
	if len(r.Kvs) > 0 {
		var e Epoch
		if json.Unmarshal(r.Kvs[0].Value, &e) != nil || e.ID == "" {
			v.EpochKnown = false
		} else {
			v.Epoch = e.ID
		}
	}
	return v, nil
}

// DataLoss rules: why EtcdDataLost says etcd lost its data ("" when it
// did not).
const (
	LossNone             = ""
	LossClusterChanged   = "cluster-id-changed"
	LossEpochChanged     = "epoch-changed"
	LossEpochGone        = "epoch-gone"
	LossRevisionBackward = "revision-went-backwards"
)

// JobRecordsLost begins the error a hyperpodrun exits with when its wipe
// guard finds that etcd lost its job's records: the node agent that ran it
// knows by it that the exit is the data loss, not a node failure to
// restart into the emptied etcd.
const JobRecordsLost = "etcd lost this job's records"

// EtcdDataLost decides from what a component remembers of etcd (before:
// the view it registered under, its Revision the highest it saw) and what
// it sees now whether etcd lost its data since, and by which rule:
//   - nothing remembered (Revision 0): no loss, the first view;
//   - another cluster id: a new cluster;
//   - the epoch remembered, now another one: wiped, and the coordinator
//     already wrote a new epoch;
//   - the epoch remembered, now none: wiped, no new epoch yet;
//   - the revision lower than one seen before: a wipe, or a restore of an
//     older snapshot (which keeps the epoch).
//
// Views whose epoch is unknown compare on the cluster id and revision only.
func EtcdDataLost(before, now EtcdView) string {
	switch {
	case before.Revision == 0:
		return LossNone
	case before.ClusterID != 0 && now.ClusterID != 0 && before.ClusterID != now.ClusterID:
		return LossClusterChanged
	case before.EpochKnown && now.EpochKnown && before.Epoch != "" && now.Epoch != "" && before.Epoch != now.Epoch:
		return LossEpochChanged
	case before.EpochKnown && now.EpochKnown && before.Epoch != "" && now.Epoch == "":
		return LossEpochGone
	case now.Revision < before.Revision:
		return LossRevisionBackward
	}
	return LossNone
}

// Later is the view to remember after now was seen and judged no loss:
// now's epoch (once known) and the higher of the two revisions.
func (before EtcdView) Later(now EtcdView) EtcdView {
	out := now
	out.Revision = max(before.Revision, now.Revision)
	if !now.EpochKnown || now.Epoch == "" {
		out.Epoch, out.EpochKnown = before.Epoch, before.EpochKnown
	}
	if out.ClusterID == 0 {
		out.ClusterID = before.ClusterID
	}
	return out
}

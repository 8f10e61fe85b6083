package coordinator

import (
	"context"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// checkEtcd runs at each election: it writes the fleet's epoch record if
// etcd has none (the first coordinator, or etcd lost its data) and
// compares what etcd looks like now with what this coordinator saw before
// (fleet.EtcdDataLost). On a loss it says so at error level and forgets
// what it remembered of the lost data (the jobs' uids and credentials,
// the revisions kept for compaction); the view is read afresh by every
// election anyway. The node agents find the loss on their own and stop
// the jobs they ran (docs/disaster-recovery.md).
func (c *Coordinator) checkEtcd(ctx context.Context) {
	ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e, created, err := c.store.EnsureEpoch(ectx)
	if err != nil {
		c.log.Warn("cannot write or read the fleet's epoch record", "err", err)
	} else if created {
		c.log.Info("wrote the fleet's epoch record: etcd had none (a new fleet, or etcd lost its data)", "epoch", e.ID)
	}
	now, err := c.store.ObserveEtcd(ectx)
	if err != nil {
		c.log.Warn("cannot read etcd's identity", "err", err)
		return
	}
	before := c.etcdSeen
	rule := fleet.EtcdDataLost(before, now)
	if rule == fleet.LossNone {
		c.etcdSeen = before.Later(now)
		return
	}
	c.log.Error("etcd lost its data (wiped, replaced, or restored from an older snapshot): the jobs of before are gone from the control plane; "+
		"the node agents stop what they ran and register their nodes free; resubmit the jobs (docs/disaster-recovery.md)",
		"rule", rule, "epoch_before", before.Epoch, "epoch_now", now.Epoch, "revision_before", before.Revision, "revision_now", now.Revision)
	c.etcdSeen = now
	c.uids, c.minted, c.creds, c.ignored, c.problems = nil, nil, nil, nil, nil
	c.revs, c.compacted = nil, 0
}

// sawRev raises the highest revision this coordinator saw of etcd.
func (c *Coordinator) sawRev(rev int64) {
	if c.etcdSeen.Revision != 0 && rev > c.etcdSeen.Revision {
		c.etcdSeen.Revision = rev
	}
}

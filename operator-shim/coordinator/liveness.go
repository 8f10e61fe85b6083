package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// reapTimeout bounds the deletion of one dead node's record.
const reapTimeout = 5 * time.Second

// reapDead deletes the record of every node whose record declares an
// alive key that is gone (view.dead), and revokes the record's lease, so
// that what users read (elasticctl get nodes) agrees with what the
// engine already left out: a dead agent's record stays as long as anyone
// sends keepalives for its lease, which every reader of the record can.
// The deletion is guarded: the alive key is still absent and the record
// still under the lease the view saw, so a node that registered again
// meanwhile keeps its new record.
func (c *Coordinator) reapDead(ctx context.Context) {
	v := c.view
	if v == nil {
		return
	}
	for node, lease := range v.dead {
		delete(v.dead, node) // the next change of its keys brings it back if need be
		if err := c.reapNode(ctx, node, lease); err != nil && ctx.Err() == nil {
			c.log.Warn("cannot delete a dead node's record; the engine already leaves it out", "node", node, "err", err)
		}
	}
}

func (c *Coordinator) reapNode(ctx context.Context, node string, lease int64) error {
	k := c.store.Keys
	key := k.Node(node)
	ctx, cancel := context.WithTimeout(ctx, reapTimeout)
	defer cancel()
	r, err := c.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.Version(k.Alive(node)), "=", 0),
		clientv3.Compare(clientv3.LeaseValue(key), "=", lease),
	).Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	if !r.Succeeded {
		return nil // alive again, or registered anew: its own events follow
	}
	c.log.Warn("node's alive key is gone: its record is deleted, whoever keeps its lease alive", "node", node,
		"lease", fmt.Sprintf("%x", lease))
	if lease == 0 {
		return nil
	}
	if _, err := c.cli.Revoke(ctx, clientv3.LeaseID(lease)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoke the dead record's lease %x: %w", lease, err)
	}
	return nil
}

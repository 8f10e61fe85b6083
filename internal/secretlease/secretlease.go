// Package secretlease grants etcd leases whose ids are random and chosen
// by the client.
//
// etcd checks no permission on LeaseKeepAlive: any authenticated user who
// knows a lease id can keep that lease alive. The ids etcd picks itself are
// sequential (the member id's low bits, a timestamp and a counter), so one
// lease id of one's own predicts every other; and every read of a key
// returns the id of the lease it is attached to (KeyValue.Lease). A lease
// granted here has a random 63-bit id that etcd never returns to anyone but
// the granting client: as long as no key readable by others is attached to
// it, only its holder (and whoever may read the keys attached to it) can
// keep it alive. Keep it alive and revoke it with the ordinary clientv3
// calls (Lease.KeepAlive, Lease.Revoke, concurrency.WithLease).
package secretlease

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxTries bounds the grants tried when a random id is taken: with 2^63
// ids, a collision is already a once-in-a-lifetime event.
const maxTries = 8

// Grant grants a lease of ttl seconds with a random id (never 0) and
// returns it. The request goes over cli's connection with cli's
// credentials, like cli.Grant. An id that happens to be taken is retried
// with another.
func Grant(ctx context.Context, cli *clientv3.Client, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	return grant(ctx, clientv3.RetryLeaseClient(cli), ttl, RandomID)
}

// grant is Grant with the lease client and the id source as parameters.
func grant(ctx context.Context, lc pb.LeaseClient, ttl int64, newID func() (clientv3.LeaseID, error)) (*clientv3.LeaseGrantResponse, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("secretlease: TTL %d: must be positive", ttl)
	}
	var lastErr error
	for range maxTries {
		id, err := newID()
		if err != nil {
			return nil, fmt.Errorf("secretlease: pick a lease id: %w", err)
		}
		resp, err := lc.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: ttl, ID: int64(id)})
		if err == nil && resp.Error != "" {
			err = errors.New(resp.Error)
		}
		if err != nil {
			if errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseExist) {
				lastErr = err
				continue
			}
			return nil, fmt.Errorf("secretlease: grant a %ds lease: %w", ttl, clientv3.ContextError(ctx, rpctypes.Error(err)))
		}
		if resp.ID != int64(id) {
			// An etcd that ignored the requested id chose one itself:
			// sequential, hence guessable. Never use it.
			revokeQuietly(ctx, lc, resp.ID)
			return nil, fmt.Errorf("secretlease: etcd granted lease %x instead of the requested id; it does not honour client-chosen lease ids", resp.ID)
		}
		return &clientv3.LeaseGrantResponse{ResponseHeader: resp.Header, ID: clientv3.LeaseID(resp.ID), TTL: resp.TTL}, nil
	}
	return nil, fmt.Errorf("secretlease: %d random lease ids in a row were taken: %w", maxTries, lastErr)
}

func revokeQuietly(ctx context.Context, lc pb.LeaseClient, id int64) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_, _ = lc.LeaseRevoke(rctx, &pb.LeaseRevokeRequest{ID: id})
}

// RandomID returns a uniformly random positive 63-bit lease id.
func RandomID() (clientv3.LeaseID, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, err
		}
		if id := int64(binary.BigEndian.Uint64(b[:]) >> 1); id != 0 {
			return clientv3.LeaseID(id), nil
		}
	}
}

package secretlease

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
)

// authEtcd starts an embedded etcd with auth on and two users: "u" may
// read and write /a/, "v" may read and write /b/. It returns their clients.
func authEtcd(t *testing.T) (u, v *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := etcdembed.Start(ctx, etcdembed.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	admin, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(admin.UserAdd(ctx, "root", "rootpw"))
	must(admin.UserGrantRole(ctx, "root", "root"))
	for user, prefix := range map[string]string{"u": "/a/", "v": "/b/"} {
		must(admin.RoleAdd(ctx, user))
		must(admin.RoleGrantPermission(ctx, user, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite)))
		must(admin.UserAdd(ctx, user, user+"pw"))
		must(admin.UserGrantRole(ctx, user, user))
	}
	must(admin.AuthEnable(ctx))
	as := func(user string) *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
			Username: user, Password: user + "pw"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return as("u"), as("v")
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A secret lease works like any other: keys live under it, keepalives and
// revocation go through the ordinary client calls.
func TestSecretLeaseHoldsKeysAndIsKeptAliveAndRevokedByTheOrdinaryClient(t *testing.T) {
	u, _ := authEtcd(t)
	ctx := testCtx(t)
	g, err := Grant(ctx, u, 5)
	if err != nil {
		t.Fatal(err)
	}
	if g.ID <= 0 || g.TTL != 5 {
		t.Fatalf("granted %+v", g)
	}
	if _, err := u.Put(ctx, "/a/k", "v", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	r, err := u.Get(ctx, "/a/k")
	if err != nil || len(r.Kvs) != 1 || r.Kvs[0].Lease != int64(g.ID) {
		t.Fatalf("key under the secret lease: %v %v", r, err)
	}
	if ka, err := u.KeepAliveOnce(ctx, g.ID); err != nil || ka.TTL != 5 {
		t.Fatalf("keepalive of the secret lease: %+v %v", ka, err)
	}
	if _, err := u.Revoke(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	if r, err := u.Get(ctx, "/a/k"); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("the key outlived its revoked lease: %v %v", r, err)
	}
}

// A user's own lease ids, which etcd picks, say nothing about a secret
// one: etcd's are sequential, the secret ones are not within a million of
// them nor of each other.
func TestSecretIDsAreNotNearTheIDsEtcdPicks(t *testing.T) {
	u, v := authEtcd(t)
	ctx := testCtx(t)
	var server, secret []int64
	for range 5 {
		g, err := v.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		server = append(server, int64(g.ID))
		s, err := Grant(ctx, u, 60)
		if err != nil {
			t.Fatal(err)
		}
		secret = append(secret, int64(s.ID))
	}
	// etcd's own ids follow each other: one predicts the next.
	for i := 1; i < len(server); i++ {
		if d := server[i] - server[i-1]; d <= 0 || d > 1e6 {
			t.Logf("etcd's lease ids are not sequential here: %x then %x", server[i-1], server[i])
		}
	}
	for i, s := range secret {
		for _, o := range append(append([]int64{}, server...), secret[:i]...) {
			if d := s - o; d > -1e6 && d < 1e6 {
				t.Errorf("secret lease id %x is within 1e6 of lease id %x", s, o)
			}
		}
	}
}

// An id that is taken is skipped for another random one.
func TestGrantRetriesATakenID(t *testing.T) {
	u, _ := authEtcd(t)
	ctx := testCtx(t)
	taken, err := Grant(ctx, u, 60)
	if err != nil {
		t.Fatal(err)
	}
	ids := []clientv3.LeaseID{taken.ID}
	calls := 0
	next := func() (clientv3.LeaseID, error) {
		calls++
		if len(ids) > 0 {
			id := ids[0]
			ids = ids[1:]
			return id, nil
		}
		return RandomID()
	}
	g, err := grant(ctx, clientv3.RetryLeaseClient(u), 60, next)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 || g.ID == taken.ID {
		t.Fatalf("granted %x after %d ids; the taken one was %x", g.ID, calls, taken.ID)
	}
	// Always taken: the grant gives up, saying why.
	_, err = grant(ctx, clientv3.RetryLeaseClient(u), 60, func() (clientv3.LeaseID, error) { return taken.ID, nil })
	if err == nil || !errors.Is(rpctypes.Error(errors.Unwrap(err)), rpctypes.ErrLeaseExist) {
		t.Fatalf("always-taken id: %v", err)
	}
}

// The raw lease client Grant uses carries the client's credentials: a
// revoke through it, which etcd checks against the permissions of the
// user on the lease's keys, succeeds for the key's writer only.
func TestTheRawLeaseClientCarriesTheUsersToken(t *testing.T) {
	u, v := authEtcd(t)
	ctx := testCtx(t)
	g, err := Grant(ctx, u, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.Put(ctx, "/a/k", "v", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Revoke(ctx, g.ID); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("v, who may not write /a/, revoked u's lease: %v", err)
	}
	if _, err := grantRevoke(ctx, u, g.ID); err != nil {
		t.Fatalf("u's revoke through the raw lease client: %v", err)
	}
}

func grantRevoke(ctx context.Context, cli *clientv3.Client, id clientv3.LeaseID) (any, error) {
	return clientv3.RetryLeaseClient(cli).LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: int64(id)})
}

func TestGrantRejectsANonPositiveTTL(t *testing.T) {
	u, _ := authEtcd(t)
	for _, ttl := range []int64{0, -1} {
		if _, err := Grant(testCtx(t), u, ttl); err == nil {
			t.Errorf("TTL %d granted", ttl)
		}
	}
}

// Package etcdtest starts an embedded etcd server and a client for a test,
// both closed when the test ends.
package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// Start returns a running embedded etcd and a client connected to it.
func Start(t testing.TB) (*etcdembed.Server, *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := etcdembed.Start(ctx, etcdembed.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := srv.Client()
	if err != nil {
		srv.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close(); srv.Close() })
	return srv, cli
}

// RegisterNode writes a node's inventory under a lease of its own, as a
// node agent does (an inventory without a lease is ignored). The lease
// lives until the test's etcd is closed.
func RegisterNode(t testing.TB, cli *clientv3.Client, inv api.Inventory) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	op, err := fleet.New(cli, "").PutNodeOp(inv, clientv3.WithLease(l.ID))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Do(ctx, op); err != nil {
		t.Fatal(err)
	}
}

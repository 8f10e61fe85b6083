// Package etcdtest starts an embedded etcd server and a client for a test,
// both closed when the test ends.
package etcdtest

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/tcpproxy"
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

// StartProxied is Start with the client behind a tcpproxy, which the test
// cuts (Proxy.Cut) to partition the client from etcd.
func StartProxied(t testing.TB) (*tcpproxy.Proxy, *clientv3.Client) {
	t.Helper()
	srv, _ := Start(t)
	p, err := tcpproxy.New(strings.TrimPrefix(srv.Endpoints[0], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + p.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close(); p.Close() })
	return p, cli
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

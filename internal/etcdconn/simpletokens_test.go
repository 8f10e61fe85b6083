package etcdconn

import (
	"context"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
)

// A daemon checks etcd's token kind once connected; if etcd goes away
// right then, the check gives up within its deadline instead of hanging
// the daemon's start (etcd's client waits for a connection forever on a
// context without one).
func TestSimpleTokensHasADeadline(t *testing.T) {
	srv, _ := etcdtest.Start(t)
	g := &gate{t: t, addr: "127.0.0.1:0", target: trimScheme(srv.Endpoints[0])}
	g.open()
	defer g.close()
	cli, err := Connect(context.Background(), Options{Endpoints: []string{g.addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	cli.Username, cli.Password = "hyperpod-agent", "secret" // as a daemon with auth on
	defer func(d time.Duration) { authCheckTimeout = d }(authCheckTimeout)
	authCheckTimeout = 500 * time.Millisecond
	g.close()
	done := make(chan error, 1)
	go func() {
		_, err := SimpleTokens(context.Background(), cli)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("SimpleTokens succeeded with etcd gone")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SimpleTokens still waiting 10 s after etcd went away: no deadline")
	}
}

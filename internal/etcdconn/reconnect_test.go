package etcdconn

import (
	"context"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
)

// gate is a TCP forwarder in front of a real etcd that can refuse every
// connection for a while, as a restarting etcd does: closed, its port
// refuses dials and every open connection is cut.
type gate struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
}

func (g *gate) open() {
	g.t.Helper()
	ln, err := net.Listen("tcp", g.addr)
	if err != nil {
		g.t.Fatalf("reopen %s: %v", g.addr, err)
	}
	g.addr = ln.Addr().String()
	g.mu.Lock()
	g.ln = ln
	g.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", g.target)
			if err != nil {
				c.Close()
				continue
			}
			g.mu.Lock()
			g.conns = append(g.conns, c, up)
			g.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ln.Close()
	for _, c := range g.conns {
		c.Close()
	}
	g.conns = nil
}

// After an etcd outage of half a minute a client of ours is back within
// seconds of etcd, not after gRPC's default reconnect backoff (which by
// then waits 10-17 s between dials, and grows to 120 s): a hyperpodrun
// that came back that late after a one-minute outage found that its peers
// had re-formed the job without it and trained to the end.
func TestReconnectsPromptlyAfterAnOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a 30 s outage")
	}
	outage := 30 * time.Second
	if v := os.Getenv("HYPERPODRUN_TEST_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		outage = d
	}
	srv, _ := etcdtest.Start(t)
	g := &gate{t: t, addr: "127.0.0.1:0", target: trimScheme(srv.Endpoints[0])}
	g.open()
	defer g.close()
	ctx := context.Background()
	cli, err := Connect(ctx, Options{Endpoints: []string{g.addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	get := func(d time.Duration) error {
		c, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		_, err := cli.Get(c, "probe")
		return err
	}
	if err := get(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The outage: requests keep coming (as a node's lease keepalives do)
	// and fail.
	g.close()
	end := time.Now().Add(outage)
	for time.Now().Before(end) {
		get(200 * time.Millisecond)
		time.Sleep(300 * time.Millisecond)
	}
	g.open()
	back := time.Now()
	// Within ReconnectBackoff's cap with its jitter, and slack for a
	// loaded machine; gRPC's default would wait up to 17 s more here.
	const within = 4 * time.Second
	for {
		if err := get(500 * time.Millisecond); err == nil {
			break
		} else if time.Since(back) > within {
			t.Fatalf("the client did not reach etcd within %s of its return after a %s outage: %v", within, outage, err)
		}
	}
	t.Logf("back %.2f s after etcd returned from a %s outage", time.Since(back).Seconds(), outage)
}

func trimScheme(u string) string {
	for _, p := range []string{"http://", "https://"} {
		if len(u) > len(p) && u[:len(p)] == p {
			return u[len(p):]
		}
	}
	return u
}

// Package etcdembed runs an in-process etcd server. hyperpodrun uses it for
// --standalone (no etcd to set up), the demo, and tests that need a real etcd.
package etcdembed

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Options tunes the embedded server. The zero value is a sensible default.
type Options struct {
	// Dir holds etcd's data. Empty means a fresh temporary directory that
	// Close removes.
	Dir string
	// UnsafeNoFsync skips fsync. Only for benchmarks and throwaway data.
	UnsafeNoFsync bool
	// StartTimeout bounds how long Start waits for the server to be ready
	// (default 30s).
	StartTimeout time.Duration
	// ClientAddr is the client listener's host:port (default
	// 127.0.0.1 on a free port): hyperpodrun's c10d backend serves the
	// rendezvous on --rdzv-endpoint's address.
	ClientAddr string
}

// Server is a running embedded etcd.
type Server struct {
	etcd    *embed.Etcd
	dir     string
	ownsDir bool
	// Endpoints are the client URLs, e.g. "http://127.0.0.1:41234".
	Endpoints []string
}

// Start launches an etcd server listening on free loopback ports.
func Start(ctx context.Context, opts Options) (*Server, error) {
	dir, owns := opts.Dir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "hyperpodrun-etcd-")
		if err != nil {
			return nil, fmt.Errorf("embedded etcd: create data dir: %w", err)
		}
		dir, owns = d, true
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Name = "embedded"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = opts.UnsafeNoFsync
	// bcrypt's cost only slows the guessing of weak passwords; the users
	// hyperpodrun creates (elasticctl auth bootstrap, per-job users) have
	// random 192-bit ones, and etcd's client authenticates again for every
	// watch stream it opens, so the lowest cost keeps auth cheap.
	cfg.BcryptCost = 4
	// Port 0: the kernel picks free ports; we read them back from the listeners.
	clientAddr := opts.ClientAddr
	if clientAddr == "" {
		clientAddr = "127.0.0.1:0"
	}
	cu, err := url.Parse("http://" + clientAddr)
	if err != nil {
		if owns {
			os.RemoveAll(dir)
		}
		return nil, fmt.Errorf("embedded etcd: client address %q: %w", clientAddr, err)
	}
	pu, _ := url.Parse("http://127.0.0.1:0")
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.ListenMetricsUrls = nil
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		if owns {
			os.RemoveAll(dir)
		}
		return nil, fmt.Errorf("embedded etcd: start: %w", err)
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(timeout):
		e.Close()
		if owns {
			os.RemoveAll(dir)
		}
		return nil, fmt.Errorf("embedded etcd: not ready after %s", timeout)
	case <-ctx.Done():
		e.Close()
		if owns {
			os.RemoveAll(dir)
		}
		return nil, fmt.Errorf("embedded etcd: %w", ctx.Err())
	}
	s := &Server{etcd: e, dir: dir, ownsDir: owns}
	for _, l := range e.Clients {
		s.Endpoints = append(s.Endpoints, "http://"+l.Addr().String())
	}
	if len(s.Endpoints) == 0 {
		s.Close()
		return nil, errors.New("embedded etcd: no client listener")
	}
	return s, nil
}

// Client returns a new client connected to the server. The caller closes it.
func (s *Server) Client() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   s.Endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: connect: %w", err)
	}
	return cli, nil
}

// Close stops the server and removes its data when Start created the dir.
func (s *Server) Close() {
	s.etcd.Close()
	<-s.etcd.Server.StopNotify()
	if s.ownsDir {
		os.RemoveAll(s.dir)
	}
}

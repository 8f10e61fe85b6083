// Package authfleet starts, for a test, an etcd with auth on and the
// fleet's users bootstrapped (etcdauth.BootstrapFleet), and connects as
// any of them. It is apart from etcdtest because etcdauth's own tests use
// etcdtest.
package authfleet

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// Fleet is an etcd with auth on and the users of a fleet's parties.
type Fleet struct {
	// Endpoint is the etcd's client URL.
	Endpoint string
	// Keys is the layout the users were bootstrapped for (no prefix).
	Keys fleet.Keys
	// PasswordDir holds each user's <user>.password.
	PasswordDir string
	t           testing.TB
}

// Start runs Debian's etcd when it is installed (real etcd, as CI has),
// else the embedded one, and bootstraps auth for parties. Everything is
// stopped when the test ends.
func Start(t testing.TB, parties etcdauth.Parties) *Fleet {
	t.Helper()
	f := &Fleet{Keys: fleet.NewKeys(""), PasswordDir: filepath.Join(t.TempDir(), "pw"), t: t}
	if bin, ok := etcdtest.DebianEtcd(); ok {
		f.Endpoint = etcdtest.StartBinary(t, bin)
	} else {
		t.Log("Debian's etcd is not installed: the embedded etcd stands in")
		srv, _ := etcdtest.Start(t)
		f.Endpoint = srv.Endpoints[0]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	boot, err := clientv3.New(clientv3.Config{Endpoints: []string{f.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer boot.Close()
	if _, err := etcdauth.BootstrapFleet(ctx, boot, f.Keys, parties, f.PasswordDir); err != nil {
		t.Fatal(err)
	}
	return f
}

// As returns a client connected as user (etcdauth.RootUser,
// etcdauth.NodeRole("node-a"), ...), closed when the test ends.
func (f *Fleet) As(user string) *clientv3.Client {
	f.t.Helper()
	pw, err := etcdconn.ReadPassword(filepath.Join(f.PasswordDir, user+".password"), "", "test")
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: []string{f.Endpoint}, User: user, Password: pw})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { c.Close() })
	return c
}

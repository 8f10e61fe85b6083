package etcdconn

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

func TestParseEndpoints(t *testing.T) {
	got, err := ParseEndpoints([]string{"h1:2379,https://h2:2380", " 10.0.0.1:1 ", "h3"}, "", "--etcd-endpoints")
	if err != nil {
		t.Fatal(err)
	}
	want := "http://h1:2379 https://h2:2380 http://10.0.0.1:1 http://h3:2379"
	if strings.Join(got, " ") != want {
		t.Fatalf("got %v want %s", got, want)
	}
	if got, _ := ParseEndpoints([]string{"h:1"}, "https", "--etcd-endpoints"); got[0] != "https://h:1" {
		t.Fatalf("scheme: %v", got)
	}
	if _, err := ParseEndpoints([]string{" , "}, "", "--rdzv-endpoint"); err == nil || !strings.Contains(err.Error(), "--rdzv-endpoint") {
		t.Fatalf("empty: %v", err)
	}
	if _, err := ParseEndpoints([]string{"ftp://h:1"}, "", "--etcd-endpoints"); err == nil {
		t.Fatal("ftp endpoint accepted")
	}
}

// Errors name the flags of whoever connects: elasticctl's users are told
// about --etcd-endpoints, hyperpodrun's about --rdzv-endpoint.
func TestErrorsNameTheCallersFlags(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	for _, tc := range []struct {
		flags     Flags
		want, not string
	}{
		{Flags{}, "check --etcd-endpoints", "--rdzv-endpoint"},
		{DaemonFlags, "check --etcd-endpoints", "--rdzv-endpoint"},
		{RdzvFlags, "check --rdzv-endpoint", "--etcd-endpoints"},
	} {
		cli, err := Connect(context.Background(), Options{Endpoints: []string{addr}, DialTimeout: 500 * time.Millisecond, Flags: tc.flags})
		if err == nil {
			cli.Close()
			t.Fatal("connected to a closed port")
		}
		if !strings.Contains(err.Error(), "cannot reach etcd at http://"+addr) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.not) {
			t.Errorf("flags %+v: %v; want %q and not %q", tc.flags, err, tc.want, tc.not)
		}
	}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Endpoints: []string{addr}, Cert: "c.pem"}, "--etcd-cert and --etcd-key go together"},
		{Options{Endpoints: []string{addr}, Cert: "c.pem", Flags: RdzvFlags}, "--rdzv-conf cert and --rdzv-conf key go together"},
		{Options{Endpoints: []string{addr}, CACert: "/no/such/ca.pem"}, "--etcd-cacert: stat /no/such/ca.pem"},
		{Options{Endpoints: []string{addr}, Password: "x"}, "password was given without a user"},
		{Options{Endpoints: []string{"ftp://x:1"}}, "--etcd-endpoints: bad etcd endpoint"},
	} {
		if err := tc.o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want %q", tc.o, err, tc.want)
		}
	}
}

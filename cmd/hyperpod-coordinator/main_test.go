package main

import (
	"strings"
	"testing"
)

// The coordinator takes the same --etcd-* flags and HYPERPOD_ETCD_*
// variables as the other commands, checked alike before it connects: a
// bad prefix or a missing CA file is a usage error (exit 2) naming the
// flag, not an attempt to reach etcd.
func TestEtcdFlagsCheckedBeforeConnecting(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{name: "relative prefix", args: []string{"--etcd-prefix", "nodes/"}, want: `--etcd-prefix "nodes/": want an absolute key prefix like /hyperpodrun`},
		{name: "prefix from the environment", env: map[string]string{"HYPERPOD_ETCD_PREFIX": "/fleet/"}, want: `--etcd-prefix "/fleet/": drop the trailing slash: /fleet`},
		{name: "CA from the environment", env: map[string]string{"HYPERPOD_ETCD_CACERT": "/no/such/ca.pem"}, want: "--etcd-cacert: stat /no/such/ca.pem"},
		{name: "bad endpoint", args: []string{"--etcd-endpoints", "ftp://etcd:2379"}, want: "--etcd-endpoints: bad etcd endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stderr strings.Builder
			code := run(append([]string{"hyperpod-coordinator", "--listen", ""}, tc.args...), &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, %q; want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
}

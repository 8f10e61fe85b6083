package main

import (
	"strings"
	"testing"
)

// The pod supervisor and the controller take the same --etcd-* flags and
// HYPERPOD_ETCD_* variables as the other commands, checked alike: a bad
// prefix is a usage error (exit 2) naming the flag, never a supervisor
// that watches the wrong keys.
func TestEtcdFlagsCheckedBeforeConnecting(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{name: "relative prefix", args: []string{"--etcd-prefix", "hyperpodrun"}, want: `--etcd-prefix "hyperpodrun": want an absolute key prefix like /hyperpodrun`},
		{name: "prefix from the environment", env: map[string]string{"HYPERPOD_ETCD_PREFIX": "/a//b"}, want: `--etcd-prefix "/a//b"`},
		{name: "CA from the environment", env: map[string]string{"HYPERPOD_ETCD_CACERT": "/no/such/ca.pem"}, want: "--etcd-cacert: stat /no/such/ca.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stderr strings.Builder
			args := append([]string{"hyperpod-kube-controller", "pod", "--job", "j", "--node", "n"}, tc.args...)
			code := run(append(args, "--", "true"), &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, %q; want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
}

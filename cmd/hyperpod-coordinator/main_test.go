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

// The coordinator sets Go's GC target from --gc-percent (200 by default:
// at fleet scale collections at 100 stretched decisions past 250 ms),
// unless the operator set $GOGC, which wins; a negative value is a usage
// error that names the fix.
func TestGCPercent(t *testing.T) {
	for _, tc := range []struct {
		rule string
		flag int
		env  string
		want int
		err  string
	}{
		{"the default sets 200", defaultGCPercent, "", 200, ""},
		{"$GOGC wins over the flag", 300, "50", 0, ""},
		{"$GOGC=off wins over the flag", 200, "off", 0, ""},
		{"0 leaves Go's default", 0, "", 0, ""},
		{"a negative value is a usage error", -1, "", 0, "set GOGC=off"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			got, err := gcPercent(tc.flag, tc.env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("gcPercent(%d, %q) = %d, %v; want %d", tc.flag, tc.env, got, err, tc.want)
			}
		})
	}
	var stderr strings.Builder
	if code := run([]string{"hyperpod-coordinator", "--listen", "", "--gc-percent", "-5"}, &stderr); code != 2 || !strings.Contains(stderr.String(), "--gc-percent -5") {
		t.Errorf("--gc-percent -5: exit %d, %q; want 2 and the flag named", code, stderr.String())
	}
}

// A duration out of its range is a usage error (exit 2) that names the
// flag and the range, before the coordinator connects.
func TestDurationFlagsChecked(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--idle-return-after", "10ms"}, "--idle-return-after 10ms: must be 0 (off) or at least 1s"},
		{[]string{"--idle-return-after", "-1s"}, "--idle-return-after -1s: must be 0 (off) or at least 1s"},
		{[]string{"--resync", "1ms"}, "--resync 1ms: must be between 100ms and 24h"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stderr strings.Builder
			code := run(append([]string{"hyperpod-coordinator", "--listen", ""}, tc.args...), &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, %q; want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
}

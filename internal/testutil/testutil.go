// Package testutil holds the helpers every package's tests share: waiting
// on a condition with a deadline (Eventually), free loopback ports, and
// the real parts a test needs but cannot always have: binaries a script
// builds and caches (CachedBinary), skipped without them except under $CI
// (SkipOrFail). An etcd for tests is package etcdtest; a kube-apiserver,
// kubetest.
//
// Negative timing assertions ("nothing restarts within 500 ms") are not
// made by sleeping: the code under test takes a clock
// (k8s.io/utils/clock), and the test steps a fake one
// (k8s.io/utils/clock/testing) past the interval and checks the state.
package testutil

import (
	"fmt"
	"net"
	"testing"
	"time"
)

// Poll is how often Eventually re-checks its condition.
const Poll = 10 * time.Millisecond

// Eventually waits until cond reports true, checking every Poll, and fails
// the test (naming what it waited for and cond's last word) when within
// passes first. cond's string says what it saw; it is only printed on
// failure. It returns how long the wait took.
func Eventually(t testing.TB, within time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(within)
	last := ""
	for {
		ok, seen := cond()
		if ok {
			return time.Since(start)
		}
		last = seen
		if time.Now().After(deadline) {
			if last != "" {
				t.Fatalf("timed out after %v waiting for %s (last seen: %s)", within, what, last)
			}
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(Poll)
	}
}

// True adapts a plain predicate for Eventually.
func True(cond func() bool) func() (bool, string) {
	return func() (bool, string) { return cond(), "" }
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := FreePortErr()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// FreePortErr is FreePort for code that has no testing.TB (benchmarks
// run as programs).
func FreePortErr() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

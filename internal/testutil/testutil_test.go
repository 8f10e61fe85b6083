package testutil

import (
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB whose Fatalf records instead of stopping.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(f string, a ...any) {
	r.msg = strings.TrimSpace(strings.ReplaceAll(f, "%", "")) // shape is enough
	panic(r)
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	n := 0
	Eventually(t, 5*time.Second, "three calls", True(func() bool { n++; return n >= 3 }))
	if n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}

func TestEventuallyFailsNamingWhatItSaw(t *testing.T) {
	r := &recorder{TB: t}
	func() {
		defer func() {
			if v := recover(); v != r {
				t.Fatalf("Eventually did not fail the test (recovered %v)", v)
			}
		}()
		Eventually(r, 30*time.Millisecond, "never", func() (bool, string) { return false, "still 0" })
	}()
	if !strings.Contains(r.msg, "waiting for") || !strings.Contains(r.msg, "last seen") {
		t.Fatalf("failure message %q names neither the wait nor what was seen", r.msg)
	}
}

func TestFreePortIsBindable(t *testing.T) {
	if p := FreePort(t); p <= 0 || p > 65535 {
		t.Fatalf("FreePort = %d", p)
	}
}

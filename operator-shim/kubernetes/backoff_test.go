package kubernetes

import (
	"testing"
	"time"
)

// A node whose pods keep failing gets its next pod after 1s, 2s, 4s ...
// at most 30s; a pod that ran a minute starts the count over.
func TestBackoffAfterFailures(t *testing.T) {
	now := t0
	c := &Controller{backoff: map[string]backoff{}, cfg: Config{Now: func() time.Time { return now }}}
	var got []time.Duration
	for range 7 {
		c.failed("j", "n", time.Second)
		busy, wait := c.busyNodes("j", now)
		if busy["n"] != "backoff" {
			t.Fatalf("node not held back: %v", busy)
		}
		got = append(got, wait)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
	for i, w := range want {
		if got[i] != w*time.Second {
			t.Fatalf("backoffs %v", got)
		}
	}
	if busy, _ := c.busyNodes("other", now); len(busy) != 0 {
		t.Errorf("another job is held back: %v", busy)
	}
	c.failed("j", "n", 2*time.Minute)
	if _, wait := c.busyNodes("j", now); wait != time.Second {
		t.Errorf("after a long run: %v", wait)
	}
	now = now.Add(time.Second)
	if busy, _ := c.busyNodes("j", now); len(busy) != 0 {
		t.Errorf("still held back after the backoff: %v", busy)
	}
}

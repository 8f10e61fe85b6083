package main

import (
	"testing"
	"time"
)

// The bench waits as long past the coordinator's last cycle as the
// coordinator's own --idle-return-after, however -coordinator-flags
// spells it.
func TestIdleReturnAfter(t *testing.T) {
	for _, tc := range []struct {
		flags string
		want  time.Duration
	}{
		{"", 30 * time.Second},
		{"--log-level=debug", 30 * time.Second},
		{"--idle-return-after=0", 0},
		{"--idle-return-after 10s --log-level=debug", 10 * time.Second},
		{"-idle-return-after=1m", time.Minute},
		{"--idle-return-after=bad", 30 * time.Second},
	} {
		if got := idleReturnAfter(tc.flags); got != tc.want {
			t.Errorf("idleReturnAfter(%q) = %s, want %s", tc.flags, got, tc.want)
		}
	}
}

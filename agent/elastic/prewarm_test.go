package elastic

import (
	"strings"
	"testing"
	"time"
)

// A node prewarms its workers before registering only where registering
// would interrupt training: in process, with prewarm on, while some node
// of the job runs workers; never when that cannot be read.
func TestShouldPrewarm(t *testing.T) {
	on := time.Minute
	for _, tc := range []struct {
		name string
		v    prewarmView
		want bool
		why  string
	}{
		{"restart path", prewarmView{InProcess: false, Timeout: on, RunningNodes: 2}, false, "no --inprocess-resize"},
		{"prewarm off", prewarmView{InProcess: true, Timeout: 0, RunningNodes: 2}, false, "is 0"},
		{"fresh job: first round", prewarmView{InProcess: true, Timeout: on, RunningNodes: 0}, false, "interrupts no one"},
		{"running nodes unknown", prewarmView{InProcess: true, Timeout: on, RunningNodes: -1}, false, "cannot tell"},
		{"joining a job that trains", prewarmView{InProcess: true, Timeout: on, RunningNodes: 2}, true, "2 node(s) train"},
		{"one node trains", prewarmView{InProcess: true, Timeout: time.Second, RunningNodes: 1}, true, "1 node(s) train"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := shouldPrewarm(tc.v)
			if got != tc.want || !strings.Contains(why, tc.why) {
				t.Errorf("shouldPrewarm(%+v) = %v, %q; want %v, containing %q", tc.v, got, why, tc.want, tc.why)
			}
		})
	}
}

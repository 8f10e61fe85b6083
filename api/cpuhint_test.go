package api

import (
	"strings"
	"testing"
)

// A job asking for no accelerator is told how CPU-only nodes count (one
// accelerator each, of flavor cpu); one asking for too many is not.
func TestPerNodeAcceleratorsErrorExplainsCPUNodes(t *testing.T) {
	for _, tc := range []struct {
		rule         string
		accelerators int
		cpuHint      bool
	}{
		{"none asked: explain CPU-only nodes", 0, true},
		{"negative: explain CPU-only nodes", -1, true},
		{"too many: only the bounds", MaxNodeAccelerators + 1, false},
	} {
		j := Job{Name: "cpu-job", Team: "research", MinNodes: 1, MaxNodes: 1, PerNode: Resources{Accelerators: tc.accelerators}}
		err := j.Validate(Config{})
		if err == nil || !strings.Contains(err.Error(), "perNode.accelerators: must be between 1 and 4096") {
			t.Fatalf("%s: %v", tc.rule, err)
		}
		if got := strings.Contains(err.Error(), "a CPU-only node (flavor cpu) counts as one accelerator"); got != tc.cpuHint {
			t.Errorf("%s: %v; CPU-only explanation %v, want %v", tc.rule, err, got, tc.cpuHint)
		}
	}
}

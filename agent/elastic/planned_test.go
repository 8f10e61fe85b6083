package elastic

import (
	"testing"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// The world size announced for a planned change whose round is not
// proposed yet is one the rendezvous can form: within the job's sizes.
func TestPlannedNodes(t *testing.T) {
	every := rendezvous.Config{MinNodes: 1, MaxNodes: 8}
	sizes := rendezvous.Config{MinNodes: 2, MaxNodes: 8, Sizes: []int{2, 4, 8}}
	step := rendezvous.Config{MinNodes: 2, MaxNodes: 8, Step: 3}
	for _, tc := range []struct {
		rule   string
		kind   control.EventKind
		nodes  int
		target int
		cfg    rendezvous.Config
		want   int
	}{
		{"a waiting node adds one", control.ScaleUp, 3, 0, every, 4},
		{"a waiting node at max stays at max", control.ScaleUp, 8, 0, every, 8},
		{"a drain takes one away", control.Drain, 3, 0, every, 2},
		{"a drain never goes below min", control.Drain, 1, 0, every, 1},
		{"a resize goes to the target", control.Resize, 3, 6, every, 6},
		{"a target above max is max", control.Resize, 3, 20, every, 8},
		{"a resize without a target keeps the size", control.Resize, 3, 0, every, 3},
		{"sizes: a waiting node at 2 means 4, the next allowed size", control.ScaleUp, 2, 0, sizes, 4},
		{"sizes: a drain at 4 means 2, never 3", control.Drain, 4, 0, sizes, 2},
		{"sizes: a target of 6 means 4", control.Resize, 4, 6, sizes, 4},
		{"sizes: a drain at the smallest size stays there", control.Drain, 2, 0, sizes, 2},
		{"step: a waiting node at 2 means 5", control.ScaleUp, 2, 0, step, 5},
		{"step: a drain at 8 means 5", control.Drain, 8, 0, step, 5},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := plannedNodes(tc.kind, tc.nodes, tc.target, tc.cfg); got != tc.want {
				t.Errorf("plannedNodes(%s, %d, target %d) = %d, want %d", tc.kind, tc.nodes, tc.target, got, tc.want)
			}
		})
	}
}

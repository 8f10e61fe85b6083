package fleet

import (
	"testing"

	"github.com/hyperpodrun/hyperpodrun/api"
)

func TestTookAwayRules(t *testing.T) {
	for _, tc := range []struct {
		rule string
		d    *Desired
		want bool
	}{
		{"no record: not the coordinator's", nil, false},
		{"still placed on the node: the node leaves on its own", &Desired{Allocation: api.Allocation{Size: 2, Nodes: []string{"a", "b"}}}, false},
		{"placed on other nodes only: taken away", &Desired{Allocation: api.Allocation{Size: 1, Nodes: []string{"b"}}}, true},
		{"stopped: taken away", &Desired{Allocation: api.Allocation{Nodes: []string{"a"}}, Stop: &Stop{Kind: StopPreemption}}, true},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := tc.d.TookAway("a"); got != tc.want {
				t.Errorf("TookAway(a) = %v, want %v", got, tc.want)
			}
		})
	}
}

package jobrunner

import (
	"slices"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// The rendezvous hears a job's allowed sizes (sizes or step) as the
// engine sees them, so a lost node never forms a round the engine would
// never allow.
func TestArgsCarryTheAllowedSizes(t *testing.T) {
	for _, tc := range []struct {
		rule string
		job  policy.Job
		want string
	}{
		{"sizes", policy.Job{Name: "j", Sizes: []int{2, 4}}, "prefix=/p,sizes=2:4"},
		{"step", policy.Job{Name: "j", MinNodes: 2, MaxNodes: 6, Step: 2, Elastic: true}, "prefix=/p,step=2"},
		{"every size", policy.Job{Name: "j", MinNodes: 2, MaxNodes: 6, Elastic: true}, "prefix=/p"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			args := Args(fleet.JobSpec{Job: tc.job, Run: fleet.RunSpec{Script: "t.py"}}, []string{"e:2379"}, "/p", "", "")
			i := slices.Index(args, "--rdzv-conf")
			if i < 0 || args[i+1] != tc.want {
				t.Fatalf("args %v: want --rdzv-conf %s", args, tc.want)
			}
		})
	}
}

package jobrunner

import (
	"slices"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// Issue 14: a job's run.inprocessResize becomes hyperpodrun's
// --inprocess-resize, before the script.
func TestArgsInProcessResize(t *testing.T) {
	spec := fleet.JobSpec{Job: policy.Job{Name: "j"}, Run: fleet.RunSpec{Script: "t.py", InProcessResize: true}}
	args := Args(spec, []string{"e:2379"}, "/p", "", "")
	i := slices.Index(args, "--inprocess-resize")
	if i < 0 || i > slices.Index(args, "t.py") {
		t.Errorf("args %v: want --inprocess-resize before the script", args)
	}
	spec.Run.InProcessResize = false
	if slices.Contains(Args(spec, []string{"e:2379"}, "/p", "", ""), "--inprocess-resize") {
		t.Error("--inprocess-resize given although the job did not ask for it")
	}
}

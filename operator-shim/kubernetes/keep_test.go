package kubernetes

import (
	"fmt"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

func kept(name, node string, code int32, age time.Duration) PodView {
	p := exited(name, node, code, false)
	p.Kept, p.Created = true, t0.Add(-age)
	return p
}

func TestPlanKeepsFailedPods(t *testing.T) {
	var many []PodView
	for i := range KeepFailedPods + 2 {
		many = append(many, kept(fmt.Sprintf("f%d", i), "a", 1, time.Duration(i)*time.Minute))
	}
	for _, tc := range []struct {
		rule string
		in   PlanInput
		want string
	}{
		{"a failed pod on an allocated node is kept, not deleted", PlanInput{Desired: desired(1, "a"), CanCreate: true, Pods: []PodView{exited("pa", "a", 137, false)}},
			"KeepPod a/pa"},
		{"a kept failed pod is replaced", PlanInput{Desired: desired(1, "a"), CanCreate: true, Pods: []PodView{kept("pa", "a", 1, 0)}},
			"CreatePod a"},
		{"a kept failed pod waits for the node's backoff", PlanInput{Desired: desired(1, "a"), CanCreate: true, Busy: map[string]string{"a": "backoff"},
			Pods: []PodView{kept("pa", "a", 1, 0)}}, ""},
		{"a kept failed pod stays beside its running replacement", PlanInput{Desired: desired(1, "a"), CanCreate: true,
			Pods: []PodView{kept("pa", "a", 1, time.Minute), running("pa2", "a")}}, ""},
		{"a failed pod of a node that left is kept", PlanInput{Desired: desired(1, "a"), Pods: []PodView{running("pa", "a"), exited("pc", "c", 1, false)}}, ""},
		{"only the newest failed pods are kept", PlanInput{Desired: desired(1, "a"), Pods: append([]PodView{running("pa", "a")}, many...)},
			"DeletePod a/f5; DeletePod a/f6"},
		{"a job being deleted loses its failed pods", PlanInput{Desired: desired(1, "a"), Deleting: true, Pods: []PodView{kept("pa", "a", 1, 0)}},
			"DeletePod a/pa"},
		{"a failed pod whose job's restarts are spent fails the job", PlanInput{Desired: desired(1, "a"), RestartsSpent: true,
			Pods: []PodView{exited("pa", "a", 1, false)}}, "Finish a " + fleet.Failed},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			tc.in.Now = t0
			if got := render(Plan(tc.in)); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestPodForServiceAccountToken(t *testing.T) {
	ej := job(nil)
	spec, err := Translate(ej)
	if err != nil {
		t.Fatal(err)
	}
	if p := PodFor(ej, spec, "n1", PodOptions{}); p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken {
		t.Errorf("a job pod mounts the ServiceAccount token: %v", p.Spec.AutomountServiceAccountToken)
	}
	ej.Spec.Template.Spec.AutomountServiceAccountToken = ptr(true)
	if p := PodFor(ej, spec, "n1", PodOptions{}); !*p.Spec.AutomountServiceAccountToken {
		t.Error("the template's automountServiceAccountToken: true was overridden")
	}
}

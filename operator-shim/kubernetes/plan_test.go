package kubernetes

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func desired(gen int64, nodes ...string) *fleet.Desired {
	return &fleet.Desired{Allocation: api.Allocation{Job: "j", Size: len(nodes), Nodes: nodes}, Generation: gen}
}

func running(name, node string) PodView {
	return PodView{Name: name, Node: node, Phase: corev1.PodRunning, Started: true, Created: t0}
}

func exited(name, node string, code int32, drained bool) PodView {
	return PodView{Name: name, Node: node, Phase: corev1.PodFailed, Started: true, ExitCode: &code, Drained: drained, Created: t0}
}

// render is a compact form of a plan: "Kind node/pod" per action.
func render(acts []Action) string {
	var s []string
	for _, a := range acts {
		x := string(a.Kind) + " " + a.Node
		if a.Pod != "" {
			x += "/" + a.Pod
		}
		if a.Outcome != "" {
			x += " " + a.Outcome
		}
		s = append(s, x)
	}
	return strings.Join(s, "; ")
}

func TestPlan(t *testing.T) {
	stopped := &fleet.Desired{Allocation: api.Allocation{Job: "j"}, Generation: 5, Stop: &fleet.Stop{Kind: fleet.StopPreemption}}
	draining := running("pc", "c")
	draining.DrainSince = t0.Add(-10 * time.Second)
	late := running("pc", "c")
	late.DrainSince = t0.Add(-2 * time.Minute)
	deleting := running("pa", "a")
	deleting.Deleting = true
	pending := PodView{Name: "pc", Node: "c", Phase: corev1.PodPending, Created: t0}
	newer := running("pa2", "a")
	newer.Created = t0.Add(time.Second)
	for _, tc := range []struct {
		name string
		in   PlanInput
		want string
	}{
		{"no decision yet", PlanInput{CanCreate: true}, ""},
		{"admitted: a pod per node", PlanInput{Desired: desired(1, "a", "b"), CanCreate: true}, "CreatePod a; CreatePod b"},
		{"credentials not ready", PlanInput{Desired: desired(1, "a", "b")}, ""},
		{"steady", PlanInput{Desired: desired(1, "a", "b"), CanCreate: true, Pods: []PodView{running("pa", "a"), running("pb", "b")}}, ""},
		{"grown", PlanInput{Desired: desired(2, "a", "b", "c"), CanCreate: true, Pods: []PodView{running("pa", "a"), running("pb", "b")}}, "CreatePod c"},
		{"shrunk: drain starts", PlanInput{Desired: desired(3, "a", "b"), CanCreate: true, Pods: []PodView{running("pa", "a"), running("pb", "b"), running("pc", "c")}},
			"StartDrain c/pc"},
		{"shrunk: draining, within grace", PlanInput{Desired: desired(3, "a", "b"), Grace: time.Minute, Pods: []PodView{running("pa", "a"), running("pb", "b"), draining}}, ""},
		{"shrunk: drained pod deleted", PlanInput{Desired: desired(3, "a", "b"), Pods: []PodView{running("pa", "a"), running("pb", "b"), exited("pc", "c", 0, true)}},
			"DeletePod c/pc"},
		{"shrunk: drain timed out", PlanInput{Desired: desired(3, "a", "b"), Grace: time.Minute, Pods: []PodView{running("pa", "a"), running("pb", "b"), late}},
			"DeletePod c/pc"},
		{"shrunk: a pod that never started goes at once", PlanInput{Desired: desired(3, "a"), Pods: []PodView{running("pa", "a"), pending}}, "DeletePod c/pc"},
		{"preempted: every pod drains", PlanInput{Desired: stopped, Pods: []PodView{running("pa", "a"), running("pb", "b")}}, "StartDrain a/pa; StartDrain b/pb"},
		{"node failure: failed pod kept for its logs", PlanInput{Desired: desired(1, "a", "b"), CanCreate: true, Pods: []PodView{running("pa", "a"), exited("pb", "b", 1, false)}},
			"KeepPod b/pb"},
		{"pod deleted by someone else: recreated", PlanInput{Desired: desired(1, "a", "b"), CanCreate: true, Pods: []PodView{running("pa", "a")}}, "CreatePod b"},
		{"old pod still terminating: wait", PlanInput{Desired: desired(1, "a"), CanCreate: true, Pods: []PodView{deleting}}, ""},
		{"drained but allocated again: replaced", PlanInput{Desired: desired(4, "a"), CanCreate: true, Pods: []PodView{exited("pa", "a", 0, true)}}, "DeletePod a/pa"},
		{"workers succeeded", PlanInput{Desired: desired(1, "a", "b"), Pods: []PodView{exited("pa", "a", 0, false), running("pb", "b")}}, "Finish a Succeeded"},
		{"restart budget spent", PlanInput{Desired: desired(1, "a"), RestartsSpent: true, Pods: []PodView{exited("pa", "a", 1, false)}}, "Finish a Failed"},
		{"finished: ended pods kept, live ones drain", PlanInput{Desired: desired(1, "a", "b"), Finished: true, Pods: []PodView{exited("pa", "a", 0, false), running("pb", "b")}},
			"StartDrain b/pb"},
		{"being deleted: no new pods, ended ones go", PlanInput{Desired: desired(1, "a", "b"), Deleting: true, CanCreate: true, Pods: []PodView{exited("pa", "a", 0, true)}},
			"DeletePod a/pa"},
		{"node still busy with another job's draining pod", PlanInput{Desired: desired(2, "a", "b"), CanCreate: true, Busy: map[string]string{"b": "ns/other-x"},
			Pods: []PodView{running("pa", "a")}}, ""},
		{"duplicate pod on a node", PlanInput{Desired: desired(1, "a"), Pods: []PodView{running("pa", "a"), newer}}, "DeletePod a/pa"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Now = t0
			if got := render(Plan(tc.in)); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// The messages say what happened and why, for kubectl describe.
func TestPlanMessages(t *testing.T) {
	acts := Plan(PlanInput{Desired: desired(3, "a"), Now: t0, Pods: []PodView{running("pa", "a"), exited("pc", "c", 0, true)}})
	if len(acts) != 1 || acts[0].Reason != ReasonDrained || !strings.Contains(acts[0].Why, "exited 0 after the workers checkpointed") {
		t.Errorf("%+v", acts)
	}
	acts = Plan(PlanInput{Desired: desired(3, "a"), Now: t0, Pods: []PodView{exited("pa", "a", 137, false)}})
	if len(acts) != 1 || acts[0].Reason != ReasonNodeFailure || !acts[0].Warning || !strings.Contains(acts[0].Why, "exit 137") {
		t.Errorf("%+v", acts)
	}
}

func TestViewOf(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{NodeName: "n"},
		Status: corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "sidecar", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2}}},
			{Name: "trainer", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Message: DrainedMessage}}},
		}}}
	v := ViewOf(p, "trainer", time.Time{})
	if !v.Started || !v.Ended() || *v.ExitCode != 0 || !v.Drained || v.Node != "n" {
		t.Errorf("%+v", v)
	}
}

func TestComputeStatus(t *testing.T) {
	ej := job(nil)
	ej.Generation = 3
	shrunk := &fleet.Status{Reason: api.Reason{Job: "llama", Kind: api.KindShrunk, Code: api.CodeReclaim, FromSize: 4, ToSize: 3,
		Message: "shrunk 4 -> 3: team prod reclaimed its nominal quota for serve", For: []string{"serve"}, ForTeam: "prod"}}
	pending := &fleet.Status{Reason: api.Reason{Job: "llama", Kind: api.KindPending, Code: api.CodeNoCapacity, Message: "no nodes free"}}
	notStarted := PodView{Name: "x", Node: "c", Phase: corev1.PodPending}
	prevT := metav1.NewTime(t0.Add(-time.Hour))
	for _, tc := range []struct {
		name    string
		mod     func(*v1alpha1.ElasticJob)
		prev    v1alpha1.ElasticJobStatus
		in      StatusInput
		phase   string
		cur     int32
		des     int32
		reason  string
		msgHas  string
		keepLTT bool
	}{
		{"submitted", nil, v1alpha1.ElasticJobStatus{}, StatusInput{}, v1alpha1.PhasePending, 0, 0, CodeSubmitted, "first decision", false},
		{"pending with the coordinator's reason", nil, v1alpha1.ElasticJobStatus{Phase: v1alpha1.PhasePending, LastTransitionTime: &prevT},
			StatusInput{Decision: pending}, v1alpha1.PhasePending, 0, 0, "NoCapacity", "no nodes free", true},
		{"running: current counts started pods on allocated nodes", nil, v1alpha1.ElasticJobStatus{},
			StatusInput{Desired: desired(2, "a", "b", "c"), Decision: shrunk, Pods: []PodView{running("pa", "a"), running("pb", "b"), notStarted, running("pd", "d")}},
			v1alpha1.PhaseRunning, 2, 3, "Reclaim", "for serve", false},
		{"invalid", nil, v1alpha1.ElasticJobStatus{}, StatusInput{Invalid: errors.New("spec.team: bad"), Desired: desired(1, "a")},
			v1alpha1.PhaseInvalid, 0, 0, "InvalidSpec", "spec.team", false},
		{"name taken", nil, v1alpha1.ElasticJobStatus{}, StatusInput{Invalid: errors.New("held by team x"), InvalidCode: CodeNameTaken},
			v1alpha1.PhaseInvalid, 0, 0, CodeNameTaken, "team x", false},
		{"suspended", func(j *v1alpha1.ElasticJob) { j.Spec.Suspend = true }, v1alpha1.ElasticJobStatus{},
			StatusInput{Decision: &fleet.Status{Reason: api.Reason{Kind: api.KindSuspended, Code: api.CodeSuspended, Message: "suspended by the user"}}},
			v1alpha1.PhaseSuspended, 0, 0, "Suspended", "suspended", false},
		{"succeeded", nil, v1alpha1.ElasticJobStatus{}, StatusInput{Finish: &fleet.Finish{Outcome: fleet.Succeeded, Message: "pod p exited 0"}},
			v1alpha1.PhaseSucceeded, 0, 0, "Succeeded", "exited 0", false},
		{"failed", nil, v1alpha1.ElasticJobStatus{}, StatusInput{Finish: &fleet.Finish{Outcome: fleet.Failed, Message: "budget spent"}},
			v1alpha1.PhaseFailed, 0, 0, "Failed", "budget", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := ej.DeepCopy()
			if tc.mod != nil {
				tc.mod(j)
			}
			tc.in.Now = t0
			s := ComputeStatus(j, tc.prev, tc.in)
			got := fmt.Sprintf("%s %d/%d %s", s.Phase, s.CurrentReplicas, s.DesiredReplicas, s.Reason)
			want := fmt.Sprintf("%s %d/%d %s", tc.phase, tc.cur, tc.des, tc.reason)
			if got != want || !strings.Contains(s.Message, tc.msgHas) {
				t.Errorf("got %s %q, want %s ...%q...", got, s.Message, want, tc.msgHas)
			}
			if s.ObservedGeneration != 3 {
				t.Error("observedGeneration")
			}
			if kept := s.LastTransitionTime.Equal(&prevT); kept != tc.keepLTT {
				t.Errorf("lastTransitionTime kept=%v want %v", kept, tc.keepLTT)
			}
		})
	}
	s := ComputeStatus(ej, v1alpha1.ElasticJobStatus{}, StatusInput{Desired: desired(2, "a", "b", "c"), Decision: shrunk, Now: t0})
	if len(s.ShrunkFor) != 1 || s.ShrunkFor[0] != "serve" || len(s.Nodes) != 3 || s.AllocationGeneration != 2 || s.Decision != "Shrunk" {
		t.Errorf("%+v", s)
	}
}

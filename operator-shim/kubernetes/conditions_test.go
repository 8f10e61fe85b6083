package kubernetes

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

// conds renders the True conditions, in type order.
func conds(cs []metav1.Condition) string {
	var s []string
	for _, typ := range []string{v1alpha1.ConditionAdmitted, v1alpha1.ConditionRunning, v1alpha1.ConditionResizing,
		v1alpha1.ConditionSuspended, v1alpha1.ConditionSucceeded, v1alpha1.ConditionFailed} {
		c := meta.FindStatusCondition(cs, typ)
		if c == nil {
			s = append(s, typ+"?")
			continue
		}
		if c.Status == metav1.ConditionTrue {
			s = append(s, typ+"("+c.Reason+")")
		}
	}
	return strings.Join(s, " ")
}

func TestStatusPhaseAndConditions(t *testing.T) {
	within := &fleet.Status{Reason: api.Reason{Job: "llama", Kind: api.KindRunning, Code: api.CodeWithinQuota, Message: "within quota"}}
	grown := &fleet.Status{Reason: api.Reason{Job: "llama", Kind: api.KindGrown, Code: api.CodeWithinQuota, Message: "grown"}}
	starting := PodView{Name: "pb", Node: "b", Phase: corev1.PodPending, Created: t0}
	for _, tc := range []struct {
		rule  string
		mod   func(*v1alpha1.ElasticJob)
		in    StatusInput
		phase string
		conds string
		reps  string
	}{
		{"admitted without a running pod is Starting, not Running", nil,
			StatusInput{Desired: desired(1, "a", "b"), Decision: within, Pods: []PodView{starting}},
			v1alpha1.PhaseStarting, "Admitted(WithinQuota) Resizing(PodsFollowAllocation)", "1/0/0"},
		{"running when a pod runs on an allocated node", nil,
			StatusInput{Desired: desired(1, "a"), Decision: within, Pods: []PodView{running("pa", "a")}},
			v1alpha1.PhaseRunning, "Admitted(WithinQuota) Running(PodsRunning)", "1/0/0"},
		{"resizing while pods follow a grown allocation", nil,
			StatusInput{Desired: desired(2, "a", "b"), Decision: grown, Pods: []PodView{running("pa", "a"), starting}},
			v1alpha1.PhaseRunning, "Admitted(WithinQuota) Running(PodsRunning) Resizing(Grown)", "2/0/0"},
		{"resizing while a left node's pod drains", nil,
			StatusInput{Desired: desired(2, "a"), Decision: within, Pods: []PodView{running("pa", "a"), running("pc", "c")}},
			v1alpha1.PhaseRunning, "Admitted(WithinQuota) Running(PodsRunning) Resizing(PodsFollowAllocation)", "2/0/0"},
		{"failed pods are counted", nil,
			StatusInput{Desired: desired(1, "a"), Decision: within, Pods: []PodView{running("pa", "a"), exited("old", "a", 3, false), exited("d", "c", 0, true)}},
			v1alpha1.PhaseRunning, "Admitted(WithinQuota) Running(PodsRunning)", "1/1/1"},
		{"suspended", func(j *v1alpha1.ElasticJob) { j.Spec.Suspend = true }, StatusInput{},
			v1alpha1.PhaseSuspended, "Suspended(Suspended)", "0/0/0"},
		{"succeeded", nil, StatusInput{Finish: &fleet.Finish{Outcome: fleet.Succeeded, Message: "exit 0", Time: t0}},
			v1alpha1.PhaseSucceeded, "Succeeded(Succeeded)", "0/0/0"},
		{"failed", nil, StatusInput{Finish: &fleet.Finish{Outcome: fleet.Failed, Message: "budget spent", Time: t0}},
			v1alpha1.PhaseFailed, "Failed(Failed)", "0/0/0"},
		{"invalid is Failed with the controller's reason", nil, StatusInput{Invalid: errors.New("taken"), InvalidCode: CodeNameTaken},
			v1alpha1.PhaseInvalid, "Failed(NameTaken)", "0/0/0"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			j := job(tc.mod)
			j.Generation = 4
			tc.in.Now = t0
			s := ComputeStatus(j, v1alpha1.ElasticJobStatus{}, tc.in)
			reps := fmt.Sprintf("%d/%d/%d", s.ReplicaStatuses.Active, s.ReplicaStatuses.Failed, s.ReplicaStatuses.Succeeded)
			if s.Phase != tc.phase || conds(s.Conditions) != tc.conds || reps != tc.reps {
				t.Errorf("got %s [%s] %s, want %s [%s] %s", s.Phase, conds(s.Conditions), reps, tc.phase, tc.conds, tc.reps)
			}
			for _, c := range s.Conditions {
				if c.ObservedGeneration != 4 || c.Message == "" || c.LastTransitionTime.IsZero() {
					t.Errorf("condition %+v", c)
				}
			}
			if s.Selector != JobLabel+"="+j.Name {
				t.Errorf("selector %q", s.Selector)
			}
		})
	}
}

func TestStatusTimesAreKept(t *testing.T) {
	j := job(nil)
	in := StatusInput{Desired: desired(1, "a"), Pods: []PodView{running("pa", "a")}, Now: t0}
	s := ComputeStatus(j, v1alpha1.ElasticJobStatus{}, in)
	if s.StartTime == nil || !s.StartTime.Time.Equal(t0) || s.CompletionTime != nil {
		t.Fatalf("start %v completion %v", s.StartTime, s.CompletionTime)
	}
	in.Now = t0.Add(time.Hour)
	in.Finish = &fleet.Finish{Outcome: fleet.Succeeded, Time: t0.Add(30 * time.Minute)}
	s2 := ComputeStatus(j, s, in)
	if !s2.StartTime.Time.Equal(t0) || s2.CompletionTime == nil || !s2.CompletionTime.Time.Equal(t0.Add(30*time.Minute)) {
		t.Errorf("start %v completion %v", s2.StartTime, s2.CompletionTime)
	}
	// A condition whose status stays keeps its transition time.
	a1 := meta.FindStatusCondition(s.Conditions, v1alpha1.ConditionSuspended)
	a2 := meta.FindStatusCondition(s2.Conditions, v1alpha1.ConditionSuspended)
	if !a1.LastTransitionTime.Equal(&a2.LastTransitionTime) {
		t.Errorf("Suspended's transition time moved: %v -> %v", a1.LastTransitionTime, a2.LastTransitionTime)
	}
}

func TestDecisionEventType(t *testing.T) {
	for _, tc := range []struct {
		rule string
		kind api.ReasonKind
		code api.ReasonCode
		want string
	}{
		{"a shrink the user asked for is Normal", api.KindShrunk, api.CodeSpecChanged, corev1.EventTypeNormal},
		{"a shrink for another team is a Warning", api.KindShrunk, api.CodeReclaim, corev1.EventTypeWarning},
		{"a preemption is a Warning", api.KindPreempted, api.CodePriorityPreemption, corev1.EventTypeWarning},
		{"an invalid spec is a Warning", api.KindInvalid, api.CodeInvalidSpec, corev1.EventTypeWarning},
		{"growth is Normal", api.KindGrown, api.CodeFairShare, corev1.EventTypeNormal},
	} {
		if got := DecisionEventType(tc.kind, tc.code); got != tc.want {
			t.Errorf("%s: got %s", tc.rule, got)
		}
	}
}

func TestKubeAdvice(t *testing.T) {
	ej := job(nil)
	pending := &fleet.Status{Reason: api.Reason{Job: "llama", Kind: api.KindPending, Code: api.CodeTeamNotFound,
		Message: `team "research" does not exist; apply it with elasticctl apply -f teams.yaml`}}
	s := ComputeStatus(ej, v1alpha1.ElasticJobStatus{}, StatusInput{Decision: pending, Now: t0})
	if strings.Contains(s.Message, "elasticctl") || !strings.Contains(s.Message, "ElasticTeam named "+ej.Spec.Team) {
		t.Errorf("a missing team, told a Kubernetes user: %q", s.Message)
	}
	if got := KubeAdvice(ej, api.CodeNoCapacity, "no nodes free"); got != "no nodes free" {
		t.Errorf("other messages are kept: %q", got)
	}
}

// A steady job's status, as read back from the API server, computes to
// itself later: the controller writes no status without a change.
func TestSteadyStatusIsNotRewritten(t *testing.T) {
	j := job(nil)
	j.Generation = 2
	in := StatusInput{Desired: desired(1, "a", "b"), Pods: []PodView{running("pa", "a"), running("pb", "b"), exited("old", "a", 1, false)},
		Decision: &fleet.Status{Reason: api.Reason{Job: "llama", Kind: api.KindRunning, Code: api.CodeWithinQuota, Message: "within quota"}}, Now: t0.Add(1500 * time.Millisecond)}
	s := ComputeStatus(j, v1alpha1.ElasticJobStatus{}, in)
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var read v1alpha1.ElasticJobStatus
	if err := json.Unmarshal(b, &read); err != nil {
		t.Fatal(err)
	}
	in.Now = t0.Add(time.Hour)
	if again := ComputeStatus(j, read, in); !reflect.DeepEqual(again, read) {
		t.Errorf("the status changed without a cause:\n%+v\n%+v", read, again)
	}
}

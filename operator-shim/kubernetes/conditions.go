package kubernetes

import (
	"fmt"
	"regexp"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

// Condition reasons of the controller's own.
const (
	ReasonPodsRunning  = "PodsRunning"
	ReasonNoPodRunning = "NoPodRunning"
	ReasonPodsFollow   = "PodsFollowAllocation"
	ReasonSteady       = "Steady"
	ReasonNotFinished  = "NotFinished"
	ReasonNotSuspended = "NotSuspended"
)

// conditionReason is the form the API server accepts for a condition's
// reason.
var conditionReason = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// countReplicas counts pods by state: active (not ended, not being
// deleted), succeeded (exit 0) and failed (ended otherwise, not drained).
func countReplicas(pods []PodView) v1alpha1.ReplicaStatuses {
	var r v1alpha1.ReplicaStatuses
	for _, p := range pods {
		switch {
		case !p.Ended():
			if !p.Deleting {
				r.Active++
			}
		case *exitOf(p) == 0:
			r.Succeeded++
		default:
			r.Failed++
		}
	}
	return r
}

// Conditions are an ElasticJob's conditions for status s (its phase,
// sizes and reason already computed): Admitted, Running, Resizing,
// Suspended, Succeeded and Failed, each True or False with a reason and a
// message. prev are the current conditions: a condition whose status stays
// keeps its transition time.
func Conditions(ej *v1alpha1.ElasticJob, prev []metav1.Condition, s v1alpha1.ElasticJobStatus, in StatusInput) []metav1.Condition {
	now := metav1.NewTime(in.Now.Truncate(time.Second))
	out := make([]metav1.Condition, 0, 6)
	for _, c := range prev {
		out = append(out, *c.DeepCopy())
	}
	set := func(typ string, ok bool, reason, msg string) {
		st := metav1.ConditionFalse
		if ok {
			st = metav1.ConditionTrue
		}
		if !conditionReason.MatchString(reason) {
			reason = "Unknown"
		}
		if msg == "" {
			msg = reason
		}
		if len(msg) > 1024 {
			msg = msg[:1024]
		}
		meta.SetStatusCondition(&out, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg,
			ObservedGeneration: ej.Generation, LastTransitionTime: now})
	}
	admitted := in.Desired.Running() && s.Phase != v1alpha1.PhaseInvalid && in.Finish == nil && !ej.Spec.Suspend
	reason := s.Reason
	if reason == "" {
		reason = s.Phase
	}
	if admitted {
		set(v1alpha1.ConditionAdmitted, true, reason, fmt.Sprintf("the coordinator allocated %d node(s): %s", s.DesiredReplicas, s.Message))
	} else {
		set(v1alpha1.ConditionAdmitted, false, reason, s.Message)
	}
	switch {
	case s.Phase == v1alpha1.PhaseRunning:
		set(v1alpha1.ConditionRunning, true, ReasonPodsRunning, fmt.Sprintf("%d of %d pod(s) run on the allocated nodes", s.CurrentReplicas, s.DesiredReplicas))
	case admitted && s.Reason == ReasonPodCreateFailed:
		set(v1alpha1.ConditionRunning, false, ReasonPodCreateFailed, s.Message)
	case admitted:
		set(v1alpha1.ConditionRunning, false, ReasonNoPodRunning, fmt.Sprintf("admitted on %d node(s); no pod runs yet", s.DesiredReplicas))
	default:
		set(v1alpha1.ConditionRunning, false, reason, "phase "+s.Phase+": "+s.Message)
	}
	following := 0
	placed := map[string]bool{}
	for _, n := range s.Nodes {
		placed[n] = true
	}
	for _, p := range in.Pods {
		if !placed[p.Node] && !p.Ended() {
			following++ // a pod of a node that left: draining
		}
	}
	switch {
	case admitted && (s.CurrentReplicas != s.DesiredReplicas || following > 0):
		r := s.Decision
		if r == "" || r == "Running" || r == "Admitted" {
			r = ReasonPodsFollow
		}
		set(v1alpha1.ConditionResizing, true, r, fmt.Sprintf("%d of %d pod(s) run, %d draining: %s", s.CurrentReplicas, s.DesiredReplicas, following, s.Message))
	default:
		set(v1alpha1.ConditionResizing, false, ReasonSteady, "the pods match the allocation")
	}
	if ej.Spec.Suspend {
		set(v1alpha1.ConditionSuspended, true, "Suspended", "spec.suspend is true: the job holds no nodes")
	} else {
		set(v1alpha1.ConditionSuspended, false, ReasonNotSuspended, "spec.suspend is false")
	}
	succeeded := s.Phase == v1alpha1.PhaseSucceeded
	failed := s.Phase == v1alpha1.PhaseFailed || s.Phase == v1alpha1.PhaseInvalid
	if succeeded {
		set(v1alpha1.ConditionSucceeded, true, reason, s.Message)
	} else {
		set(v1alpha1.ConditionSucceeded, false, ReasonNotFinished, "the job has not succeeded")
	}
	if failed {
		set(v1alpha1.ConditionFailed, true, reason, s.Message)
	} else {
		set(v1alpha1.ConditionFailed, false, ReasonNotFinished, "the job has not failed")
	}
	return out
}

// DecisionEventType is the Kubernetes Event type of a coordinator's
// decision: a preemption, an invalid spec or a shrink the user did not ask
// for is a Warning; a shrink to the user's new bounds (kubectl scale, an
// edited spec) is Normal, as is everything else.
func DecisionEventType(kind api.ReasonKind, code api.ReasonCode) string {
	switch {
	case kind == api.KindShrunk && code == api.CodeSpecChanged:
		return corev1.EventTypeNormal
	case kind == api.KindPreempted || kind == api.KindInvalid || kind == api.KindShrunk:
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}

package kubernetes

import (
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

// Reason codes of the controller's own (the coordinator's are api.Code*).
const (
	// CodeNameTaken: another job (of elasticctl, or an ElasticJob of another
	// namespace) holds the name; job names are unique in the fleet.
	CodeNameTaken = "NameTaken"
	// CodeSubmitted: the spec is written; the coordinator has not decided.
	CodeSubmitted = "Submitted"
	// ReasonPodCreateFailed: the API server refused a pod of the job (the
	// message says why); the controller retries.
	ReasonPodCreateFailed = "PodCreateFailed"
	// ReasonRestarting: hyperpodrun restarted the job's workers after a
	// failure recently (a crash loop shows it throughout); status.restarts
	// has the count, the message the last error.
	ReasonRestarting = "Restarting"
)

// StatusInput is what ComputeStatus reads.
type StatusInput struct {
	// Invalid is why the ElasticJob cannot become a job spec (nil: it can).
	Invalid error
	// InvalidCode is the reason code of Invalid (default InvalidSpec).
	InvalidCode string
	Desired     *fleet.Desired
	// Decision is the coordinator's latest decision for the job: its
	// status record, or the status its desired record implies
	// (fleet.StatusOf; nil: neither).
	Decision *fleet.Status
	// Finish is the job's finish record (nil: running or waiting).
	Finish *fleet.Finish
	// Pods are the job's pods.
	Pods []PodView
	// PodError is why the API server refused to create a pod of the job
	// this time (nil: none was refused).
	PodError error
	// Restarts is the job's global restart count.
	Restarts int64
	// WorkerRestarts is hyperpodrun's record of its restarts of the
	// workers (nil: none): a job it restarted recently is Running with
	// reason Restarting (fleet.WorkerRestarts.Restarting).
	WorkerRestarts *fleet.WorkerRestarts
	Now            time.Time
}

// ComputeStatus is an ElasticJob's status: the phase, the coordinator's
// size, reason and message, and the pods running on allocated nodes. prev
// is the current status (its transition time is kept while the phase
// stays).
func ComputeStatus(ej *v1alpha1.ElasticJob, prev v1alpha1.ElasticJobStatus, in StatusInput) v1alpha1.ElasticJobStatus {
	s := v1alpha1.ElasticJobStatus{ObservedGeneration: ej.Generation}
	if in.Desired != nil {
		s.AllocationGeneration = in.Desired.Generation
	}
	if in.Desired.Running() {
		s.DesiredReplicas = int32(in.Desired.Size)
		s.Nodes = append([]string(nil), in.Desired.Nodes...)
	}
	placed := map[string]bool{}
	for _, n := range s.Nodes {
		placed[n] = true
	}
	for _, p := range in.Pods {
		if placed[p.Node] && !p.Deleting && !p.Ended() && p.Started {
			s.CurrentReplicas++
		}
	}
	s.Selector = JobLabel + "=" + ej.Name
	s.NodeNames = strings.Join(s.Nodes, ",")
	s.ReplicaStatuses = countReplicas(in.Pods)
	s.Restarts = int32(min(in.Restarts, 1<<31-1))
	if d := in.Decision; d != nil {
		s.Decision, s.Reason, s.Message = string(d.Kind), string(d.Code), KubeAdvice(ej, d.Code, d.Message)
		if d.Kind == api.KindShrunk || d.Kind == api.KindPreempted {
			s.ShrunkFor = append([]string(nil), d.For...)
		} else {
			s.ShrunkFor = prev.ShrunkFor
		}
	}
	switch {
	case in.Invalid != nil:
		s.Phase, s.Reason, s.Message = v1alpha1.PhaseInvalid, in.InvalidCode, in.Invalid.Error()
		if s.Reason == "" {
			s.Reason = string(api.CodeInvalidSpec)
		}
		s.Decision, s.DesiredReplicas, s.Nodes = "", 0, nil
	case in.Finish != nil:
		s.Phase = v1alpha1.PhaseSucceeded
		if in.Finish.Outcome != fleet.Succeeded {
			s.Phase = v1alpha1.PhaseFailed
		}
		s.Reason, s.Message = in.Finish.Outcome, in.Finish.Message
	case ej.Spec.Suspend:
		s.Phase = v1alpha1.PhaseSuspended
	case in.Decision != nil && in.Decision.Kind == api.KindInvalid:
		s.Phase = v1alpha1.PhaseInvalid
	case in.Desired.Running() && s.CurrentReplicas > 0:
		s.Phase = v1alpha1.PhaseRunning
	case in.Desired.Running():
		s.Phase = v1alpha1.PhaseStarting // admitted; no pod runs yet
	default:
		s.Phase = v1alpha1.PhasePending
		if in.Decision == nil {
			s.Reason, s.Message = CodeSubmitted, "waiting for the coordinator's first decision"
		}
	}
	if ok, _ := in.WorkerRestarts.Restarting(in.Finish != nil, in.Now); ok && (s.Phase == v1alpha1.PhaseStarting || s.Phase == v1alpha1.PhaseRunning) {
		s.Reason, s.Message = ReasonRestarting, in.WorkerRestarts.RestartingMessage("at "+in.WorkerRestarts.LastTime.UTC().Format(time.RFC3339))
	}
	if in.PodError != nil && (s.Phase == v1alpha1.PhaseStarting || s.Phase == v1alpha1.PhaseRunning) {
		s.Reason, s.Message = ReasonPodCreateFailed, in.PodError.Error()
	}
	s.LastTransitionTime = prev.LastTransitionTime
	if s.Phase != prev.Phase || s.LastTransitionTime == nil {
		t := metav1.NewTime(in.Now.Truncate(time.Second))
		s.LastTransitionTime = &t
	}
	s.StartTime, s.CompletionTime = prev.StartTime, prev.CompletionTime
	if s.StartTime == nil && s.CurrentReplicas > 0 {
		t := metav1.NewTime(in.Now.Truncate(time.Second))
		s.StartTime = &t
	}
	if s.CompletionTime == nil && in.Finish != nil {
		at := in.Finish.Time
		if at.IsZero() {
			at = in.Now
		}
		t := metav1.NewTime(at.Truncate(time.Second))
		s.CompletionTime = &t
	}
	s.Conditions = Conditions(ej, prev.Conditions, s, in)
	return s
}

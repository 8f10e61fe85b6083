// Package v1alpha1 is the hyperpodrun.io/v1alpha1 API: ElasticJob (a
// namespaced elastic PyTorch job whose size and placement the coordinator
// decides) and ElasticTeam (a cluster-scoped team with quotas). The CRDs in
// examples/kubernetes/ are generated from these types and their doc
// comments by operator-shim/kubernetes/gen; struct tags `kube:"..."` carry
// the schema's validation (see operator-shim/kubernetes/schema.go).
package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ElasticJob is an elastic PyTorch job: the coordinator sizes it between
// elasticPolicy.minReplicas and maxReplicas by quota and fair share, and the
// controller runs one pod per allocated node, pinned to it, whose container
// runs the template's command under hyperpodrun with the etcd rendezvous.
type ElasticJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the user asks for.
	Spec ElasticJobSpec `json:"spec"`
	// Status is what the coordinator decided and what runs.
	Status ElasticJobStatus `json:"status,omitempty"`
}

// ElasticJobSpec is what an ElasticJob asks for.
type ElasticJobSpec struct {
	// Team owns the job and is charged for it (an ElasticTeam, or a team
	// applied with elasticctl apply).
	Team string `json:"team" kube:"required,pattern=^[a-z0-9]([-a-z0-9]*[a-z0-9])?$,maxLength=63"`
	// PriorityClassName is one of the coordinator's priority classes:
	// lowest, low, normal (default), high, critical.
	PriorityClassName string `json:"priorityClassName,omitempty" kube:"maxLength=63"`
	// Priority is a number 0-99 instead of a class.
	Priority *int32 `json:"priority,omitempty" kube:"min=0,max=99"`
	// Flavor is the accelerator flavor (e.g. nvidia-h100-80gb, trainium2);
	// empty means the team's only flavor.
	Flavor string `json:"flavor,omitempty" kube:"maxLength=63"`
	// Suspend holds the job without nodes (its pods drain and go); false
	// lets it be admitted again.
	Suspend bool `json:"suspend,omitempty"`
	// NProcPerNode is hyperpodrun's --nproc-per-node: worker processes per
	// node (default: the accelerators per node, else 1).
	NProcPerNode string `json:"nprocPerNode,omitempty" kube:"maxLength=16"`
	// MaxRestarts is hyperpodrun's --max-restarts: failures the job
	// survives (global, counted in etcd) before it fails.
	MaxRestarts int32 `json:"maxRestarts,omitempty" kube:"min=0,max=10000"`
	// ElasticPolicy bounds the job's size; names as HyperPod's.
	ElasticPolicy ElasticPolicy `json:"elasticPolicy"`
	// Template is the pod each allocated node runs. Its first container is
	// the trainer: its command and args are the worker's command line as
	// torchrun would take it after its own flags (e.g. [python3, train.py,
	// --epochs, "10"]); the controller runs it under hyperpodrun. Its
	// resource limits (nvidia.com/gpu, aws.amazon.com/neuron or
	// aws.amazon.com/neuroncore) and requests (cpu, memory) are the job's
	// per-node resources.
	Template corev1.PodTemplateSpec `json:"template"`
}

// ElasticPolicy bounds an ElasticJob's size in nodes (replicas).
type ElasticPolicy struct {
	// MinReplicas is the smallest size the job runs at (default 1).
	MinReplicas int32 `json:"minReplicas,omitempty" kube:"min=1,max=100000"`
	// MaxReplicas is the largest size (default minReplicas).
	MaxReplicas int32 `json:"maxReplicas,omitempty" kube:"min=1,max=100000"`
	// ReplicaIncrementStep: the allowed sizes are minReplicas,
	// minReplicas+step, ... up to maxReplicas (default 1).
	ReplicaIncrementStep int32 `json:"replicaIncrementStep,omitempty" kube:"min=1,max=100000"`
	// ReplicaDiscreteValues lists the allowed sizes instead of a step
	// (ascending).
	ReplicaDiscreteValues []int32 `json:"replicaDiscreteValues,omitempty" kube:"itemMin=1,maxItems=1000"`
	// GracefulShutdownTimeoutInSeconds is how long workers have to
	// checkpoint and exit at a planned change (hyperpodrun's
	// --graceful-timeout) before they are stopped.
	GracefulShutdownTimeoutInSeconds int32 `json:"gracefulShutdownTimeoutInSeconds,omitempty" kube:"min=0,max=86400"`
}

// ElasticJob phases.
const (
	PhasePending   = "Pending"   // waiting for capacity (see reason)
	PhaseRunning   = "Running"   // holds nodes
	PhaseSuspended = "Suspended" // spec.suspend
	PhaseSucceeded = "Succeeded" // hyperpodrun exited 0 on a node that was not drained
	PhaseFailed    = "Failed"    // the job's restart budget is spent
	PhaseInvalid   = "Invalid"   // the spec cannot run (see message)
)

// ElasticJobStatus is what the coordinator decided and what runs.
type ElasticJobStatus struct {
	// Phase is Pending, Running, Suspended, Succeeded, Failed or Invalid.
	Phase string `json:"phase,omitempty"`
	// DesiredReplicas is the size the coordinator allocated.
	DesiredReplicas int32 `json:"desiredReplicas"`
	// CurrentReplicas counts the job's pods running on allocated nodes.
	CurrentReplicas int32 `json:"currentReplicas"`
	// Nodes are the allocated nodes, in rank order.
	Nodes []string `json:"nodes,omitempty"`
	// Decision is the coordinator's latest decision kind (Admitted,
	// Running, Grown, Shrunk, Preempted, Pending, ...).
	Decision string `json:"decision,omitempty"`
	// Reason is the coordinator's reason code (WithinQuota, Borrowing,
	// Reclaim, NoCapacity, ...) or the controller's (InvalidSpec, NameTaken).
	Reason string `json:"reason,omitempty"`
	// Message explains the reason in one line: why the job is pending, or
	// why it shrank and for whom.
	Message string `json:"message,omitempty"`
	// ShrunkFor names the jobs that took this job's capacity at its last
	// shrink or preemption.
	ShrunkFor []string `json:"shrunkFor,omitempty"`
	// AllocationGeneration is the generation of the coordinator's desired
	// record the pods follow.
	AllocationGeneration int64 `json:"allocationGeneration,omitempty"`
	// ObservedGeneration is the spec generation this status reflects.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// LastTransitionTime is when the phase last changed.
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
}

// ElasticJobList is a list of ElasticJobs.
type ElasticJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ElasticJob `json:"items"`
}

// ElasticTeam is a tenant with quotas: the controller applies it to the
// coordinator's team record, as elasticctl apply -f teams.yaml does. A team
// declared here is owned by Kubernetes (the controller rewrites it).
type ElasticTeam struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the team's quotas and policy.
	Spec ElasticTeamSpec `json:"spec"`
	// Status says whether the coordinator's record matches.
	Status ElasticTeamStatus `json:"status,omitempty"`
}

// ElasticTeamSpec is a team's quotas and policy.
type ElasticTeamSpec struct {
	// Cohort groups teams that lend to each other; empty is the default
	// cohort.
	Cohort string `json:"cohort,omitempty" kube:"maxLength=63"`
	// Weight is the fair-share weight, as a decimal string (default "1").
	Weight string `json:"weight,omitempty" kube:"pattern=^[0-9]+(\\.[0-9]+)?$"`
	// Preemption is Never (default) or LowerPriority: whether the team's
	// jobs may shrink and preempt its own lower-priority jobs.
	Preemption string `json:"preemption,omitempty" kube:"enum=Never|LowerPriority"`
	// Quotas lists the flavors the team may use.
	Quotas []FlavorQuota `json:"quotas" kube:"required,maxItems=64"`
}

// FlavorQuota is a team's quota on one accelerator flavor.
type FlavorQuota struct {
	// Flavor names the accelerator flavor.
	Flavor string `json:"flavor" kube:"required,minLength=1,maxLength=63"`
	// Nominal is the guaranteed number of accelerators.
	Nominal int32 `json:"nominal" kube:"required,min=0"`
	// BorrowingLimit caps the accelerators borrowed above nominal (unset:
	// unlimited).
	BorrowingLimit *int32 `json:"borrowingLimit,omitempty" kube:"min=0"`
	// LendingLimit caps how many of the nominal accelerators others may
	// borrow while idle (unset: all).
	LendingLimit *int32 `json:"lendingLimit,omitempty" kube:"min=0"`
}

// ElasticTeamStatus says whether the coordinator's record matches.
type ElasticTeamStatus struct {
	// Applied is true once the team's record in etcd equals the spec.
	Applied bool `json:"applied"`
	// Message says why it is not applied.
	Message string `json:"message,omitempty"`
	// ObservedGeneration is the spec generation this status reflects.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// ElasticTeamList is a list of ElasticTeams.
type ElasticTeamList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ElasticTeam `json:"items"`
}

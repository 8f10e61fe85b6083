package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ElasticJob is an elastic PyTorch job: the coordinator sizes it between
// elasticPolicy.minReplicas and maxReplicas by quota and fair share, and the
// controller runs one pod per allocated node, pinned to it, whose container
// runs the template's command under hyperpodrun with the etcd rendezvous.
//
// +genclient
// +kubebuilder:object:root=true
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS-1123 label (at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit): it is the job's name in the fleet and its rendezvous id"
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.elasticPolicy.maxReplicas,statuspath=.status.currentReplicas,selectorpath=.status.selector
// +kubebuilder:resource:path=elasticjobs,singular=elasticjob,scope=Namespaced,shortName=ej,categories=hyperpodrun
// +kubebuilder:printcolumn:name="Team",type=string,JSONPath=`.spec.team`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.currentReplicas`,description="pods running on allocated nodes"
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desiredReplicas`,description="the coordinator's size"
// +kubebuilder:printcolumn:name="Min",type=integer,JSONPath=`.spec.elasticPolicy.minReplicas`
// +kubebuilder:printcolumn:name="Max",type=integer,JSONPath=`.spec.elasticPolicy.maxReplicas`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Nodes",type=string,JSONPath=`.status.nodeNames`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
type ElasticJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the user asks for.
	Spec ElasticJobSpec `json:"spec"`
	// Status is what the coordinator decided and what runs.
	Status ElasticJobStatus `json:"status,omitempty"`
}

// ElasticJobSpec is what an ElasticJob asks for.
//
// +kubebuilder:validation:XValidation:rule="!has(self.priority) || !has(self.priorityClassName)",message="set priority or priorityClassName, not both"
// +kubebuilder:validation:XValidation:rule="self.team == oldSelf.team",message="team is immutable: delete the job and create it in the other team"
type ElasticJobSpec struct {
	// Team owns the job and is charged for it (an ElasticTeam, or a team
	// applied with elasticctl apply).
	// +required
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=63
	Team string `json:"team"`
	// PriorityClassName is one of the coordinator's priority classes:
	// lowest, low, normal (default), high, critical.
	// +kubebuilder:validation:MaxLength=63
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// Priority is a number 0-99 instead of a class.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=99
	Priority *int32 `json:"priority,omitempty"`
	// Flavor is the accelerator flavor (e.g. nvidia-h100-80gb, trainium2);
	// empty means the team's only flavor.
	// +kubebuilder:validation:MaxLength=63
	Flavor string `json:"flavor,omitempty"`
	// Suspend holds the job without nodes (its pods drain and go); false
	// lets it be admitted again.
	Suspend bool `json:"suspend,omitempty"`
	// NProcPerNode is hyperpodrun's --nproc-per-node: worker processes per
	// node (default: the accelerators per node, else 1).
	// +kubebuilder:validation:MaxLength=16
	NProcPerNode string `json:"nprocPerNode,omitempty"`
	// MaxRestarts is hyperpodrun's --max-restarts: failures the job
	// survives (global, counted in etcd) before it fails.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	MaxRestarts int32 `json:"maxRestarts,omitempty"`
	// ElasticPolicy bounds the job's size; names as HyperPod's.
	// +optional
	ElasticPolicy ElasticPolicy `json:"elasticPolicy"`
	// Template is the pod each allocated node runs. Its first container is
	// the trainer: its command and args are the worker's command line as
	// torchrun would take it after its own flags (e.g. [python3, train.py,
	// --epochs, "10"]); the controller runs it under hyperpodrun. Its
	// resource limits (nvidia.com/gpu, aws.amazon.com/neuron or
	// aws.amazon.com/neuroncore) and requests (cpu, memory) are the job's
	// per-node resources.
	//
	// The CRD keeps the template's fields as written: the API server checks
	// them when the controller creates the pod (the status reports an error).
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	Template corev1.PodTemplateSpec `json:"template"`
}

// ElasticPolicy bounds an ElasticJob's size in nodes (replicas).
//
// +kubebuilder:validation:XValidation:rule="!has(self.minReplicas) || !has(self.maxReplicas) || self.maxReplicas >= self.minReplicas",message="maxReplicas must be at least minReplicas"
// +kubebuilder:validation:XValidation:rule="!has(self.replicaIncrementStep) || !has(self.replicaDiscreteValues)",message="set replicaIncrementStep or replicaDiscreteValues, not both"
// +kubebuilder:validation:XValidation:rule="!has(self.replicaDiscreteValues) || self.replicaDiscreteValues.all(i, self.replicaDiscreteValues.exists_one(j, j == i))",message="replicaDiscreteValues must not repeat a value"
type ElasticPolicy struct {
	// MinReplicas is the smallest size the job runs at (default 1).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	MinReplicas int32 `json:"minReplicas,omitempty"`
	// MaxReplicas is the largest size (default minReplicas).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	MaxReplicas int32 `json:"maxReplicas,omitempty"`
	// ReplicaIncrementStep: the allowed sizes are minReplicas,
	// minReplicas+step, ... up to maxReplicas (default 1).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	ReplicaIncrementStep int32 `json:"replicaIncrementStep,omitempty"`
	// ReplicaDiscreteValues lists the allowed sizes instead of a step
	// (ascending).
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:MaxItems=1000
	ReplicaDiscreteValues []int32 `json:"replicaDiscreteValues,omitempty"`
	// GracefulShutdownTimeoutInSeconds is how long workers have to
	// checkpoint and exit at a planned change (hyperpodrun's
	// --graceful-timeout) before they are stopped.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	GracefulShutdownTimeoutInSeconds int32 `json:"gracefulShutdownTimeoutInSeconds,omitempty"`
}

// ElasticJob phases.
const (
	PhasePending   = "Pending"   // waiting for capacity (see reason)
	PhaseStarting  = "Starting"  // admitted: holds nodes, no pod runs yet
	PhaseRunning   = "Running"   // holds nodes and its pods run
	PhaseSuspended = "Suspended" // spec.suspend
	PhaseSucceeded = "Succeeded" // hyperpodrun exited 0 on a node that was not drained
	PhaseFailed    = "Failed"    // the job's restart budget is spent
	PhaseInvalid   = "Invalid"   // the spec cannot run (see message)
)

// ElasticJobStatus is what the coordinator decided and what runs.
type ElasticJobStatus struct {
	// Phase is Pending, Starting, Running, Suspended, Succeeded, Failed or
	// Invalid.
	Phase string `json:"phase,omitempty"`
	// DesiredReplicas is the size the coordinator allocated.
	// +optional
	DesiredReplicas int32 `json:"desiredReplicas"`
	// CurrentReplicas counts the job's pods running on allocated nodes.
	// +optional
	CurrentReplicas int32 `json:"currentReplicas"`
	// Nodes are the allocated nodes, in rank order.
	Nodes []string `json:"nodes,omitempty"`
	// NodeNames are the allocated nodes, comma-separated (the NODES column
	// of kubectl get -o wide).
	NodeNames string `json:"nodeNames,omitempty"`
	// Decision is the coordinator's latest decision kind (Running, Grown,
	// Shrunk, Preempted, Pending, ...): an admitted job's is Running at
	// once, and its admission is an Admitted Event.
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
	// Selector is the label selector of the job's pods, for the scale
	// subresource (kubectl scale, a HorizontalPodAutoscaler).
	Selector string `json:"selector,omitempty"`
	// Conditions are the job's conditions in the Kubernetes style (types
	// Admitted, Running, Resizing, Suspended, Succeeded, Failed), for
	// kubectl wait --for=condition=Running.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ReplicaStatuses counts the job's pods by state.
	// +optional
	ReplicaStatuses ReplicaStatuses `json:"replicaStatuses"`
	// Restarts is the job's restart count (failures survived, global, as
	// hyperpodrun counts them against spec.maxRestarts).
	// +optional
	Restarts int32 `json:"restarts"`
	// StartTime is when the job's first pod started running.
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime is when the job succeeded or failed.
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// ReplicaStatuses counts an ElasticJob's pods by state.
type ReplicaStatuses struct {
	// Active pods have not ended (starting, running or draining).
	// +optional
	Active int32 `json:"active"`
	// Succeeded pods ended with exit 0 (drained, or the job's success).
	// +optional
	Succeeded int32 `json:"succeeded"`
	// Failed pods ended with a failure; the newest are kept for their logs.
	// +optional
	Failed int32 `json:"failed"`
}

// ElasticJob condition types.
const (
	// ConditionAdmitted: the coordinator allocated nodes to the job.
	ConditionAdmitted = "Admitted"
	// ConditionRunning: the job's pods run on its allocated nodes.
	ConditionRunning = "Running"
	// ConditionResizing: the allocation changed and the pods follow.
	ConditionResizing = "Resizing"
	// ConditionSuspended: spec.suspend holds the job without nodes.
	ConditionSuspended = "Suspended"
	// ConditionSucceeded: the workers succeeded.
	ConditionSucceeded = "Succeeded"
	// ConditionFailed: the job failed, or its spec cannot run.
	ConditionFailed = "Failed"
)

// ElasticJobList is a list of ElasticJobs.
//
// +kubebuilder:object:root=true
type ElasticJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ElasticJob `json:"items"`
}

// ElasticTeam is a tenant with quotas: the controller applies it to the
// coordinator's team record, as elasticctl apply -f teams.yaml does. A team
// declared here is owned by Kubernetes (the controller rewrites it).
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=elasticteams,singular=elasticteam,scope=Cluster,shortName=et,categories=hyperpodrun
// +kubebuilder:printcolumn:name="Cohort",type=string,JSONPath=`.spec.cohort`
// +kubebuilder:printcolumn:name="Weight",type=string,JSONPath=`.spec.weight`
// +kubebuilder:printcolumn:name="Applied",type=boolean,JSONPath=`.status.applied`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
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
	// +kubebuilder:validation:MaxLength=63
	Cohort string `json:"cohort,omitempty"`
	// Weight is the fair-share weight, as a decimal string (default "1").
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?$`
	Weight string `json:"weight,omitempty"`
	// Preemption is Never (default) or LowerPriority: whether the team's
	// jobs may shrink and preempt its own lower-priority jobs.
	// +kubebuilder:validation:Enum=Never;LowerPriority
	Preemption string `json:"preemption,omitempty"`
	// Quotas lists the flavors the team may use.
	// +required
	// +kubebuilder:validation:MaxItems=64
	Quotas []FlavorQuota `json:"quotas"`
}

// FlavorQuota is a team's quota on one accelerator flavor.
type FlavorQuota struct {
	// Flavor names the accelerator flavor.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Flavor string `json:"flavor"`
	// Nominal is the guaranteed number of accelerators.
	// +required
	// +kubebuilder:validation:Minimum=0
	Nominal int32 `json:"nominal"`
	// BorrowingLimit caps the accelerators borrowed above nominal (unset:
	// unlimited).
	// +kubebuilder:validation:Minimum=0
	BorrowingLimit *int32 `json:"borrowingLimit,omitempty"`
	// LendingLimit caps how many of the nominal accelerators others may
	// borrow while idle (unset: all).
	// +kubebuilder:validation:Minimum=0
	LendingLimit *int32 `json:"lendingLimit,omitempty"`
}

// ElasticTeamStatus says whether the coordinator's record matches.
type ElasticTeamStatus struct {
	// Applied is true once the team's record in etcd equals the spec.
	// +optional
	Applied bool `json:"applied"`
	// Message says why it is not applied.
	Message string `json:"message,omitempty"`
	// ObservedGeneration is the spec generation this status reflects.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// ElasticTeamList is a list of ElasticTeams.
//
// +kubebuilder:object:root=true
type ElasticTeamList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ElasticTeam `json:"items"`
}

package kubernetes

import (
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// PodView is what Plan needs to know of one of a job's pods.
type PodView struct {
	Name string
	Node string
	// Created orders pods of one node (the newest counts).
	Created time.Time
	// Deleting: the pod has a deletion timestamp.
	Deleting bool
	// Phase is the pod's phase.
	Phase corev1.PodPhase
	// Started: the trainer container has started (its hyperpodrun may be
	// in the rendezvous).
	Started bool
	// ExitCode is the trainer container's exit code once it terminated.
	ExitCode *int32
	// Drained: it terminated after the supervisor drained it.
	Drained bool
	// DrainSince is when the controller first saw the pod's node leave the
	// allocation (zero: not yet).
	DrainSince time.Time
	// Kept: the pod failed, the controller kept it for its logs and a new
	// pod may replace it.
	Kept bool
}

// Failed reports whether the pod ended in failure (not drained, exit not 0).
func (p PodView) Failed() bool { return p.Ended() && !p.Drained && *exitOf(p) != 0 }

// KeepFailedPods is how many failed pods of a job are kept for their logs
// (the newest; older ones are deleted), as a Job keeps its failed pods.
const KeepFailedPods = 5

// Ended reports whether the trainer container is done.
func (p PodView) Ended() bool {
	return p.ExitCode != nil || p.Phase == corev1.PodSucceeded || p.Phase == corev1.PodFailed
}

// ViewOf reads a pod for Plan; trainer is the trainer container's name.
func ViewOf(p *corev1.Pod, trainer string, drainSince time.Time) PodView {
	v := PodView{Name: p.Name, Node: p.Spec.NodeName, Created: p.CreationTimestamp.Time, Deleting: p.DeletionTimestamp != nil,
		Phase: p.Status.Phase, DrainSince: drainSince}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != trainer {
			continue
		}
		v.Started = cs.State.Running != nil || cs.State.Terminated != nil
		if t := cs.State.Terminated; t != nil {
			code := t.ExitCode
			v.ExitCode = &code
			v.Drained = code == 0 && t.Message == DrainedMessage
		}
	}
	return v
}

// PlanInput is everything Plan decides on, for one job.
type PlanInput struct {
	// Desired is the coordinator's record (nil: none yet).
	Desired *fleet.Desired
	// Pods are the job's pods.
	Pods []PodView
	// Finished: the job has a finish record (keep ended pods, start none).
	Finished bool
	// Deleting: the ElasticJob is being deleted (no new pods).
	Deleting bool
	// CanCreate: what new pods need is ready (the credentials Secret when
	// etcd auth is on).
	CanCreate bool
	// RestartsSpent: the job's global restart count is above its budget.
	RestartsSpent bool
	// Grace is how long a leaving pod may take to drain before it is
	// deleted anyway (the job's graceful timeout plus a margin).
	Grace time.Duration
	// Now is the time of the decision.
	Now time.Time
	// Busy are nodes where another job's pod has not ended yet (node ->
	// pod): no pod is created there until it has.
	Busy map[string]string
}

// ActionKind is what Plan asks of the controller.
type ActionKind string

// Actions.
const (
	// CreatePod on Node.
	CreatePod ActionKind = "CreatePod"
	// DeletePod Pod (Why says why; Event is the Kubernetes event reason).
	DeletePod ActionKind = "DeletePod"
	// StartDrain: Pod's node left the allocation; the controller notes the
	// time and waits for the pod to exit.
	StartDrain ActionKind = "StartDrain"
	// Finish records the job's end (Outcome Succeeded or Failed) in etcd.
	Finish ActionKind = "Finish"
	// KeepPod: Pod failed on an allocated node; it stays for its logs (the
	// controller notes the failure) and a new pod replaces it.
	KeepPod ActionKind = "KeepPod"
)

// Action is one step of a plan.
type Action struct {
	Kind    ActionKind
	Node    string
	Pod     string
	Outcome string
	// Reason is the Kubernetes event reason, Why its message.
	Reason, Why string
	// Warning: the event is a warning.
	Warning bool
}

// Event reasons of pod actions.
const (
	ReasonPodCreated  = "PodCreated"
	ReasonDraining    = "Draining"
	ReasonDrained     = "Drained"
	ReasonDrainExpiry = "DrainTimeout"
	ReasonNodeFailure = "NodeFailure"
	ReasonDuplicate   = "DuplicatePod"
	ReasonSucceeded   = "Succeeded"
	ReasonFailed      = "Failed"
	ReasonPruned      = "FailedPodDeleted"
)

// Plan decides, for one job, which pods to create and delete: one live pod
// on every allocated node; a pod on a node that left the allocation is
// drained (its supervisor tells hyperpodrun) and deleted once its
// container exited, or after Grace; an ended pod of an allocated node is
// the job's success (exit 0, not drained) or a node failure (replaced).
func Plan(in PlanInput) []Action {
	placed := map[string]bool{}
	var order []string
	if in.Desired.Running() && !in.Finished && !in.Deleting {
		for _, n := range in.Desired.Nodes {
			placed[n] = true
			order = append(order, n)
		}
	}
	byNode := map[string][]PodView{}
	for _, p := range in.Pods {
		byNode[p.Node] = append(byNode[p.Node], p)
	}
	for _, ps := range byNode {
		sort.SliceStable(ps, func(i, j int) bool { return ps[i].Created.After(ps[j].Created) }) // newest first
	}
	var acts []Action
	// Allocated nodes: one live pod each.
	for _, node := range order {
		a, done := planNode(in, node, byNode[node])
		acts = append(acts, a...)
		if done {
			return acts
		}
	}
	// Nodes that left the allocation: drain, then delete.
	nodes := make([]string, 0, len(byNode))
	for n := range byNode {
		if !placed[n] {
			nodes = append(nodes, n)
		}
	}
	sort.Strings(nodes)
	for _, node := range nodes {
		for _, p := range byNode[node] {
			switch {
			case p.Deleting:
			case p.Ended():
				if in.Finished && !in.Deleting || p.Failed() && !in.Deleting {
					continue // kept for its logs
				}
				why := fmt.Sprintf("pod %s drained from node %s: hyperpodrun exited 0 after the workers checkpointed", p.Name, node)
				if *exitOf(p) != 0 {
					why = fmt.Sprintf("pod %s on node %s, which left the allocation, exited %d", p.Name, node, *exitOf(p))
				}
				acts = append(acts, Action{Kind: DeletePod, Pod: p.Name, Node: node, Reason: ReasonDrained, Why: why})
			case !p.Started:
				acts = append(acts, Action{Kind: DeletePod, Pod: p.Name, Node: node, Reason: ReasonDrained,
					Why: fmt.Sprintf("pod %s on node %s never started and its node left the allocation", p.Name, node)})
			case p.DrainSince.IsZero():
				acts = append(acts, Action{Kind: StartDrain, Pod: p.Name, Node: node, Reason: ReasonDraining,
					Why: fmt.Sprintf("node %s left the allocation: pod %s's hyperpodrun is draining (workers checkpoint, then it exits)", node, p.Name)})
			case in.Now.Sub(p.DrainSince) >= in.Grace:
				acts = append(acts, Action{Kind: DeletePod, Pod: p.Name, Node: node, Reason: ReasonDrainExpiry, Warning: true,
					Why: fmt.Sprintf("pod %s on node %s did not exit within %s of its drain; deleted", p.Name, node, in.Grace)})
			}
		}
	}
	return append(acts, prune(in)...)
}

// planNode plans one allocated node: its live pod stays; with none, the
// newest ended pod is the job's success, its failure (restarts spent), or
// a node failure: a failed pod is kept for its logs, a drained one goes,
// and a new pod follows. done: the job is finished.
func planNode(in PlanInput, node string, all []PodView) (acts []Action, done bool) {
	var ps []PodView // newest first, without the failed pods kept already
	for _, p := range all {
		if !p.Kept {
			ps = append(ps, p)
		}
	}
	live, deleting := 0, false
	for _, p := range ps {
		switch {
		case p.Deleting:
			deleting = true
		case !p.Ended():
			live++
			if live > 1 {
				acts = append(acts, Action{Kind: DeletePod, Pod: p.Name, Node: node, Reason: ReasonDuplicate, Warning: true,
					Why: fmt.Sprintf("pod %s is a second pod of the job on node %s; deleted", p.Name, node)})
			}
		}
	}
	if live > 0 || deleting {
		return acts, false // running, or wait until the old pod is gone
	}
	if len(ps) > 0 {
		last := ps[0]
		switch {
		case *exitOf(last) == 0 && !last.Drained:
			// hyperpodrun exits 0 on a node it was not drained from only
			// when the workers succeeded: the job is done.
			return append(acts, Action{Kind: Finish, Outcome: fleet.Succeeded, Node: node, Reason: ReasonSucceeded,
				Why: fmt.Sprintf("the workers succeeded: pod %s on node %s exited 0", last.Name, node)}), true
		case in.RestartsSpent:
			return append(acts, Action{Kind: Finish, Outcome: fleet.Failed, Node: node, Reason: ReasonFailed, Warning: true,
				Why: fmt.Sprintf("pod %s on node %s exited %d and the job's restart budget is spent", last.Name, node, *exitOf(last))}), true
		}
		for _, p := range ps {
			if p.Drained || *exitOf(p) == 0 {
				acts = append(acts, Action{Kind: DeletePod, Pod: p.Name, Node: node, Reason: ReasonNodeFailure,
					Why: fmt.Sprintf("pod %s on node %s drained, but the node is allocated again; a new pod joins the job", p.Name, node)})
				continue
			}
			acts = append(acts, Action{Kind: KeepPod, Pod: p.Name, Node: node, Reason: ReasonNodeFailure, Warning: true,
				Why: fmt.Sprintf("pod %s on node %s ended (exit %d) while the node is allocated: a node failure; the pod is kept for its logs (kubectl logs %s) and a new pod joins the job", p.Name, node, *exitOf(p), p.Name)})
		}
		return acts, false // the new pod follows once the ended ones are kept or gone
	}
	if in.CanCreate && in.Busy[node] == "" {
		acts = append(acts, Action{Kind: CreatePod, Node: node, Reason: ReasonPodCreated,
			Why: fmt.Sprintf("node %s is allocated to the job (allocation generation %d)", node, in.Desired.Generation)})
	}
	return acts, false
}

// prune deletes the failed pods kept beyond KeepFailedPods, oldest first
// (a job being deleted loses them all elsewhere in the plan).
func prune(in PlanInput) []Action {
	if in.Deleting {
		return nil
	}
	var failed []PodView
	for _, p := range in.Pods {
		if p.Failed() && !p.Deleting {
			failed = append(failed, p)
		}
	}
	sort.SliceStable(failed, func(i, j int) bool { return failed[i].Created.After(failed[j].Created) })
	var acts []Action
	for _, p := range failed[min(len(failed), KeepFailedPods):] {
		acts = append(acts, Action{Kind: DeletePod, Pod: p.Name, Node: p.Node, Reason: ReasonPruned,
			Why: fmt.Sprintf("failed pod %s deleted: the job keeps its newest %d failed pods", p.Name, KeepFailedPods)})
	}
	return acts
}

func exitOf(p PodView) *int32 {
	if p.ExitCode != nil {
		return p.ExitCode
	}
	v := int32(1)
	if p.Phase == corev1.PodSucceeded {
		v = 0
	}
	return &v
}

// Package kubernetes is the ElasticJob controller: a bridge between
// Kubernetes and the fleet records in etcd, so that the coordinator's policy
// engine decides for Kubernetes jobs exactly as for any other.
//
//   - ElasticJob -> the job's spec (specs/<team>/<job>, as elasticctl submit
//     writes it); its deletion deletes the spec (a finalizer holds the
//     object until its pods are gone).
//   - desired/<job> (the coordinator's allocation) -> one pod per allocated
//     node, pinned by nodeName, running hyperpodrun with the etcd rendezvous
//     under the pod supervisor ("hyperpod-kube-controller pod"), which drains
//     hyperpodrun (SIGUSR2) when the allocation no longer lists its node. A
//     pod of a node that left the allocation is deleted once its container
//     exited (0: the checkpoint is committed), or after the graceful
//     timeout. A pod deleted by someone else is a node failure: a new pod
//     joins on the node while it stays allocated.
//   - status/<job>, events/ and finished/<job> -> the ElasticJob's status
//     and Kubernetes Events.
//   - Kubernetes Nodes without a hyperpod-agent -> node inventories
//     (nodes/<node>, under the controller's lease); ElasticTeams -> teams/.
//
// The decisions are pure functions (Translate, PodFor, Plan, ComputeStatus),
// tested with tables; Controller does the I/O around them.
package kubernetes

// Package operatorshim holds nothing itself: its directory is where the
// coordinator lives, the part of hyperpodrun that plays the role of
// HyperPod's training operator (deciding how big every elastic job may be,
// and where it runs), and its bridges to orchestrators.
//
//   - operator-shim/policy: the pure fair-share engine, policy.Schedule
//   - operator-shim/coordinator: the daemon around it (etcd in, desired
//     records, statuses and events out)
//   - operator-shim/sim: the simulator that replays traces through the engine
//
// The name is kept from the design: an operator shim sits between a
// cluster's orchestrator and the training jobs.
package operatorshim

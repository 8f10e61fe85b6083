// Command hyperpod-agent is hyperpodrun's per-node agent, run as a
// Kubernetes DaemonSet (examples/kubernetes). It reports the node's
// accelerators and capacity to etcd under a lease and keeps them current:
//
//	hyperpod-agent run --etcd-endpoints https://etcd:2379 --node-name $(NODE_NAME) ...
//	hyperpod-agent devices [-o table|json]
//
// SIGTERM drains: the node is marked draining in etcd, then its lease is
// revoked. Exit status: 0 ok, 1 runtime failure, 2 bad usage.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	os.Exit(run(os.Args, os.Stdout, os.Stderr, sig))
}

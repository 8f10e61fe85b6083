package coordinator

import (
	"context"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
)

// serveEnrollments answers the node enrollments hyperpod-kube-controller
// approved (etcdauth.ServeEnrollments: a Kubernetes agent pod gets its own
// node's etcd user) while this coordinator leads, when
// Config.NodeEnrollment is on. Each answer resets a node's password, which
// no leadership compare can guard: it runs within the term (withinTerm).
// The returned func stops it and waits.
func (c *Coordinator) serveEnrollments(ctx context.Context) (stop func()) {
	if !c.cfg.NodeEnrollment {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		etcdauth.ServeEnrollments(ctx, c.cli, c.store.Keys, c.log.With("component", "enrollment"), c.withinTerm)
	}()
	return func() { cancel(); <-done }
}

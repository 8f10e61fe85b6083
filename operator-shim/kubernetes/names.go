package kubernetes

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

// CodeInvalidName: the ElasticJob's name cannot be a job name in the fleet.
const CodeInvalidName = "InvalidName"

// refuseBadName handles ElasticJobs whose name cannot be a job name in the
// fleet (made before the CRD's CEL rule refused them): each is Invalid,
// with a Warning Event, and no etcd key is built from the name. done says
// the job needs nothing more.
func (c *Controller) refuseBadName(ctx context.Context, job string, objs []*v1alpha1.ElasticJob) (done bool, err error) {
	bad := api.ValidateName("metadata.name", job)
	if bad == nil {
		return false, nil
	}
	why := fmt.Errorf("%w: an ElasticJob's name is its job name in the fleet; delete it and create it under a valid name", bad)
	for _, ej := range objs {
		if err := c.writeStatus(ctx, ej, StatusInput{Invalid: why, InvalidCode: CodeInvalidName}, nil); err != nil {
			return true, err
		}
		if err := c.releaseFinalizer(ctx, ej); err != nil {
			return true, err
		}
	}
	return true, nil
}

// phaseEvent records an Event for a phase the controller sets on its own
// (the coordinator's decisions and the pods' ends have their own Events):
// Starting, Running, and Invalid with its reason.
func (c *Controller) phaseEvent(ej *v1alpha1.ElasticJob, s v1alpha1.ElasticJobStatus) {
	switch s.Phase {
	case v1alpha1.PhaseStarting:
		c.recorder.Eventf(ej, corev1.EventTypeNormal, v1alpha1.PhaseStarting, "admitted on %d node(s); its pods start", s.DesiredReplicas)
	case v1alpha1.PhaseRunning:
		c.recorder.Eventf(ej, corev1.EventTypeNormal, v1alpha1.PhaseRunning, "%d of %d pod(s) run on the allocated nodes", s.CurrentReplicas, s.DesiredReplicas)
	case v1alpha1.PhaseInvalid:
		if s.Reason != string(api.CodeInvalidSpec) && s.Reason != CodeNameTaken { // those have their own Events
			c.recorder.Event(ej, corev1.EventTypeWarning, s.Reason, s.Message)
		}
	}
}

package kubernetes_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

// What a kubectl user does: kubectl wait --for=condition=Running waits
// until the job's pods run (the status says Running only then, with
// replica counts and a start time), and kubectl scale resizes the job
// through the scale subresource (spec.elasticPolicy.maxReplicas).
func TestKubectlWaitAndScale(t *testing.T) {
	e := startEnv(t, envOptions{})
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob("sweep", "research", "", 1, 4), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := e.s.Kubectl(t, "wait", "-n", "ml", "--for=condition=Running", "elasticjob/sweep", "--timeout=90s")
	if err != nil {
		t.Fatalf("kubectl wait --for=condition=Running: %v\n%s", err, out)
	}
	s := e.status("sweep")
	if s.Phase != v1alpha1.PhaseRunning || s.CurrentReplicas == 0 || s.ReplicaStatuses.Active == 0 || s.StartTime == nil {
		t.Errorf("Running but the status says %+v", s)
	}
	c := meta.FindStatusCondition(s.Conditions, v1alpha1.ConditionAdmitted)
	if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != 1 || c.Reason == "" {
		t.Errorf("Admitted condition: %+v", c)
	}
	waitFor(t, time.Minute, "sweep on 4 nodes", func() (bool, string) {
		pods, _ := livePods(t, e.cs, "sweep")
		s := e.status("sweep")
		return len(pods) == 4 && s.CurrentReplicas == 4, fmt.Sprintf("%d pods, %+v", len(pods), s)
	})

	out, err = e.s.Kubectl(t, "scale", "-n", "ml", "elasticjob/sweep", "--replicas=2")
	if err != nil {
		t.Fatalf("kubectl scale: %v\n%s", err, out)
	}
	waitFor(t, time.Minute, "sweep shrunk to 2 pods", func() (bool, string) {
		pods, all := livePods(t, e.cs, "sweep")
		s := e.status("sweep")
		return len(pods) == 2 && all == 2 && s.DesiredReplicas == 2 && s.CurrentReplicas == 2, fmt.Sprintf("%d pods (%d in all), %+v", len(pods), all, s)
	})
	j, err := e.cl.ElasticJobs("ml").Get(e.ctx, "sweep", metav1.GetOptions{})
	if err != nil || j.Spec.ElasticPolicy.MaxReplicas != 2 || j.Spec.ElasticPolicy.MinReplicas != 1 {
		t.Fatalf("after kubectl scale: %+v %v", j.Spec.ElasticPolicy, err)
	}
	out, err = e.s.Kubectl(t, "get", "--raw", "/apis/hyperpodrun.io/v1alpha1/namespaces/ml/elasticjobs/sweep/scale")
	if err != nil || !strings.Contains(out, `"replicas":2`) || !strings.Contains(out, "hyperpodrun.io/job=sweep") {
		t.Errorf("the scale subresource: %v\n%s", err, out)
	}
	// Below minReplicas: refused with the rule's message.
	out, err = e.s.Kubectl(t, "scale", "-n", "ml", "elasticjob/sweep", "--replicas=0")
	if err == nil || !strings.Contains(out, "maxReplicas") {
		t.Errorf("kubectl scale --replicas=0: %v\n%s", err, out)
	}
}

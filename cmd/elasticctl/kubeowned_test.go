package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// A job the Kubernetes controller owns (its spec carries the ElasticJob's
// owner mark) is not resized or deleted by elasticctl, whose change the
// controller would silently put back: the refusal names the kubectl
// command, and the spec stays as it was.
func TestResizeAndDeleteOfAKubernetesJobRefused(t *testing.T) {
	ep, cli := startFleet(t, 1)
	st := fleet.New(cli, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.SubmitJob(ctx, fleet.JobSpec{Job: api.Job{Name: "sweep", Team: "research", MinNodes: 1, MaxNodes: 4, PerNode: api.Resources{Accelerators: 8}, SubmitTime: time.Now()},
		Run: fleet.RunSpec{Script: "train.py", Env: map[string]string{fleet.KubernetesOwnerEnv: "ml/sweep/0f3c"}}}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := ctl(t, ep, "resize", "job", "sweep", "--max", "2")
	if code == 0 || !strings.Contains(errOut, "kubectl scale elasticjob sweep -n ml --replicas=N") {
		t.Errorf("resize of a Kubernetes job: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = ctl(t, ep, "delete", "sweep")
	if code == 0 || !strings.Contains(errOut, "kubectl delete elasticjob sweep -n ml") {
		t.Errorf("delete of a Kubernetes job: exit %d\n%s%s", code, out, errOut)
	}
	j, err := st.Job(ctx, "sweep")
	if err != nil || j.MaxNodes != 4 {
		t.Errorf("the spec after the refusals: %+v %v", j, err)
	}
}

// Suspending or resuming a job the Kubernetes controller owns is refused
// the same way, naming the kubectl patch of spec.suspend; the job's
// suspension stays as it was.
func TestSuspendAndResumeOfAKubernetesJobRefused(t *testing.T) {
	ep, cli := startFleet(t, 1)
	st := fleet.New(cli, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.SubmitJob(ctx, fleet.JobSpec{Job: api.Job{Name: "sweep", Team: "research", MinNodes: 1, MaxNodes: 4, PerNode: api.Resources{Accelerators: 8}, SubmitTime: time.Now()},
		Run: fleet.RunSpec{Script: "train.py", Env: map[string]string{fleet.KubernetesOwnerEnv: "ml/sweep/0f3c"}}}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := ctl(t, ep, "suspend", "sweep")
	if code == 0 || !strings.Contains(errOut, `kubectl patch elasticjob sweep -n ml --type merge -p '{"spec":{"suspend":true}}'`) {
		t.Errorf("suspend of a Kubernetes job: exit %d\n%s%s", code, out, errOut)
	}
	if j, err := st.Job(ctx, "sweep"); err != nil || j.Suspended {
		t.Errorf("the spec after the refused suspend: %+v %v", j, err)
	}
	out, errOut, code = ctl(t, ep, "resume", "sweep")
	if code == 0 || !strings.Contains(errOut, `kubectl patch elasticjob sweep -n ml --type merge -p '{"spec":{"suspend":false}}'`) {
		t.Errorf("resume of a Kubernetes job: exit %d\n%s%s", code, out, errOut)
	}
}

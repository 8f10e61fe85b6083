package kubernetes_test

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	kube "github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes"
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
	// The shrink the user asked for is no Warning; -o wide lists the nodes.
	evs, err := e.cs.CoreV1().Events("ml").List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=sweep,reason=Shrunk"})
	if err != nil || len(evs.Items) == 0 {
		t.Errorf("no Shrunk event: %v\n%s", err, eventsText(t, e.cs, "sweep"))
	} else if evs.Items[0].Type != corev1.EventTypeNormal {
		t.Errorf("the shrink kubectl scale asked for is a %s event: %s", evs.Items[0].Type, evs.Items[0].Message)
	}
	out, err = e.s.Kubectl(t, "get", "ej", "sweep", "-n", "ml", "-o", "wide")
	if s := e.status("sweep"); err != nil || strings.Contains(out, "[") || !strings.Contains(out, strings.Join(s.Nodes, ",")) || len(s.Nodes) != 2 {
		t.Errorf("kubectl get -o wide (nodes %v): %v\n%s", s.Nodes, err, out)
	}
	// Below minReplicas: refused with the rule's message.
	out, err = e.s.Kubectl(t, "scale", "-n", "ml", "elasticjob/sweep", "--replicas=0")
	if err == nil || !strings.Contains(out, "maxReplicas") {
		t.Errorf("kubectl scale --replicas=0: %v\n%s", err, out)
	}
}

// Names that cannot become a job name in the fleet are refused at
// admission, with the rule's message; every status the controller sets
// comes with an Event (NameTaken, Starting, Running).
func TestNamesAtAdmissionAndStatusEvents(t *testing.T) {
	e := startEnv(t, envOptions{})
	for _, name := range []string{"my.job.v2", "a" + strings.Repeat("b", 67) + "c"} {
		_, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob(name, "research", "", 1, 1), metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "metadata.name must be a DNS-1123 label") || !strings.Contains(err.Error(), "job's name in the fleet") {
			t.Errorf("create %q: %v", name, err)
		}
	}
	if err := e.st.SubmitJob(e.ctx, fleet.JobSpec{Job: api.Job{Name: "taken", Team: "prod", PerNode: api.Resources{Accelerators: 8}, SubmitTime: time.Now()},
		Run: fleet.RunSpec{Script: "x.py"}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"taken", "good"} {
		if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob(name, "research", "", 1, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "a NameTaken Warning Event on taken", func() (bool, string) {
		return slices.Contains(eventReasons(t, e.cs, "taken"), kube.CodeNameTaken), eventsText(t, e.cs, "taken")
	})
	waitFor(t, time.Minute, "Starting and Running Events on good", func() (bool, string) {
		r := eventReasons(t, e.cs, "good")
		return slices.Contains(r, v1alpha1.PhaseStarting) && slices.Contains(r, v1alpha1.PhaseRunning), eventsText(t, e.cs, "good")
	})
}

// When the API server refuses the job's pods (here: the namespace has no
// "default" ServiceAccount), the status says so and a Warning Event comes
// within seconds of the coordinator's admission.
func TestPodCreationFailureIsReportedAtOnce(t *testing.T) {
	e := startEnv(t, envOptions{})
	if err := e.cs.CoreV1().ServiceAccounts("ml").Delete(e.ctx, "default", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob("nosa", "research", "", 1, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "nosa admitted", func() (bool, string) {
		d, err := e.st.Desired(e.ctx, "nosa")
		return err == nil && d.Running(), fmt.Sprintf("%+v %v", d, err)
	})
	admitted := time.Now()
	waitFor(t, 5*time.Second, "the status and a Warning Event say the pod cannot be created", func() (bool, string) {
		s := e.status("nosa")
		c := meta.FindStatusCondition(s.Conditions, v1alpha1.ConditionRunning)
		ok := s.Reason == kube.ReasonPodCreateFailed && strings.Contains(s.Message, "service account") && s.DesiredReplicas == 1 &&
			c != nil && c.Reason == kube.ReasonPodCreateFailed && slices.Contains(eventReasons(t, e.cs, "nosa"), "PodFailed")
		return ok, fmt.Sprintf("%+v\nevents:\n%s", s, eventsText(t, e.cs, "nosa"))
	})
	t.Logf("reported %s after admission", time.Since(admitted).Round(time.Millisecond))
}

// A pod whose container fails stays for its logs (kubectl logs) while a
// new pod replaces it; job pods mount no ServiceAccount token.
func TestFailedPodKeptAndNoServiceAccountToken(t *testing.T) {
	e := startEnv(t, envOptions{})
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob("crash", "research", "", 1, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var first *corev1.Pod
	waitFor(t, time.Minute, "crash runs", func() (bool, string) {
		pods, _ := livePods(t, e.cs, "crash")
		for _, p := range pods {
			first = p
		}
		return len(pods) == 1, fmt.Sprintf("%d pods", len(pods))
	})
	if a := first.Spec.AutomountServiceAccountToken; a == nil || *a {
		t.Errorf("automountServiceAccountToken: %v", a)
	}
	for _, v := range first.Spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access") {
			t.Errorf("the job pod mounts a ServiceAccount token: volume %s", v.Name)
		}
	}
	// The container crashes (exit 143, not deleted).
	e.k.mu.Lock()
	r := e.k.runs[first.UID]
	e.k.mu.Unlock()
	if r == nil {
		t.Fatal("the kubelet does not run the pod")
	}
	r.sig <- syscall.SIGTERM
	waitFor(t, time.Minute, "a new pod runs and the failed one is kept", func() (bool, string) {
		pods, all := livePods(t, e.cs, "crash")
		old, err := e.cs.CoreV1().Pods("ml").Get(e.ctx, first.Name, metav1.GetOptions{})
		s := e.status("crash")
		return len(pods) == 1 && all == 2 && err == nil && old.Status.Phase == corev1.PodFailed && old.DeletionTimestamp == nil &&
				s.ReplicaStatuses.Failed == 1 && s.ReplicaStatuses.Active == 1 && s.CurrentReplicas == 1,
			fmt.Sprintf("%d live of %d; old: %v; status %+v", len(pods), all, err, s)
	})
	if txt := eventsText(t, e.cs, "crash"); !strings.Contains(txt, "kept for its logs") {
		t.Errorf("no event says the failed pod is kept:\n%s", txt)
	}
}

// A new job whose ElasticTeam exists is never told its team is missing,
// even when the team's record is not in etcd yet (the team bridge has not
// run since a start; here the record is deleted and the bridge's resync
// is long): the controller applies the team before it submits the job.
func TestNewJobsTeamAppliedFirst(t *testing.T) {
	e := startEnv(t, envOptions{Resync: time.Minute})
	if _, err := e.s.Etcd.Delete(e.ctx, e.st.Keys.Team("research")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob("early", "research", "", 1, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "early runs", func() (bool, string) {
		s := e.status("early")
		return s.Phase == v1alpha1.PhaseRunning, fmt.Sprintf("%+v", s)
	})
	if txt := eventsText(t, e.cs, "early"); strings.Contains(txt, string(api.CodeTeamNotFound)) || strings.Contains(txt, "does not exist") {
		t.Errorf("the job was told its team is missing:\n%s", txt)
	}
}

// A job running as admitted has no status record in etcd (the coordinator
// writes none): the ElasticJob's status still names the decision, the one
// its desired record implies (fleet.StatusOf), as kubectl shows it.
func TestRunningJobsDecisionComesFromItsDesiredRecord(t *testing.T) {
	e := startEnv(t, envOptions{})
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob("fixed", "research", "", 1, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "fixed running, its decision Running", func() (bool, string) {
		s := e.status("fixed")
		return s.Phase == v1alpha1.PhaseRunning && s.Decision == string(api.KindRunning) && s.Message != "", fmt.Sprintf("%+v", s)
	})
	if rec, err := e.st.StatusRecord(e.ctx, "fixed"); err != nil || rec != nil {
		t.Errorf("fixed's status record: %+v %v; want none (it runs as admitted)", rec, err)
	}
}

package kubernetes_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	kube "github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

func (e *env) update(name string, f func(*v1alpha1.ElasticJob)) {
	e.t.Helper()
	for range 10 {
		j, err := e.cl.ElasticJobs("ml").Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		f(j)
		if _, err = e.cl.ElasticJobs(j.Namespace).Update(e.ctx, j, metav1.UpdateOptions{}); err == nil {
			return
		} else if !apierrors.IsConflict(err) {
			e.t.Fatal(err)
		}
	}
	e.t.Fatal("update kept conflicting")
}

// spec.suspend drains the job's pods (none is killed while running) and
// brings them back; a spec that cannot run and a name another job holds
// are Invalid in the status, with a message that says why; cordoned Nodes
// are draining in the fleet, a node agent's own record wins over the Node's.
func TestSuspendInvalidNamesAndNodes(t *testing.T) {
	e := startEnv(t, envOptions{})
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob("sweep", "research", "", 1, 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "sweep on 2 nodes", func() (bool, string) {
		pods, _ := livePods(t, e.cs, "sweep")
		s := e.status("sweep")
		return len(pods) == 2 && s.CurrentReplicas == 2, fmt.Sprintf("%+v", s)
	})
	e.update("sweep", func(j *v1alpha1.ElasticJob) { j.Spec.Suspend = true })
	waitFor(t, time.Minute, "sweep suspended, its pods drained and gone", func() (bool, string) {
		_, all := livePods(t, e.cs, "sweep")
		s := e.status("sweep")
		return all == 0 && s.Phase == v1alpha1.PhaseSuspended && s.DesiredReplicas == 0, fmt.Sprintf("%d pods, %+v", all, s)
	})
	e.k.mu.Lock()
	killed := append([]string(nil), e.k.killed...)
	e.k.mu.Unlock()
	if len(killed) != 0 {
		t.Errorf("suspending deleted running pods %q instead of draining them", killed)
	}
	e.update("sweep", func(j *v1alpha1.ElasticJob) { j.Spec.Suspend = false })
	waitFor(t, time.Minute, "sweep resumed on 2 nodes", func() (bool, string) {
		pods, _ := livePods(t, e.cs, "sweep")
		s := e.status("sweep")
		return len(pods) == 2 && s.Phase == v1alpha1.PhaseRunning && s.CurrentReplicas == 2, fmt.Sprintf("%+v", s)
	})
	if out, err := e.s.Kubectl(t, "describe", "elasticjob", "-n", "ml", "sweep"); err != nil || !strings.Contains(out, "Suspended") || !strings.Contains(out, "Drained") {
		t.Errorf("kubectl describe: %v\n%s", err, out)
	}

	// A spec that cannot run.
	bad := elasticJob("bad", "research", "", 1, 2)
	bad.Spec.Template.Spec.Containers[0].Command = []string{"torchrun", "--nproc-per-node=8", "train.py"}
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "bad is Invalid", func() (bool, string) {
		s := e.status("bad")
		return s.Phase == v1alpha1.PhaseInvalid && s.Reason == string(api.CodeInvalidSpec) && strings.Contains(s.Message, "starts with torchrun"), fmt.Sprintf("%+v", s)
	})
	if _, err := e.st.Job(e.ctx, "bad"); err == nil {
		t.Error("an invalid ElasticJob reached etcd")
	}
	// A name elasticctl's job holds.
	if err := e.st.SubmitJob(e.ctx, fleet.JobSpec{Job: api.Job{Name: "taken", Team: "prod", PerNode: api.Resources{Accelerators: 8}, SubmitTime: time.Now()},
		Run: fleet.RunSpec{Script: "x.py"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob("taken", "research", "", 1, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "taken is NameTaken", func() (bool, string) {
		s := e.status("taken")
		return s.Phase == v1alpha1.PhaseInvalid && s.Reason == kube.CodeNameTaken && strings.Contains(s.Message, "elasticctl"), fmt.Sprintf("%+v", s)
	})
	if spec, err := e.st.Job(e.ctx, "taken"); err != nil || spec.Team != "prod" || spec.Run.Env[kube.OwnerEnv] != "" {
		t.Errorf("elasticctl's job was touched: %+v %v", spec, err)
	}
	// Deleting it leaves elasticctl's job alone.
	if err := e.cl.ElasticJobs("ml").Delete(e.ctx, "taken", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "taken's ElasticJob gone", func() (bool, string) {
		_, err := e.cl.ElasticJobs("ml").Get(e.ctx, "taken", metav1.GetOptions{})
		return apierrors.IsNotFound(err), errString(err)
	})
	if _, err := e.st.Job(e.ctx, "taken"); err != nil {
		t.Errorf("elasticctl's job went with the ElasticJob of the same name: %v", err)
	}

	// Nodes: cordoned -> draining; an agent's record wins; a deleted Node goes.
	n4, err := e.cs.CoreV1().Nodes().Get(e.ctx, "n4", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n4.Spec.Unschedulable = true
	if _, err := e.cs.CoreV1().Nodes().Update(e.ctx, n4, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	l, err := e.s.Etcd.Grant(e.ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	agent := devices.Inventory{Node: "n3", State: devices.StateReady, Flavor: "nvidia-h100-80gb", Flavors: []string{"nvidia-h100-80gb"}, Hostname: "agent-n3",
		Accelerators: []devices.Accelerator{{Kind: devices.KindNVIDIA, Flavor: "nvidia-h100-80gb", Name: "NVIDIA H100 80GB HBM3", Healthy: true, Minor: 0}}}
	op, _ := e.st.PutNodeOp(agent, clientv3.WithLease(l.ID))
	if _, err := e.s.Etcd.Do(e.ctx, op); err != nil {
		t.Fatal(err)
	}
	if err := e.cs.CoreV1().Nodes().Delete(e.ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "n4 draining, n2 gone", func() (bool, string) {
		nodes, _, _ := e.st.Nodes(e.ctx)
		state := map[string]string{}
		for _, n := range nodes {
			state[n.Node] = n.State
		}
		kn, _ := e.cs.CoreV1().Nodes().List(e.ctx, metav1.ListOptions{})
		var names []string
		for _, n := range kn.Items {
			names = append(names, n.Name+fmt.Sprint(n.DeletionTimestamp != nil, n.Finalizers))
		}
		return state["n4"] == devices.StateDraining && state["n2"] == "", fmt.Sprintf("%v; Kubernetes nodes %v", state, names)
	})
	time.Sleep(2500 * time.Millisecond) // two of the bridge's resyncs (1s)
	r, err := e.s.Etcd.Get(e.ctx, e.st.Keys.Node("n3"))
	if err != nil || len(r.Kvs) != 1 || r.Kvs[0].Lease != int64(l.ID) {
		t.Fatalf("the agent's record of n3 was replaced: %+v %v", r, err)
	}
	var got devices.Inventory
	json.Unmarshal(r.Kvs[0].Value, &got)
	if got.Hostname != "agent-n3" {
		t.Errorf("n3's record: %+v", got)
	}
}

// With etcd auth on, the job's pods wait for the credentials the
// coordinator mints; they get them through a Secret (the controller can
// write it but not read Secrets), deleted with the job.
func TestCredentialsSecret(t *testing.T) {
	e := startEnv(t, envOptions{Auth: true})
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob("sweep", "research", "", 1, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "sweep placed", func() (bool, string) {
		s := e.status("sweep")
		return s.DesiredReplicas == 1, fmt.Sprintf("%+v", s)
	})
	time.Sleep(1500 * time.Millisecond)
	if _, all := livePods(t, e.cs, "sweep"); all != 0 {
		t.Fatalf("%d pods without credentials", all)
	}
	creds, _ := json.Marshal(fleet.JobCreds{Job: "sweep", User: "hyperpod-job-sweep", Password: "s3cret"})
	if _, err := e.s.Etcd.Put(e.ctx, e.st.Keys.Creds("sweep"), string(creds)); err != nil {
		t.Fatal(err)
	}
	var pod *corev1.Pod
	waitFor(t, time.Minute, "a pod with the credentials", func() (bool, string) {
		pods, _ := livePods(t, e.cs, "sweep")
		for _, p := range pods {
			pod = p
		}
		return pod != nil, "no pod"
	})
	sec, err := e.cs.CoreV1().Secrets("ml").Get(e.ctx, "sweep-etcd", metav1.GetOptions{})
	if err != nil || string(sec.Data["user"]) != "hyperpod-job-sweep" || string(sec.Data["password"]) != "s3cret\n" {
		t.Fatalf("Secret: %+v %v", sec, err)
	}
	cmd := strings.Join(pod.Spec.Containers[0].Command, " ")
	if !strings.Contains(cmd, "user=$(HYPERPODRUN_ETCD_USER),password_file=/etc/hyperpodrun/etcd/password") || strings.Contains(cmd, "s3cret") {
		t.Errorf("command: %s", cmd)
	}
	mounted := false
	for _, v := range pod.Spec.Volumes {
		mounted = mounted || v.Secret != nil && v.Secret.SecretName == "sweep-etcd"
	}
	if !mounted {
		t.Error("the Secret is not mounted")
	}
	if err := e.cl.ElasticJobs("ml").Delete(e.ctx, "sweep", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "sweep, its pods and its Secret gone", func() (bool, string) {
		_, all := livePods(t, e.cs, "sweep")
		_, jerr := e.cl.ElasticJobs("ml").Get(e.ctx, "sweep", metav1.GetOptions{})
		_, serr := e.cs.CoreV1().Secrets("ml").Get(e.ctx, "sweep-etcd", metav1.GetOptions{})
		return all == 0 && apierrors.IsNotFound(jerr) && apierrors.IsNotFound(serr), fmt.Sprintf("%d pods, job %v, secret %v", all, jerr, serr)
	})
}

// Two controllers: one holds the Lease and works; when it stops, the other
// takes the Lease over and carries on with the same jobs.
func TestLeaderElection(t *testing.T) {
	e := startEnv(t, envOptions{LeaderElection: true})
	leader := e.oneLeader()
	holder := func() string {
		l, err := e.cs.CoordinationV1().Leases("hyperpodrun").Get(e.ctx, "hyperpod-kube-controller", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	if h := holder(); h != fmt.Sprintf("ctl-%d", leader) {
		t.Fatalf("Lease held by %q, leader is ctl-%d", h, leader)
	}
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob("sweep", "research", "", 1, 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "sweep on 2 nodes", func() (bool, string) {
		pods, _ := livePods(t, e.cs, "sweep")
		return len(pods) == 2, fmt.Sprintf("%d pods", len(pods))
	})
	e.cancels[leader]()
	other := 1 - leader
	waitFor(t, 30*time.Second, "the other controller leads", func() (bool, string) {
		return e.ctls[other].Leading() && !e.ctls[leader].Leading() && holder() == fmt.Sprintf("ctl-%d", other), "holder " + holder()
	})
	// The new leader works: a suspension drains the pods.
	e.update("sweep", func(j *v1alpha1.ElasticJob) { j.Spec.Suspend = true })
	waitFor(t, time.Minute, "sweep suspended by the new leader", func() (bool, string) {
		_, all := livePods(t, e.cs, "sweep")
		return all == 0 && e.status("sweep").Phase == v1alpha1.PhaseSuspended, fmt.Sprintf("%d pods", all)
	})
}

// With etcd auth on, the controller runs as its own etcd user
// (hyperpod-kube-controller: specs, teams, node and finish records; not
// root, no decisions) and the coordinator as its own, minting each job's
// credentials: ElasticTeams become team records, the ElasticJob's spec is
// submitted, its pod gets the job's real minted credentials through the
// Secret and runs, and deleting the job removes the pod, the Secret, the
// spec and the job's etcd user.
func TestControllerAsItsOwnEtcdUser(t *testing.T) {
	e := startEnv(t, envOptions{EtcdAuth: true})
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob("sweep", "research", "", 1, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "sweep running on one pod with its minted credentials", func() (bool, string) {
		s := e.status("sweep")
		pods, _ := livePods(t, e.cs, "sweep")
		creds, err := e.st.Creds(e.ctx, "sweep")
		if err != nil || creds == nil {
			return false, fmt.Sprintf("status %+v, credentials %v %v", s, creds, err)
		}
		sec, err := e.cs.CoreV1().Secrets("ml").Get(e.ctx, "sweep-etcd", metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprintf("status %+v, Secret %v", s, err)
		}
		ok := s.Phase == v1alpha1.PhaseRunning && s.CurrentReplicas == 1 && len(pods) == 1 &&
			string(sec.Data["user"]) == etcdauth.JobRole("sweep") && strings.TrimSpace(string(sec.Data["password"])) == creds.Password
		return ok, fmt.Sprintf("status %+v, %d pods, Secret user %q", s, len(pods), sec.Data["user"])
	})
	if err := e.cl.ElasticJobs("ml").Delete(e.ctx, "sweep", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "sweep's pods, Secret, spec and etcd user gone", func() (bool, string) {
		_, all := livePods(t, e.cs, "sweep")
		_, serr := e.cs.CoreV1().Secrets("ml").Get(e.ctx, "sweep-etcd", metav1.GetOptions{})
		_, jerr := e.st.Job(e.ctx, "sweep")
		creds, cerr := e.st.Creds(e.ctx, "sweep")
		return all == 0 && apierrors.IsNotFound(serr) && errors.Is(jerr, fleet.ErrNotFound) && creds == nil && cerr == nil,
			fmt.Sprintf("%d pods, Secret %v, spec %v, credentials %v %v", all, serr, jerr, creds != nil, cerr)
	})
}

package kubernetes_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiext "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hyperpodrun/hyperpodrun/internal/kubetest"
	kube "github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/manifests"
)

// These tests run a real kube-apiserver (internal/kubetest): CRD
// registration and validation, RBAC with ServiceAccount tokens, the status
// subresource, Events, watches and Leases are the API server's own.

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("after %s: %s; last seen: %s", timeout, what, last)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// installCRDs creates the generated CRDs and waits until they serve.
func installCRDs(t *testing.T, s *kubetest.Server) {
	t.Helper()
	crds, err := manifests.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := apiext.NewForConfig(s.Admin())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, time.Minute)
	for _, c := range crds {
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatalf("register %s: %v", c.Name, err)
		}
	}
	for _, c := range crds {
		waitFor(t, time.Minute, c.Name+" established", func() (bool, string) {
			got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, c.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue {
					return true, ""
				}
			}
			return false, "not established"
		})
	}
	// The resource answers (discovery can lag the condition).
	cl, _ := kube.NewClient(s.Admin())
	waitFor(t, 30*time.Second, "elasticjobs served", func() (bool, string) {
		_, err := cl.ElasticJobs("default").Get(ctx, "none", metav1.GetOptions{})
		return apierrors.IsNotFound(err), "get: " + errString(err)
	})
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// controllerIdentity creates the controller's ServiceAccount with exactly
// the generated RBAC (manifests.ClusterRole, LeaderRole) and returns a
// client configuration with its token.
func controllerIdentity(t *testing.T, s *kubetest.Server) *rest.Config {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	s.Namespace(t, manifests.Namespace)
	cs := s.Clientset(t)
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, manifests.ClusterRole(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, manifests.ClusterRoleBinding(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().Roles(manifests.Namespace).Create(ctx, manifests.LeaderRole(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(manifests.Namespace).Create(ctx, manifests.LeaderRoleBinding(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return s.Config(s.ServiceAccountToken(t, manifests.Namespace, manifests.Controller))
}

func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// The CRDs register, their OpenAPI and CEL validation refuse bad specs
// with messages that say what is wrong, status is a subresource, and the
// printer columns make kubectl get useful.
func TestCRDsOnARealAPIServer(t *testing.T) {
	s := kubetest.Start(t)
	installCRDs(t, s)
	s.Namespace(t, "ml")
	cl, err := kube.NewClient(s.Admin())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 2*time.Minute)
	good := func() *v1alpha1.ElasticJob {
		return &v1alpha1.ElasticJob{ObjectMeta: metav1.ObjectMeta{Name: "sweep", Namespace: "ml"}, Spec: v1alpha1.ElasticJobSpec{
			Team: "research", ElasticPolicy: v1alpha1.ElasticPolicy{MinReplicas: 1, MaxReplicas: 4}}}
	}
	p := int32(100)
	for _, tc := range []struct {
		mod  func(*v1alpha1.ElasticJob)
		want string
	}{
		{func(j *v1alpha1.ElasticJob) { j.Spec.ElasticPolicy.MinReplicas = 5 }, "maxReplicas must be at least minReplicas"},
		{func(j *v1alpha1.ElasticJob) {
			j.Spec.ElasticPolicy.ReplicaIncrementStep = 2
			j.Spec.ElasticPolicy.ReplicaDiscreteValues = []int32{1, 2}
		}, "not both"},
		{func(j *v1alpha1.ElasticJob) { j.Spec.ElasticPolicy.ReplicaDiscreteValues = []int32{2, 2} }, "must not repeat"},
		{func(j *v1alpha1.ElasticJob) { j.Spec.Team = "Research_Team" }, "spec.team"},
		{func(j *v1alpha1.ElasticJob) { j.Spec.Priority = &p }, "spec.priority"},
		{func(j *v1alpha1.ElasticJob) { q := int32(1); j.Spec.Priority = &q; j.Spec.PriorityClassName = "low" }, "set priority or priorityClassName, not both"},
		{func(j *v1alpha1.ElasticJob) { j.Spec.ElasticPolicy.GracefulShutdownTimeoutInSeconds = -1 }, "gracefulShutdownTimeoutInSeconds"},
	} {
		j := good()
		tc.mod(j)
		_, err := cl.ElasticJobs("ml").Create(ctx, j, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want Invalid with %q, got %v", tc.want, err)
		}
	}
	j, err := cl.ElasticJobs("ml").Create(ctx, good(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	j.Spec.Team = "prod"
	if _, err := cl.ElasticJobs(j.Namespace).Update(ctx, j, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "team is immutable") {
		t.Errorf("team change: %v", err)
	}
	// Status is a subresource: the main resource ignores it, /status takes it.
	j, _ = cl.ElasticJobs("ml").Get(ctx, "sweep", metav1.GetOptions{})
	j.Status = v1alpha1.ElasticJobStatus{Phase: v1alpha1.PhaseRunning, CurrentReplicas: 3, DesiredReplicas: 4, Reason: "Borrowing"}
	if j, err = cl.ElasticJobs(j.Namespace).Update(ctx, j, metav1.UpdateOptions{}); err != nil || j.Status.Phase != "" {
		t.Fatalf("status through the main resource: %v %+v", err, j.Status)
	}
	j.Status = v1alpha1.ElasticJobStatus{Phase: v1alpha1.PhaseRunning, CurrentReplicas: 3, DesiredReplicas: 4, Reason: "Borrowing"}
	j.Spec.ElasticPolicy.MaxReplicas = 8
	if j, err = cl.ElasticJobs(j.Namespace).UpdateStatus(ctx, j, metav1.UpdateOptions{}); err != nil || j.Status.CurrentReplicas != 3 || j.Spec.ElasticPolicy.MaxReplicas != 4 {
		t.Fatalf("status subresource: %v status %+v max %d", err, j.Status, j.Spec.ElasticPolicy.MaxReplicas)
	}
	out, err := s.Kubectl(t, "get", "elasticjobs", "-n", "ml")
	if err != nil {
		t.Fatalf("kubectl get: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME TEAM PHASE CURRENT DESIRED MIN MAX REASON AGE" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "sweep research Running 3 4 1 4 Borrowing") {
		t.Errorf("kubectl get elasticjobs:\n%s", out)
	}
	if out, err := s.Kubectl(t, "get", "ej", "-n", "ml", "-o", "wide"); err != nil || !strings.Contains(out, "MESSAGE") {
		t.Errorf("short name and wide columns: %v\n%s", err, out)
	}
}

// The whole install applies: kubectl apply -f examples/kubernetes/, then
// the example teams and job once the CRDs serve.
func TestKubectlApplyExamples(t *testing.T) {
	s := kubetest.Start(t)
	dir := filepath.Join(repoRoot(t), "examples", "kubernetes")
	if out, err := s.Kubectl(t, "apply", "-f", dir); err != nil {
		t.Fatalf("kubectl apply -f examples/kubernetes/: %v\n%s", err, out)
	}
	if out, err := s.Kubectl(t, "wait", "--for=condition=established", "--timeout=60s", "crd/elasticjobs.hyperpodrun.io", "crd/elasticteams.hyperpodrun.io"); err != nil {
		t.Fatalf("kubectl wait: %v\n%s", err, out)
	}
	var out string
	waitFor(t, time.Minute, "kubectl apply -f examples/kubernetes/jobs/", func() (bool, string) {
		o, err := s.Kubectl(t, "apply", "-f", filepath.Join(dir, "jobs"))
		out = o
		return err == nil, o
	})
	for _, w := range []string{"elasticteam.hyperpodrun.io/research created", "elasticteam.hyperpodrun.io/prod created", "elasticjob.hyperpodrun.io/llama-sweep created"} {
		if !strings.Contains(out, w) {
			t.Errorf("kubectl apply output lacks %q:\n%s", w, out)
		}
	}
	// Applying again changes nothing.
	if out, err := s.Kubectl(t, "apply", "-f", dir); err != nil || strings.Contains(out, "configured") {
		t.Errorf("second apply: %v\n%s", err, out)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if len(files) < 6 {
		t.Errorf("examples/kubernetes has %d manifests", len(files))
	}
	if _, err := os.Stat(filepath.Join(dir, "crds.yaml")); err != nil {
		t.Error(err)
	}
}

// The controller's ServiceAccount holds exactly the generated RBAC: what
// it needs works, Secrets cannot be read and pods cannot be exec'd.
func TestControllerRBACIsLeastPrivilege(t *testing.T) {
	s := kubetest.Start(t)
	installCRDs(t, s)
	cfg := controllerIdentity(t, s)
	s.Namespace(t, "ml")
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, time.Minute)
	cl, _ := kube.NewClient(cfg)
	if _, err := cl.ElasticJobs("ml").Get(ctx, "nothing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("get elasticjobs: %v", err)
	}
	if _, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list nodes: %v", err)
	}
	if _, err := cs.CoreV1().Secrets("ml").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the controller may list Secrets: %v", err)
	}
	if _, err := cs.CoreV1().Secrets(manifests.Namespace).Get(ctx, "hyperpod-etcd-tls", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the controller may read Secrets: %v", err)
	}
	if err := cs.CoreV1().Nodes().Delete(ctx, "x", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the controller may delete nodes: %v", err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the controller may create roles: %v", err)
	}
	res := cs.CoreV1().RESTClient().Post().Namespace("ml").Resource("pods").Name("p").SubResource("exec").Do(ctx)
	if err := res.Error(); !apierrors.IsForbidden(err) {
		t.Errorf("the controller may exec into pods: %v", err)
	}
	if _, err := cs.CoordinationV1().Leases("ml").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the controller may read Leases outside its namespace: %v", err)
	}
}

// Package kubernetes_test checks the example manifests: every document
// decodes strictly (unknown or duplicate fields fail) into its k8s.io/api
// type, and the DaemonSets carry what hyperpod-agent needs.
package kubernetes_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

type object interface {
	GetName() string
	GetNamespace() string
}

// newObject returns an empty typed object for apiVersion/kind.
func newObject(apiVersion, kind string) object {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}
	case "v1 Secret":
		return &corev1.Secret{}
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		return &rbacv1.ClusterRole{}
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}
	case "rbac.authorization.k8s.io/v1 Role":
		return &rbacv1.Role{}
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return &rbacv1.RoleBinding{}
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}
	case "apiextensions.k8s.io/v1 CustomResourceDefinition":
		return &apiextv1.CustomResourceDefinition{}
	case "hyperpodrun.io/v1alpha1 ElasticJob":
		return &v1alpha1.ElasticJob{}
	case "hyperpodrun.io/v1alpha1 ElasticTeam":
		return &v1alpha1.ElasticTeam{}
	}
	return nil
}

// splitDocs splits a multi-document YAML stream, dropping empty documents.
func splitDocs(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if strings.TrimSpace(stripComments(cur.String())) != "" {
			docs = append(docs, append([]byte(nil), cur.Bytes()...))
		}
		cur.Reset()
	}
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if strings.TrimRight(line, " \r\n") == "---" {
			flush()
			continue
		}
		cur.WriteString(line)
	}
	flush()
	return docs
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// loadAll strictly decodes every document of every *.yaml file here
// (and in jobs/, the example ElasticTeams and ElasticJobs).
func loadAll(t *testing.T) []object {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	more, _ := filepath.Glob("jobs/*.yaml")
	files = append(files, more...)
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var objs []object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitDocs(data) {
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s doc %d: %v", f, i, err)
			}
			obj := newObject(tm.APIVersion, tm.Kind)
			if obj == nil {
				t.Fatalf("%s doc %d: unexpected %s %s", f, i, tm.APIVersion, tm.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Fatalf("%s doc %d (%s): %v", f, i, tm.Kind, err)
			}
			if obj.GetName() == "" {
				t.Fatalf("%s doc %d (%s): no name", f, i, tm.Kind)
			}
			objs = append(objs, obj)
		}
	}
	return objs
}

// The strict decoder really rejects what a typo would produce.
func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      tolerration: []\n",
		"apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x, name: y}\n",
	} {
		if err := yaml.UnmarshalStrict([]byte(doc), &appsv1.DaemonSet{}); err == nil {
			t.Errorf("accepted:\n%s", doc)
		}
	}
	if got := len(splitDocs([]byte("# c\n---\na: 1\n---\n\n---\nb: 2\n"))); got != 2 {
		t.Errorf("splitDocs found %d documents, want 2", got)
	}
}

func TestManifests(t *testing.T) {
	objs := loadAll(t)
	serviceAccounts := map[string]bool{}
	var daemonSets []*appsv1.DaemonSet
	kinds := map[string]int{}
	for _, o := range objs {
		switch v := o.(type) {
		case *corev1.ServiceAccount:
			serviceAccounts[v.Namespace+"/"+v.Name] = true
			kinds["ServiceAccount"]++
		case *appsv1.DaemonSet:
			daemonSets = append(daemonSets, v)
			kinds["DaemonSet"]++
		case *rbacv1.ClusterRoleBinding:
			kinds["ClusterRoleBinding"]++
			for _, s := range v.Subjects {
				if s.Kind == "ServiceAccount" && !serviceAccounts[s.Namespace+"/"+s.Name] {
					t.Errorf("ClusterRoleBinding %s binds unknown ServiceAccount %s/%s", v.Name, s.Namespace, s.Name)
				}
			}
		case *rbacv1.ClusterRole:
			kinds["ClusterRole"]++
		case *corev1.Namespace:
			kinds["Namespace"]++
		case *networkingv1.NetworkPolicy:
			kinds["NetworkPolicy"]++
			checkMetricsPolicy(t, v)
		}
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "NetworkPolicy"} {
		if kinds[k] == 0 {
			t.Errorf("no %s manifest", k)
		}
	}
	if len(daemonSets) != 2 {
		t.Fatalf("%d DaemonSets, want the NVIDIA one and the other-nodes one", len(daemonSets))
	}
	for _, ds := range daemonSets {
		t.Run(ds.Name, func(t *testing.T) { checkDaemonSet(t, ds, serviceAccounts) })
	}
}

func checkDaemonSet(t *testing.T, ds *appsv1.DaemonSet, serviceAccounts map[string]bool) {
	spec := ds.Spec.Template.Spec
	if !serviceAccounts[ds.Namespace+"/"+spec.ServiceAccountName] {
		t.Errorf("ServiceAccount %q not defined in %s", spec.ServiceAccountName, ds.Namespace)
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || sel.Empty() {
		t.Fatalf("selector: %v", err)
	}
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod template", k, v)
		}
	}
	tolerateAll := false
	for _, tol := range spec.Tolerations {
		if tol.Operator == corev1.TolerationOpExists && tol.Key == "" {
			tolerateAll = true
		}
	}
	if !tolerateAll {
		t.Error("does not tolerate tainted accelerator nodes")
	}
	if spec.TerminationGracePeriodSeconds == nil || *spec.TerminationGracePeriodSeconds <= 30 {
		t.Error("grace period must exceed the agent's 30s drain")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"run ", "--node-name=$(NODE_NAME)", "--etcd-endpoints=https://", "--etcd-cacert=/etc/hyperpod/etcd-tls/",
		"--etcd-cert=/etc/hyperpod/etcd-tls/", "--etcd-key=/etc/hyperpod/etcd-tls/", "--dev-root=/host/dev",
		"--neuron-sysfs-root=/host/sys/devices/virtual/neuron_device", "--listen=$(POD_IP):9400", "--run-jobs=false"} {
		if !strings.Contains(args, want) {
			t.Errorf("args lack %q: %s", want, args)
		}
	}
	nodeName := false
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			nodeName = true
		}
	}
	if !nodeName {
		t.Error("NODE_NAME is not spec.nodeName")
	}
	// /metrics and /inventory are not published on every interface without
	// authentication: the agent listens on the pod's IP only.
	podIP := false
	for _, e := range c.Env {
		if e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP" {
			podIP = true
		}
	}
	if !podIP || strings.Contains(args, "0.0.0.0") || spec.HostNetwork {
		t.Errorf("the agent must listen on its pod IP (POD_IP from status.podIP), not 0.0.0.0 or the host network: %s", args)
	}
	nvidia := spec.RuntimeClassName != nil
	if nvidia {
		if *spec.RuntimeClassName != "nvidia" || env["NVIDIA_VISIBLE_DEVICES"] != "all" || !strings.Contains(env["NVIDIA_DRIVER_CAPABILITIES"], "utility") {
			t.Errorf("NVIDIA runtime settings: class %q env %v", *spec.RuntimeClassName, env)
		}
		if spec.NodeSelector["nvidia.com/gpu.present"] != "true" {
			t.Error("NVIDIA DaemonSet not restricted to GPU nodes")
		}
	} else if !strings.Contains(args, "--disable-nvml") || spec.Affinity == nil {
		t.Error("the non-NVIDIA DaemonSet must skip NVML and avoid GPU nodes")
	}

	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		if _, ok := volumes[m.Name]; !ok {
			t.Errorf("mount %s has no volume", m.Name)
		}
		mounts[m.MountPath] = m
	}
	hostPath := func(mountPath, hostDir string) {
		m, ok := mounts[mountPath]
		if !ok {
			t.Errorf("nothing mounted at %s", mountPath)
			return
		}
		v := volumes[m.Name]
		if v.HostPath == nil || v.HostPath.Path != hostDir {
			t.Errorf("%s is not the host's %s", mountPath, hostDir)
		}
		if !m.ReadOnly {
			t.Errorf("%s is not read-only", mountPath)
		}
	}
	hostPath("/host/sys", "/sys")
	hostPath("/host/dev", "/dev")
	if m, ok := mounts["/etc/hyperpod/etcd-tls"]; !ok || volumes[m.Name].Secret == nil || !m.ReadOnly {
		t.Error("etcd TLS Secret not mounted read-only at /etc/hyperpod/etcd-tls")
	}
	// Each pod enrolls as its own node's etcd user with its pod-bound token
	// (docs/kubernetes.md): the shared Secret is the enrollment user's only.
	for _, want := range []string{"--etcd-user=hyperpod-enroll", "--etcd-enroll=/var/run/secrets/hyperpodrun/enroll/token"} {
		if !strings.Contains(args, want) {
			t.Errorf("args lack %q: the agent pods do not enroll as their nodes' own etcd users", want)
		}
	}
	if m, ok := mounts["/var/run/secrets/hyperpodrun/enroll"]; !ok || volumes[m.Name].Projected == nil || len(volumes[m.Name].Projected.Sources) != 1 ||
		volumes[m.Name].Projected.Sources[0].ServiceAccountToken == nil || volumes[m.Name].Projected.Sources[0].ServiceAccountToken.Audience != "hyperpodrun-enroll" {
		t.Error("no projected ServiceAccount token of audience hyperpodrun-enroll at /var/run/secrets/hyperpodrun/enroll")
	}

	ports := map[string]bool{}
	for _, p := range c.Ports {
		ports[p.Name] = true
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/healthz" || !ports[c.ReadinessProbe.HTTPGet.Port.StrVal] {
		t.Error("readiness probe is not /healthz on a declared port")
	}
	sc := c.SecurityContext
	if sc == nil || sc.Privileged != nil && *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil || len(sc.Capabilities.Drop) == 0 {
		t.Errorf("security context too loose: %+v", sc)
	}
}

// checkMetricsPolicy: only the monitoring namespace's Prometheus reaches the
// agents' port 9400.
func checkMetricsPolicy(t *testing.T, np *networkingv1.NetworkPolicy) {
	if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "hyperpod-agent" {
		t.Errorf("NetworkPolicy %s does not select the agent pods", np.Name)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) == 0 || len(np.Spec.Ingress[0].Ports) != 1 ||
		np.Spec.Ingress[0].Ports[0].Port == nil || np.Spec.Ingress[0].Ports[0].Port.IntValue() != 9400 {
		t.Errorf("NetworkPolicy %s must admit only named peers to port 9400: %+v", np.Name, np.Spec.Ingress)
	}
	for _, f := range np.Spec.Ingress[0].From {
		if f.PodSelector == nil || len(f.PodSelector.MatchLabels) == 0 {
			t.Errorf("NetworkPolicy %s admits every pod of a namespace: %+v", np.Name, f)
		}
	}
}

package kubernetes

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/podsup"
)

// Labels and annotations the controller puts on its pods.
const (
	// JobLabel names the job a pod belongs to.
	JobLabel = "hyperpodrun.io/job"
	// GenerationAnnotation is the desired record's generation the pod was
	// created for.
	GenerationAnnotation = "hyperpodrun.io/allocation-generation"
	// Finalizer holds an ElasticJob until its pods are gone and its spec is
	// deleted.
	Finalizer = "hyperpodrun.io/pods"
)

// Paths inside the job's pods.
const (
	// ToolsDir is the emptyDir the init container copies hyperpodrun and
	// the pod supervisor into.
	ToolsDir = "/.hyperpodrun"
	// EtcdDir holds the job's etcd credentials (Secret CredsSecret).
	EtcdDir = "/etc/hyperpodrun/etcd"
	// DrainedMessage is what the pod supervisor writes to the container's
	// termination message when it drained hyperpodrun.
	DrainedMessage = podsup.DrainedMessage
	// TrainerName is the trainer container's name when the template leaves
	// it empty.
	TrainerName = "trainer"
)

// PodOptions are the controller's settings for the pods it creates.
type PodOptions struct {
	// Endpoints are the etcd endpoints the pods reach.
	Endpoints []string
	// Prefix is the fleet's etcd prefix.
	Prefix string
	// LauncherImage holds hyperpod-kube-controller and a static
	// hyperpodrun (the init container copies both into ToolsDir).
	LauncherImage string
	// Creds: the job's Secret (CredsSecret) holds an etcd user and password.
	Creds bool
	// CACert: the Secret holds ca.crt, the CA of etcd's server certificate.
	CACert bool
	// Generation is the desired record's generation.
	Generation int64
}

// CredsSecret names the Secret holding a job's etcd credentials.
func CredsSecret(job string) string { return job + "-etcd" }

// HyperpodrunArgs is hyperpodrun's command line for a job's pod (after
// the program's path): the etcd rendezvous with the job's bounds, as the
// node agent's runner builds it (agent/node/jobrunner.Args; a test compares).
func HyperpodrunArgs(spec fleet.JobSpec, o PodOptions) []string {
	minN, maxN := spec.Bounds()
	conf := "prefix=" + fleet.NormalizePrefix(o.Prefix)
	if o.CACert {
		conf += ",cacert=" + EtcdDir + "/ca.crt"
	}
	if o.Creds {
		conf += ",user=$(HYPERPODRUN_ETCD_USER),password_file=" + EtcdDir + "/password"
	}
	nproc := spec.Run.NProcPerNode
	if nproc == "" {
		nproc = "1"
	}
	args := []string{
		"--nnodes", fmt.Sprintf("%d:%d", minN, maxN), "--nproc-per-node", nproc,
		"--rdzv-backend", "etcd", "--rdzv-endpoint", strings.Join(o.Endpoints, ","),
		"--rdzv-id", spec.Name, "--rdzv-conf", conf,
		"--max-restarts", strconv.Itoa(spec.Run.MaxRestarts),
	}
	if spec.Run.GracefulTimeoutSeconds > 0 {
		args = append(args, "--graceful-timeout", strconv.FormatFloat(spec.Run.GracefulTimeoutSeconds, 'f', -1, 64))
	}
	switch {
	case spec.Run.NoPython:
		args = append(args, "--no-python")
	case spec.Run.Module:
		args = append(args, "-m")
	}
	return append(append(args, spec.Run.Script), spec.Run.Args...)
}

// SupervisorArgs is the pod supervisor's command line: it watches the
// job's desired record and drains hyperpodrun when the node leaves it.
func SupervisorArgs(spec fleet.JobSpec, node string, o PodOptions) []string {
	args := []string{path.Join(ToolsDir, "hyperpod-kube-controller"), "pod",
		"--etcd-endpoints=" + strings.Join(o.Endpoints, ","), "--etcd-prefix=" + fleet.NormalizePrefix(o.Prefix),
		"--job=" + spec.Name, "--node=" + node}
	if o.CACert {
		args = append(args, "--etcd-cacert="+EtcdDir+"/ca.crt")
	}
	if o.Creds {
		args = append(args, "--etcd-user=$(HYPERPODRUN_ETCD_USER)", "--etcd-password-file="+EtcdDir+"/password")
	}
	return append(append(args, "--", path.Join(ToolsDir, "hyperpodrun")), HyperpodrunArgs(spec, o)...)
}

// PodFor is the pod of job ej on node: the template, pinned to the node
// (nodeName), its first container running the worker under hyperpodrun
// under the pod supervisor, with the job's etcd credentials mounted.
func PodFor(ej *v1alpha1.ElasticJob, spec fleet.JobSpec, node string, o PodOptions) *corev1.Pod {
	tpl := ej.Spec.Template.DeepCopy()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: spec.Name + "-",
			Namespace:    ej.Namespace,
			Labels:       tpl.Labels,
			Annotations:  tpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "ElasticJob", Name: ej.Name, UID: ej.UID, Controller: ptr(true),
			}},
		},
		Spec: tpl.Spec,
	}
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	p.Labels[JobLabel] = spec.Name
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[GenerationAnnotation] = strconv.FormatInt(o.Generation, 10)
	p.Spec.NodeName = node
	p.Spec.RestartPolicy = corev1.RestartPolicyNever
	if p.Spec.AutomountServiceAccountToken == nil {
		// The trainer needs no Kubernetes API unless the template asks.
		p.Spec.AutomountServiceAccountToken = ptr(false)
	}
	if p.Spec.TerminationGracePeriodSeconds == nil {
		g := int64(spec.Run.GracefulTimeoutSeconds) + 30
		p.Spec.TerminationGracePeriodSeconds = &g
	}
	c := &p.Spec.Containers[0]
	if c.Name == "" {
		c.Name = TrainerName
	}
	c.Command, c.Args = SupervisorArgs(spec, node, o), nil
	c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	env := []corev1.EnvVar{{Name: "HYPERPODRUN_NODE_ID", Value: node}}
	if spec.Run.Python != "" {
		env = append(env, corev1.EnvVar{Name: "PYTHON_EXEC", Value: spec.Run.Python})
	}
	if o.Creds {
		env = append(env, corev1.EnvVar{Name: "HYPERPODRUN_ETCD_USER", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: CredsSecret(spec.Name)}, Key: "user"}}})
	}
	c.Env = append(env, c.Env...)
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "hyperpodrun-tools", MountPath: ToolsDir, ReadOnly: true})
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "hyperpodrun-tools", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	if o.Creds || o.CACert {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "hyperpodrun-etcd", MountPath: EtcdDir, ReadOnly: true})
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "hyperpodrun-etcd", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: CredsSecret(spec.Name), DefaultMode: ptr(int32(0o440))}}})
	}
	install := corev1.Container{
		Name: "hyperpodrun-install", Image: o.LauncherImage,
		Command:      []string{"hyperpod-kube-controller", "install", ToolsDir},
		VolumeMounts: []corev1.VolumeMount{{Name: "hyperpodrun-tools", MountPath: ToolsDir}},
	}
	p.Spec.InitContainers = append([]corev1.Container{install}, p.Spec.InitContainers...)
	return p
}

func ptr[T any](v T) *T { return &v }

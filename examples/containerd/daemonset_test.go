// Package containerd_test checks the containerd-mode DaemonSet manifest.
package containerd_test

import (
	"os"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The DaemonSet decodes strictly, mounts containerd's socket and the CDI
// directories, runs the containerd runtime, and mounts the run and log
// directories at their host paths (containerd resolves bind mounts on the
// host, so a path the agent hands it must be the same in the pod).
func TestContainerdDaemonSet(t *testing.T) {
	b, err := os.ReadFile("daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatalf("daemonset.yaml: %v", err)
	}
	spec := ds.Spec.Template.Spec
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	var agent *corev1.Container
	for i := range spec.Containers {
		if spec.Containers[i].Name == "agent" {
			agent = &spec.Containers[i]
		}
	}
	if agent == nil {
		t.Fatal("no agent container")
	}
	mounted := map[string]string{}
	for _, m := range agent.VolumeMounts {
		mounted[m.MountPath] = m.Name
	}
	for _, p := range []string{"/run/containerd/containerd.sock", "/etc/cdi", "/var/run/cdi", "/var/lib/hyperpodrun", "/var/log/hyperpodrun"} {
		name, ok := mounted[p]
		if !ok {
			t.Errorf("the agent does not mount %s", p)
			continue
		}
		if hostPaths[name] != p {
			t.Errorf("%s is mounted from host path %q; want the same path", p, hostPaths[name])
		}
	}
	for _, arg := range []string{"--runtime=containerd", "--job-run-dir=/var/lib/hyperpodrun/runs", "--job-log-dir=/var/log/hyperpodrun", "--cdi-spec-dir=/etc/cdi"} {
		if !slices.Contains(agent.Args, arg) {
			t.Errorf("agent args lack %s", arg)
		}
	}
	if !spec.HostNetwork {
		t.Error("the agent should use the host network (the rendezvous and NCCL see node addresses)")
	}
}

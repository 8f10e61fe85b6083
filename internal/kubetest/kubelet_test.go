package kubetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/internal/ociimage"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// A real kubelet registers its Node (Ready, the host's address), runs a
// host-network pod pinned to it from an image imported into its
// containerd (no registry), `kubectl logs` reads the container's output
// through the kubelet, and deleting the pod leaves no container in the CRI
// namespace running (the harness's cleanup then checks that no process of
// the node survives).
func TestKubeletRunsAPod(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kube-apiserver, containerd and a kubelet")
	}
	s := StartWith(t, Options{Nodes: []string{"node-a"}})
	start := time.Now()
	k := s.StartKubelet(t, "node-a")
	t.Logf("node-a Ready in %s", time.Since(start).Round(time.Millisecond))
	cs := s.Clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n, err := cs.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Status.Addresses) == 0 || n.Status.Addresses[0] != (corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: k.IP}) {
		t.Fatalf("node-a: addresses %v, want InternalIP %s first", n.Status.Addresses, k.IP)
	}

	img, err := ociimage.Build(ociimage.Spec{Files: []ociimage.File{{Path: "bin/busybox", Source: "/bin/busybox", Mode: 0o755},
		{Path: "bin/sh", Link: "busybox"}, {Path: "bin/echo", Link: "busybox"}}})
	if err != nil {
		t.Fatal(err)
	}
	tar := filepath.Join(t.TempDir(), "hello.tar")
	if err := ociimage.WriteTarball(img, "example.com/hello:v1", tar); err != nil {
		t.Fatal(err)
	}
	if err := k.Import(t, tar); err != nil {
		t.Fatal(err)
	}
	s.Namespace(t, "ns1")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hello"}, Spec: corev1.PodSpec{
		NodeName: "node-a", HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{Name: "c", Image: "example.com/hello:v1", ImagePullPolicy: corev1.PullNever,
			Command: []string{"/bin/sh", "-c", "echo hello-from-kubelet $(NODE)"},
			Env:     []corev1.EnvVar{{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}}},
	}}
	if _, err := cs.CoreV1().Pods("ns1").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Minute, "the pod Succeeded", func() (bool, string) {
		p, err := cs.CoreV1().Pods("ns1").Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodSucceeded, fmt.Sprintf("%s %+v", p.Status.Phase, p.Status.ContainerStatuses)
	})
	t.Logf("the pod Succeeded at %s", time.Since(start).Round(time.Millisecond))
	out, err := s.Kubectl(t, "logs", "-n", "ns1", "hello")
	if err != nil || strings.TrimSpace(out) != "hello-from-kubelet node-a" {
		t.Fatalf("kubectl logs: %v: %q", err, out)
	}
	if ents, _ := os.ReadDir(k.PodLogsDir); len(ents) != 1 || !strings.HasPrefix(ents[0].Name(), "ns1_hello_") {
		t.Errorf("pod logs dir: %v", ents)
	}

	if err := cs.CoreV1().Pods("ns1").Delete(ctx, "hello", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The kubelet stops the pod's containers at once; its garbage
	// collector removes them (and the log directory) within its period of
	// a minute, which this test does not wait for.
	testutil.Eventually(t, time.Minute, "the pod gone, no container task left", func() (bool, string) {
		_, err := cs.CoreV1().Pods("ns1").Get(ctx, "hello", metav1.GetOptions{})
		tasks, terr := k.Ctr("tasks", "ls", "-q")
		return apierrors.IsNotFound(err) && terr == nil && strings.TrimSpace(tasks) == "",
			fmt.Sprintf("pod: %v; tasks: %q %v", err, tasks, terr)
	})
	t.Logf("the pod and its tasks gone at %s", time.Since(start).Round(time.Millisecond))
}

package kubetest

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The harness gives a working API server: the admin may do anything, a
// fresh ServiceAccount's token nothing (RBAC is on), and kubectl works.
func TestAPIServer(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.Namespace(t, "ns1")
	cs := s.Clientset(t)
	if _, err := cs.CoreV1().ConfigMaps("ns1").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa, err := kubernetes.NewForConfig(s.Config(s.ServiceAccountToken(t, "ns1", "nobody")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sa.CoreV1().ConfigMaps("ns1").Get(ctx, "c", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("a ServiceAccount without roles read a ConfigMap: %v", err)
	}
	out, err := s.Kubectl(t, "get", "configmap", "-n", "ns1", "c", "-o", "name")
	if err != nil || strings.TrimSpace(out) != "configmap/c" {
		t.Fatalf("kubectl: %v: %s", err, out)
	}
}

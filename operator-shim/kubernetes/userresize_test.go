package kubernetes_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kubectl scale of a job on 2 nodes to 1 is the user's resize: a Normal
// Shrunk Event that says so and names the ElasticJob and the generation of
// its spec, not "node(s) lost and no replacement free".
func TestKubectlScaleToOneIsTheUsersResize(t *testing.T) {
	e := startEnv(t, envOptions{})
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob("pair", "research", "", 1, 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "pair on 2 nodes", func() (bool, string) {
		pods, _ := livePods(t, e.cs, "pair")
		s := e.status("pair")
		return len(pods) == 2 && s.CurrentReplicas == 2, fmt.Sprintf("%d pods, %+v", len(pods), s)
	})
	if out, err := e.s.Kubectl(t, "scale", "-n", "ml", "elasticjob/pair", "--replicas=1"); err != nil {
		t.Fatalf("kubectl scale: %v\n%s", err, out)
	}
	j, err := e.cl.ElasticJobs("ml").Get(e.ctx, "pair", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	who := fmt.Sprintf("spec changed by ElasticJob ml/pair (generation %d)", j.Generation)
	var ev corev1.Event
	waitFor(t, time.Minute, "a Shrunk event", func() (bool, string) {
		evs, err := e.cs.CoreV1().Events("ml").List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=pair,reason=Shrunk"})
		if err != nil || len(evs.Items) == 0 {
			return false, fmt.Sprint(err, "\n", eventsText(t, e.cs, "pair"))
		}
		ev = evs.Items[0]
		return true, ""
	})
	if ev.Type != corev1.EventTypeNormal || !strings.Contains(ev.Message, "at the user's request") || !strings.Contains(ev.Message, who) ||
		strings.Contains(ev.Message, "node(s) lost") {
		t.Errorf("Shrunk event %s %q; want Normal, the user's request, %q", ev.Type, ev.Message, who)
	}
}

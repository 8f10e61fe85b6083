package kubernetes_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kube "github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

// Issue 24: when hyperpodrun restarts a running ElasticJob's workers (its
// restart count and failure report in etcd), the ElasticJob's status shows
// it within seconds, well before the next resync (a minute here):
// status.restarts has the count, the reason is Restarting and the message
// names the last error. kubectl get elasticjobs prints the reason.
func TestElasticJobStatusShowsHyperpodrunsRestarts(t *testing.T) {
	e := startEnv(t, envOptions{Resync: time.Minute})
	if _, err := e.cl.ElasticJobs("ml").Create(e.ctx, elasticJob("flaky", "research", "", 1, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "flaky running", func() (bool, string) {
		s := e.status("flaky")
		return s.Phase == v1alpha1.PhaseRunning && s.CurrentReplicas == 1, fmt.Sprintf("%+v", s)
	})
	k := e.st.Keys
	report, _ := json.Marshal(map[string]any{"node": "n1", "detail": "worker 0 exited 1", "summary": "[default0]:RuntimeError: CUDA error", "time": time.Now().UTC()})
	if _, err := e.st.Cli.Put(e.ctx, k.Rdzv("flaky").Failure(2), string(report)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.Cli.Put(e.ctx, k.Restarts("flaky"), "2"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "flaky's status to show the restarts before the resync", func() (bool, string) {
		s := e.status("flaky")
		return s.Restarts == 2 && s.Reason == kube.ReasonRestarting && s.Phase == v1alpha1.PhaseRunning &&
			strings.Contains(s.Message, "2 time(s)") && strings.Contains(s.Message, "(round 2 on n1): worker 0 exited 1"), fmt.Sprintf("%+v", s)
	})
}

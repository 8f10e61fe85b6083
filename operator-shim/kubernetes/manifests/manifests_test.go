package manifests

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The committed manifests are the generator's output: change the Go types
// or this package, then run go run ./operator-shim/kubernetes/gen.
func TestCommittedManifestsAreGenerated(t *testing.T) {
	files, err := Files()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "kubernetes", name))
		if err != nil {
			t.Fatalf("%v: run go run ./operator-shim/kubernetes/gen", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("examples/kubernetes/%s differs from the generator's output: run go run ./operator-shim/kubernetes/gen", name)
		}
	}
}

// Descriptions come from the doc comments, validation from the kube tags
// and the CEL rules; the pod template keeps its fields.
func TestSchemaFromTypes(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	job := crds[0].Spec.Versions[0].Schema.OpenAPIV3Schema
	spec := job.Properties["spec"]
	if !strings.Contains(spec.Properties["team"].Description, "owns the job") || spec.Required[0] != "team" {
		t.Errorf("team: %+v, required %v", spec.Properties["team"], spec.Required)
	}
	pol := spec.Properties["elasticPolicy"]
	if m := pol.Properties["minReplicas"].Minimum; m == nil || *m != 1 {
		t.Errorf("minReplicas minimum: %v", m)
	}
	if len(pol.XValidations) != 3 || !strings.Contains(pol.XValidations[0].Rule, "maxReplicas >= self.minReplicas") {
		t.Errorf("elasticPolicy rules: %+v", pol.XValidations)
	}
	tpl := spec.Properties["template"]
	if tpl.XPreserveUnknownFields == nil || !*tpl.XPreserveUnknownFields {
		t.Error("the pod template must keep its fields")
	}
	if job.Properties["status"].Properties["lastTransitionTime"].Format != "date-time" {
		t.Error("metav1.Time is not a date-time")
	}
	if crds[0].Spec.Versions[0].Subresources.Status == nil {
		t.Error("no status subresource")
	}
	team := crds[1].Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	if e := team.Properties["preemption"].Enum; len(e) != 2 {
		t.Errorf("preemption enum: %v", e)
	}
	if crds[1].Spec.Scope != "Cluster" {
		t.Error("ElasticTeam is cluster-scoped")
	}
}

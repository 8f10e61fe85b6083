package v1alpha1

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A copy equals its original and shares none of its pointers, slices or
// maps: changing the copy leaves the original as it was.
func TestDeepCopySharesNothing(t *testing.T) {
	p, b, l := int32(80), int32(4), int32(2)
	now := metav1.Now()
	j := &ElasticJob{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"x": "y"}},
		Spec: ElasticJobSpec{Team: "t", Priority: &p, ElasticPolicy: ElasticPolicy{MinReplicas: 1, MaxReplicas: 4, ReplicaDiscreteValues: []int32{1, 2, 4}},
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Command: []string{"python3"}}}}}},
		Status: ElasticJobStatus{Nodes: []string{"n1"}, ShrunkFor: []string{"b"}, LastTransitionTime: &now},
	}
	c := j.DeepCopyObject().(*ElasticJob)
	if !reflect.DeepEqual(j, c) {
		t.Fatal("copy differs")
	}
	*c.Spec.Priority = 1
	c.Spec.ElasticPolicy.ReplicaDiscreteValues[0] = 9
	c.Spec.Template.Spec.Containers[0].Command[0] = "x"
	c.Status.Nodes[0] = "x"
	c.Status.ShrunkFor[0] = "x"
	c.Labels["x"] = "z"
	c.Status.LastTransitionTime.Time = now.Add(1)
	if *j.Spec.Priority != 80 || j.Spec.ElasticPolicy.ReplicaDiscreteValues[0] != 1 || j.Spec.Template.Spec.Containers[0].Command[0] != "python3" ||
		j.Status.Nodes[0] != "n1" || j.Status.ShrunkFor[0] != "b" || j.Labels["x"] != "y" || !j.Status.LastTransitionTime.Equal(&now) {
		t.Fatalf("the copy shares memory with the original: %+v", j)
	}

	tm := &ElasticTeam{Spec: ElasticTeamSpec{Quotas: []FlavorQuota{{Flavor: "f", BorrowingLimit: &b, LendingLimit: &l}}}}
	tc := tm.DeepCopyObject().(*ElasticTeam)
	*tc.Spec.Quotas[0].BorrowingLimit = 0
	*tc.Spec.Quotas[0].LendingLimit = 0
	tc.Spec.Quotas[0].Flavor = "g"
	if *tm.Spec.Quotas[0].BorrowingLimit != 4 || *tm.Spec.Quotas[0].LendingLimit != 2 || tm.Spec.Quotas[0].Flavor != "f" {
		t.Fatal("team copy shares memory")
	}
	jl := &ElasticJobList{Items: []ElasticJob{*j}}
	if jc := jl.DeepCopyObject().(*ElasticJobList); !reflect.DeepEqual(jl, jc) || &jc.Items[0] == &jl.Items[0] {
		t.Fatal("list copy")
	}
	tl := &ElasticTeamList{Items: []ElasticTeam{*tm}}
	if tc := tl.DeepCopyObject().(*ElasticTeamList); !reflect.DeepEqual(tl, tc) {
		t.Fatal("team list copy")
	}
}

package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime"
)

// The deep copies are written out by hand: few types, and each field that
// holds a pointer, slice or map is copied explicitly (deepcopy_test.go
// checks that a copy shares nothing with its original).

// DeepCopyInto copies p into out.
func (p *ElasticPolicy) DeepCopyInto(out *ElasticPolicy) {
	*out = *p
	if p.ReplicaDiscreteValues != nil {
		out.ReplicaDiscreteValues = append([]int32(nil), p.ReplicaDiscreteValues...)
	}
}

// DeepCopyInto copies s into out.
func (s *ElasticJobSpec) DeepCopyInto(out *ElasticJobSpec) {
	*out = *s
	if s.Priority != nil {
		v := *s.Priority
		out.Priority = &v
	}
	s.ElasticPolicy.DeepCopyInto(&out.ElasticPolicy)
	s.Template.DeepCopyInto(&out.Template)
}

// DeepCopyInto copies s into out.
func (s *ElasticJobStatus) DeepCopyInto(out *ElasticJobStatus) {
	*out = *s
	if s.Nodes != nil {
		out.Nodes = append([]string(nil), s.Nodes...)
	}
	if s.ShrunkFor != nil {
		out.ShrunkFor = append([]string(nil), s.ShrunkFor...)
	}
	if s.LastTransitionTime != nil {
		out.LastTransitionTime = s.LastTransitionTime.DeepCopy()
	}
}

// DeepCopyInto copies j into out.
func (j *ElasticJob) DeepCopyInto(out *ElasticJob) {
	*out = *j
	out.TypeMeta = j.TypeMeta
	j.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	j.Spec.DeepCopyInto(&out.Spec)
	j.Status.DeepCopyInto(&out.Status)
}

// DeepCopy returns a copy of j.
func (j *ElasticJob) DeepCopy() *ElasticJob {
	if j == nil {
		return nil
	}
	out := new(ElasticJob)
	j.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (j *ElasticJob) DeepCopyObject() runtime.Object { return j.DeepCopy() }

// DeepCopyInto copies l into out.
func (l *ElasticJobList) DeepCopyInto(out *ElasticJobList) {
	*out = *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]ElasticJob, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a copy of l.
func (l *ElasticJobList) DeepCopy() *ElasticJobList {
	if l == nil {
		return nil
	}
	out := new(ElasticJobList)
	l.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (l *ElasticJobList) DeepCopyObject() runtime.Object { return l.DeepCopy() }

// DeepCopyInto copies q into out.
func (q *FlavorQuota) DeepCopyInto(out *FlavorQuota) {
	*out = *q
	if q.BorrowingLimit != nil {
		v := *q.BorrowingLimit
		out.BorrowingLimit = &v
	}
	if q.LendingLimit != nil {
		v := *q.LendingLimit
		out.LendingLimit = &v
	}
}

// DeepCopyInto copies t into out.
func (t *ElasticTeam) DeepCopyInto(out *ElasticTeam) {
	*out = *t
	t.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if t.Spec.Quotas != nil {
		out.Spec.Quotas = make([]FlavorQuota, len(t.Spec.Quotas))
		for i := range t.Spec.Quotas {
			t.Spec.Quotas[i].DeepCopyInto(&out.Spec.Quotas[i])
		}
	}
}

// DeepCopy returns a copy of t.
func (t *ElasticTeam) DeepCopy() *ElasticTeam {
	if t == nil {
		return nil
	}
	out := new(ElasticTeam)
	t.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (t *ElasticTeam) DeepCopyObject() runtime.Object { return t.DeepCopy() }

// DeepCopyInto copies l into out.
func (l *ElasticTeamList) DeepCopyInto(out *ElasticTeamList) {
	*out = *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]ElasticTeam, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a copy of l.
func (l *ElasticTeamList) DeepCopy() *ElasticTeamList {
	if l == nil {
		return nil
	}
	out := new(ElasticTeamList)
	l.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (l *ElasticTeamList) DeepCopyObject() runtime.Object { return l.DeepCopy() }

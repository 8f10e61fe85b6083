package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group is the API group of the hyperpodrun resources.
const Group = "hyperpodrun.io"

// Version is this package's API version.
const Version = "v1alpha1"

// SchemeGroupVersion is hyperpodrun.io/v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// Resource names (plural), as in URLs and RBAC rules.
const (
	ElasticJobs  = "elasticjobs"
	ElasticTeams = "elasticteams"
)

var (
	// SchemeBuilder registers the types.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &ElasticJob{}, &ElasticJobList{}, &ElasticTeam{}, &ElasticTeamList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}

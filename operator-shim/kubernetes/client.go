package kubernetes

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
	typedv1alpha1 "github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/generated/clientset/versioned/typed/apis/v1alpha1"
)

// Scheme holds the built-in Kubernetes types and hyperpodrun.io/v1alpha1
// (the event recorder refers to ElasticJobs and pods through it).
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err) // static registration; cannot fail with valid types
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// Client reads and writes ElasticJobs and ElasticTeams: the typed client
// client-gen writes from the API types (operator-shim/kubernetes/generated,
// `make generate`).
type Client = typedv1alpha1.HyperpodrunV1alpha1Client

// NewClient returns a client of hyperpodrun.io/v1alpha1.
func NewClient(cfg *rest.Config) (*Client, error) {
	c, err := typedv1alpha1.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("hyperpodrun.io client: %w", err)
	}
	return c, nil
}

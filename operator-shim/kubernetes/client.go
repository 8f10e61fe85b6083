package kubernetes

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

// Scheme holds the built-in Kubernetes types and hyperpodrun.io/v1alpha1.
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

// Client reads and writes ElasticJobs and ElasticTeams.
type Client struct {
	rest *rest.RESTClient
}

// NewClient returns a client of hyperpodrun.io/v1alpha1.
func NewClient(cfg *rest.Config) (*Client, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &v1alpha1.SchemeGroupVersion
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(Scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	r, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("hyperpodrun.io client: %w", err)
	}
	return &Client{rest: r}, nil
}

// REST is the underlying client (for list-watches).
func (c *Client) REST() rest.Interface { return c.rest }

// GetJob reads one ElasticJob.
func (c *Client) GetJob(ctx context.Context, ns, name string) (*v1alpha1.ElasticJob, error) {
	out := &v1alpha1.ElasticJob{}
	err := c.rest.Get().Namespace(ns).Resource(v1alpha1.ElasticJobs).Name(name).Do(ctx).Into(out)
	return out, err
}

// CreateJob creates an ElasticJob.
func (c *Client) CreateJob(ctx context.Context, j *v1alpha1.ElasticJob) (*v1alpha1.ElasticJob, error) {
	out := &v1alpha1.ElasticJob{}
	err := c.rest.Post().Namespace(j.Namespace).Resource(v1alpha1.ElasticJobs).Body(j).Do(ctx).Into(out)
	return out, err
}

// UpdateJob replaces an ElasticJob (its metadata and spec).
func (c *Client) UpdateJob(ctx context.Context, j *v1alpha1.ElasticJob) (*v1alpha1.ElasticJob, error) {
	out := &v1alpha1.ElasticJob{}
	err := c.rest.Put().Namespace(j.Namespace).Resource(v1alpha1.ElasticJobs).Name(j.Name).Body(j).Do(ctx).Into(out)
	return out, err
}

// UpdateJobStatus replaces an ElasticJob's status subresource.
func (c *Client) UpdateJobStatus(ctx context.Context, j *v1alpha1.ElasticJob) (*v1alpha1.ElasticJob, error) {
	out := &v1alpha1.ElasticJob{}
	err := c.rest.Put().Namespace(j.Namespace).Resource(v1alpha1.ElasticJobs).Name(j.Name).SubResource("status").Body(j).Do(ctx).Into(out)
	return out, err
}

// DeleteJob deletes an ElasticJob.
func (c *Client) DeleteJob(ctx context.Context, ns, name string) error {
	return c.rest.Delete().Namespace(ns).Resource(v1alpha1.ElasticJobs).Name(name).Body(&metav1.DeleteOptions{}).Do(ctx).Error()
}

// CreateTeam creates an ElasticTeam.
func (c *Client) CreateTeam(ctx context.Context, t *v1alpha1.ElasticTeam) (*v1alpha1.ElasticTeam, error) {
	out := &v1alpha1.ElasticTeam{}
	err := c.rest.Post().Resource(v1alpha1.ElasticTeams).Body(t).Do(ctx).Into(out)
	return out, err
}

// UpdateTeamStatus replaces an ElasticTeam's status subresource.
func (c *Client) UpdateTeamStatus(ctx context.Context, t *v1alpha1.ElasticTeam) (*v1alpha1.ElasticTeam, error) {
	out := &v1alpha1.ElasticTeam{}
	err := c.rest.Put().Resource(v1alpha1.ElasticTeams).Name(t.Name).SubResource("status").Body(t).Do(ctx).Into(out)
	return out, err
}

// DeleteTeam deletes an ElasticTeam.
func (c *Client) DeleteTeam(ctx context.Context, name string) error {
	return c.rest.Delete().Resource(v1alpha1.ElasticTeams).Name(name).Body(&metav1.DeleteOptions{}).Do(ctx).Error()
}

var _ = corev1.SchemeGroupVersion

package kubernetes

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

// Accelerator resources, in the order they are looked for in a job's
// container limits and in a Node's allocatable.
var AcceleratorResources = []corev1.ResourceName{"nvidia.com/gpu", "aws.amazon.com/neuron", "aws.amazon.com/neuroncore"}

// OwnerEnv marks a job spec written by the controller: its value is the
// ElasticJob's namespace/name/uid. Node agents refuse to run a job whose
// run.env sets a HYPERPODRUN_ variable, so a job of Kubernetes is never
// started a second time as a host process by an agent with --run-jobs.
const OwnerEnv = fleet.KubernetesOwnerEnv

// Owner is the OwnerEnv value of ej.
func Owner(ej *v1alpha1.ElasticJob) string {
	return ej.Namespace + "/" + ej.Name + "/" + string(ej.UID)
}

// RequestedBy names ej as the writer of its job spec (the spec's
// RequestedBy), with the generation of its spec: the coordinator names it
// in the decisions a change of the spec causes (kubectl scale, an edit).
func RequestedBy(ej *v1alpha1.ElasticJob) string {
	return "ElasticJob " + ej.Namespace + "/" + ej.Name + " (generation " + strconv.FormatInt(ej.Generation, 10) + ")"
}

var pythonName = regexp.MustCompile(`^python[0-9.]*$`)

// Translate turns an ElasticJob into the job spec the coordinator reads.
// Errors name the field of the ElasticJob and the fix.
func Translate(ej *v1alpha1.ElasticJob) (fleet.JobSpec, error) {
	s := ej.Spec
	j := fleet.JobSpec{Job: api.Job{
		Name: ej.Name, Team: s.Team, PriorityClass: s.PriorityClassName, Flavor: s.Flavor,
		Suspended: s.Suspend, SubmitTime: ej.CreationTimestamp.UTC(),
	}}
	if err := api.ValidateName("metadata.name", ej.Name); err != nil {
		return j, fmt.Errorf("%w (an ElasticJob's name is its job id in the rendezvous, at most 63 characters)", err)
	}
	if err := api.ValidateName("spec.team", s.Team); err != nil {
		return j, err
	}
	if s.Priority != nil {
		p := int(*s.Priority)
		j.Priority = &p
	}
	pol := s.ElasticPolicy
	j.MinNodes, j.MaxNodes, j.Step = int(pol.MinReplicas), int(pol.MaxReplicas), int(pol.ReplicaIncrementStep)
	for _, v := range pol.ReplicaDiscreteValues {
		j.Sizes = append(j.Sizes, int(v))
	}
	if j.MinNodes == 0 && len(j.Sizes) == 0 {
		j.MinNodes = 1
	}
	if minN, maxN := j.Bounds(); maxN > minN {
		j.Elastic = true
	}
	if len(s.Template.Spec.Containers) == 0 {
		return j, errors.New("spec.template.spec.containers: must list the trainer container (the first one runs under hyperpodrun)")
	}
	c := s.Template.Spec.Containers[0]
	per, kind, err := PerNode(c)
	if err != nil {
		return j, err
	}
	j.PerNode = per
	run, err := runOf(c)
	if err != nil {
		return j, err
	}
	run.NProcPerNode = s.NProcPerNode
	if run.NProcPerNode == "" {
		run.NProcPerNode = "1"
		if kind != "" {
			run.NProcPerNode = strconv.Itoa(per.Accelerators)
		}
	}
	run.MaxRestarts = int(s.MaxRestarts)
	run.GracefulTimeoutSeconds = float64(pol.GracefulShutdownTimeoutInSeconds)
	run.Env[OwnerEnv] = Owner(ej)
	j.Run = run
	if err := j.Job.Validate(api.Config{}); err != nil {
		return j, fmt.Errorf("spec: %w", err)
	}
	if err := validateRun(j.Run); err != nil {
		return j, err
	}
	return j, nil
}

// validateRun checks what fleet.RunSpec.Validate checks, except the
// marker, which a user may not set but the controller does.
func validateRun(r fleet.RunSpec) error {
	if n := r.NProcPerNode; n != "gpu" && n != "cpu" && n != "auto" {
		if v, err := strconv.Atoi(n); err != nil || v < 1 {
			return fmt.Errorf("spec.nprocPerNode: %q must be a number >= 1, gpu, cpu or auto", n)
		}
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("spec.template.spec.containers[0]: %w", err)
	}
	return nil
}

// PerNode reads a job's per-node resources from its trainer container:
// the accelerator limit (or request) of the first resource of
// AcceleratorResources it names (none: one whole node counts as one),
// and the cpu and memory requests (else limits). kind is the accelerator
// resource found, "" for none.
func PerNode(c corev1.Container) (api.Resources, corev1.ResourceName, error) {
	get := func(n corev1.ResourceName) (resource.Quantity, bool) {
		if q, ok := c.Resources.Limits[n]; ok {
			return q, true
		}
		q, ok := c.Resources.Requests[n]
		return q, ok
	}
	r := api.Resources{Accelerators: 1}
	var kind corev1.ResourceName
	for _, n := range AcceleratorResources {
		q, ok := get(n)
		if !ok {
			continue
		}
		if kind != "" {
			return r, "", fmt.Errorf("spec.template.spec.containers[0].resources: asks for both %s and %s; a job uses one kind of accelerator", kind, n)
		}
		v, ok := q.AsInt64()
		if !ok || v < 1 || v > api.MaxNodeAccelerators {
			return r, "", fmt.Errorf("spec.template.spec.containers[0].resources.limits[%s]: %s must be a whole number between 1 and %d", n, q.String(), api.MaxNodeAccelerators)
		}
		r.Accelerators, kind = int(v), n
	}
	req := func(n corev1.ResourceName) (resource.Quantity, bool) {
		if q, ok := c.Resources.Requests[n]; ok {
			return q, true
		}
		q, ok := c.Resources.Limits[n]
		return q, ok
	}
	if q, ok := req(corev1.ResourceCPU); ok {
		r.VCPUs = int((q.MilliValue() + 999) / 1000)
	}
	if q, ok := req(corev1.ResourceMemory); ok {
		r.Memory = api.ByteSize(q.Value())
	}
	return r, kind, nil
}

// runOf reads what the trainer container runs: its command and args are
// the worker's command line as torchrun takes it after its own flags.
func runOf(c corev1.Container) (fleet.RunSpec, error) {
	argv := append(append([]string{}, c.Command...), c.Args...)
	field := "spec.template.spec.containers[0].command"
	r := fleet.RunSpec{Env: map[string]string{}, Image: c.Image}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			r.Env[e.Name] = e.Value
		}
	}
	if c.WorkingDir != "" {
		r.WorkDir = c.WorkingDir
	}
	if len(argv) == 0 {
		return r, fmt.Errorf("%s: must be set: the worker's command line, e.g. [python3, train.py, --epochs, \"10\"]; the controller runs it under hyperpodrun", field)
	}
	switch base := path.Base(argv[0]); {
	case base == "torchrun" || base == "hyperpodrun":
		return r, fmt.Errorf("%s: starts with %s; write the worker's command only (e.g. [python3, train.py]): the controller runs it under hyperpodrun and sets --nnodes and the rendezvous; put --nproc-per-node in spec.nprocPerNode", field, base)
	case pythonName.MatchString(base):
		r.Python = argv[0]
		rest := argv[1:]
		switch {
		case len(rest) >= 2 && rest[0] == "-m":
			r.Module, r.Script, r.Args = true, rest[1], rest[2:]
		case len(rest) == 0 || rest[0] == "-m":
			return r, fmt.Errorf("%s: %s needs a script (or -m module) to run", field, base)
		case strings.HasPrefix(rest[0], "-"):
			return r, fmt.Errorf("%s: interpreter flag %q before the script is not supported under hyperpodrun; use the environment instead (e.g. PYTHONUNBUFFERED=1 for -u)", field, rest[0])
		default:
			r.Script, r.Args = rest[0], rest[1:]
		}
	default:
		r.NoPython, r.Script, r.Args = true, argv[0], argv[1:]
	}
	return r, nil
}

package kubernetes

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/hyperpodrun/hyperpodrun/agent/node/jobrunner"
	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

func job(mod func(*v1alpha1.ElasticJob)) *v1alpha1.ElasticJob {
	ej := &v1alpha1.ElasticJob{
		ObjectMeta: metav1.ObjectMeta{Name: "llama", Namespace: "ml", UID: "u-1", CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))},
		Spec: v1alpha1.ElasticJobSpec{
			Team: "research", PriorityClassName: "low", Flavor: "nvidia-h100-80gb",
			ElasticPolicy: v1alpha1.ElasticPolicy{MinReplicas: 1, MaxReplicas: 4, GracefulShutdownTimeoutInSeconds: 120},
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "trainer", Image: "registry.example.com/ml/train:v3",
				Command: []string{"python3", "/workspace/train.py"}, Args: []string{"--epochs", "10"},
				Env: []corev1.EnvVar{{Name: "NCCL_DEBUG", Value: "INFO"}, {Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
				Resources: corev1.ResourceRequirements{
					Limits:   corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")},
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("95500m"), corev1.ResourceMemory: resource.MustParse("1000Gi")},
				},
			}}}},
		},
	}
	if mod != nil {
		mod(ej)
	}
	return ej
}

func TestTranslate(t *testing.T) {
	spec, err := Translate(job(nil))
	if err != nil {
		t.Fatal(err)
	}
	want := fleet.JobSpec{
		Job: api.Job{Name: "llama", Team: "research", PriorityClass: "low", Flavor: "nvidia-h100-80gb",
			PerNode: api.Resources{Accelerators: 8, VCPUs: 96, Memory: 1000 << 30}, MinNodes: 1, MaxNodes: 4, Elastic: true,
			SubmitTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
		Run: fleet.RunSpec{Script: "/workspace/train.py", Args: []string{"--epochs", "10"}, Python: "python3", NProcPerNode: "8",
			GracefulTimeoutSeconds: 120, Image: "registry.example.com/ml/train:v3",
			Env: map[string]string{"NCCL_DEBUG": "INFO", OwnerEnv: "ml/llama/u-1"}},
	}
	if !reflect.DeepEqual(spec, want) {
		t.Fatalf("got  %+v\nwant %+v", spec, want)
	}
}

func TestTranslateVariants(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mod   func(*v1alpha1.ElasticJob)
		check func(t *testing.T, s fleet.JobSpec)
	}{
		{"module", func(j *v1alpha1.ElasticJob) {
			j.Spec.Template.Spec.Containers[0].Command = []string{"/usr/bin/python3.11", "-m", "pkg.train"}
			j.Spec.Template.Spec.Containers[0].Args = nil
		}, func(t *testing.T, s fleet.JobSpec) {
			if !s.Run.Module || s.Run.Script != "pkg.train" || s.Run.Python != "/usr/bin/python3.11" || len(s.Run.Args) != 0 {
				t.Errorf("%+v", s.Run)
			}
		}},
		{"program", func(j *v1alpha1.ElasticJob) {
			j.Spec.Template.Spec.Containers[0].Command = nil
			j.Spec.Template.Spec.Containers[0].Args = []string{"/bin/worker", "--steps=5"}
		}, func(t *testing.T, s fleet.JobSpec) {
			if !s.Run.NoPython || s.Run.Script != "/bin/worker" || s.Run.Python != "" || !slices.Equal(s.Run.Args, []string{"--steps=5"}) {
				t.Errorf("%+v", s.Run)
			}
		}},
		{"discrete sizes and neuron", func(j *v1alpha1.ElasticJob) {
			j.Spec.ElasticPolicy = v1alpha1.ElasticPolicy{ReplicaDiscreteValues: []int32{2, 4, 8}}
			j.Spec.Template.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{"aws.amazon.com/neuron": resource.MustParse("16")}}
			j.Spec.NProcPerNode = "32"
			j.Spec.Flavor = "trainium2"
		}, func(t *testing.T, s fleet.JobSpec) {
			if !slices.Equal(s.Sizes, []int{2, 4, 8}) || s.MinNodes != 0 || !s.Elastic || s.PerNode.Accelerators != 16 || s.Run.NProcPerNode != "32" {
				t.Errorf("%+v", s)
			}
		}},
		{"fixed size, step, priority, suspended, cpu", func(j *v1alpha1.ElasticJob) {
			p := int32(90)
			j.Spec.PriorityClassName, j.Spec.Priority, j.Spec.Suspend, j.Spec.MaxRestarts = "", &p, true, 3
			j.Spec.ElasticPolicy = v1alpha1.ElasticPolicy{MinReplicas: 2, MaxReplicas: 6, ReplicaIncrementStep: 2}
			j.Spec.Template.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		}, func(t *testing.T, s fleet.JobSpec) {
			if *s.Priority != 90 || !s.Suspended || s.Step != 2 || s.MinNodes != 2 || s.MaxNodes != 6 || s.PerNode.Accelerators != 1 ||
				s.Run.NProcPerNode != "1" || s.Run.MaxRestarts != 3 {
				t.Errorf("%+v", s)
			}
		}},
		{"not elastic", func(j *v1alpha1.ElasticJob) {
			j.Spec.ElasticPolicy = v1alpha1.ElasticPolicy{MinReplicas: 3, MaxReplicas: 3}
		},
			func(t *testing.T, s fleet.JobSpec) {
				if s.Elastic || s.MinNodes != 3 {
					t.Errorf("%+v", s)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Translate(job(tc.mod))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, s)
		})
	}
}

// Every bad input is an error naming the field and the fix.
func TestTranslateErrors(t *testing.T) {
	c0 := func(j *v1alpha1.ElasticJob) *corev1.Container { return &j.Spec.Template.Spec.Containers[0] }
	for _, tc := range []struct {
		mod  func(*v1alpha1.ElasticJob)
		want string
	}{
		{func(j *v1alpha1.ElasticJob) { j.Name = strings.Repeat("a", 64) }, "metadata.name"},
		{func(j *v1alpha1.ElasticJob) { j.Spec.Team = "Bad_Team" }, "spec.team"},
		{func(j *v1alpha1.ElasticJob) { j.Spec.Template.Spec.Containers = nil }, "containers: must list the trainer"},
		{func(j *v1alpha1.ElasticJob) { c0(j).Command, c0(j).Args = nil, nil }, "command: must be set"},
		{func(j *v1alpha1.ElasticJob) { c0(j).Command = []string{"torchrun", "--nproc-per-node=8", "train.py"} }, "starts with torchrun"},
		{func(j *v1alpha1.ElasticJob) { c0(j).Command, c0(j).Args = []string{"python3"}, nil }, "needs a script"},
		{func(j *v1alpha1.ElasticJob) { c0(j).Command = []string{"python3", "-u", "train.py"} }, "interpreter flag \"-u\""},
		{func(j *v1alpha1.ElasticJob) {
			c0(j).Resources.Limits["aws.amazon.com/neuron"] = resource.MustParse("1")
		}, "both nvidia.com/gpu and aws.amazon.com/neuron"},
		{func(j *v1alpha1.ElasticJob) { c0(j).Resources.Limits["nvidia.com/gpu"] = resource.MustParse("500m") }, "whole number"},
		{func(j *v1alpha1.ElasticJob) {
			j.Spec.ElasticPolicy.MaxReplicas = 0
			j.Spec.ElasticPolicy.MinReplicas = 5
			j.Spec.ElasticPolicy.MaxReplicas = 2
		}, "spec:"},
		{func(j *v1alpha1.ElasticJob) { j.Spec.PriorityClassName = "urgent" }, "unknown class"},
		{func(j *v1alpha1.ElasticJob) { j.Spec.NProcPerNode = "lots" }, "spec.nprocPerNode"},
		{func(j *v1alpha1.ElasticJob) { c0(j).Image = "UPPER/Case:tag" }, "run.image"},
	} {
		_, err := Translate(job(tc.mod))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error with %q, got %v", tc.want, err)
		}
	}
}

// The pod's hyperpodrun command line is the node agent's (agent/node/jobrunner),
// with the pod's paths for the credentials.
func TestHyperpodrunArgsMatchTheNodeAgent(t *testing.T) {
	for _, mod := range []func(*v1alpha1.ElasticJob){nil, func(j *v1alpha1.ElasticJob) {
		j.Spec.Template.Spec.Containers[0].Command = []string{"python3", "-m", "x"}
		j.Spec.ElasticPolicy.GracefulShutdownTimeoutInSeconds = 0
	}, func(j *v1alpha1.ElasticJob) { j.Spec.Template.Spec.Containers[0].Command = []string{"/bin/w"} }} {
		spec, err := Translate(job(mod))
		if err != nil {
			t.Fatal(err)
		}
		got := HyperpodrunArgs(spec, PodOptions{Endpoints: []string{"https://etcd:2379"}, Prefix: "/p"})
		want := jobrunner.Args(spec, []string{"https://etcd:2379"}, "/p", "", "")
		if !slices.Equal(got, want) {
			t.Errorf("pod:   %q\nagent: %q", got, want)
		}
	}
}

func TestPodFor(t *testing.T) {
	ej := job(func(j *v1alpha1.ElasticJob) {
		j.Spec.Template.Labels = map[string]string{"app": "llama"}
	})
	spec, err := Translate(ej)
	if err != nil {
		t.Fatal(err)
	}
	p := PodFor(ej, spec, "ip-10-0-0-1", PodOptions{Endpoints: []string{"https://etcd:2379"}, Prefix: "/hyperpodrun", LauncherImage: "img:1", Creds: true, CACert: true, Generation: 7})
	if p.Spec.NodeName != "ip-10-0-0-1" || p.Spec.RestartPolicy != corev1.RestartPolicyNever || p.Namespace != "ml" || p.GenerateName != "llama-" {
		t.Errorf("placement: %+v", p.ObjectMeta)
	}
	if p.Labels[JobLabel] != "llama" || p.Labels["app"] != "llama" || p.Annotations[GenerationAnnotation] != "7" {
		t.Errorf("labels %v annotations %v", p.Labels, p.Annotations)
	}
	if ref := p.OwnerReferences[0]; ref.Kind != "ElasticJob" || ref.UID != "u-1" || !*ref.Controller {
		t.Errorf("owner: %+v", ref)
	}
	if *p.Spec.TerminationGracePeriodSeconds != 150 {
		t.Errorf("grace %d, want the graceful timeout + 30", *p.Spec.TerminationGracePeriodSeconds)
	}
	c := p.Spec.Containers[0]
	cmd := strings.Join(c.Command, " ")
	for _, w := range []string{"/.hyperpodrun/hyperpod-kube-controller pod ", "--job=llama --node=ip-10-0-0-1", "--etcd-password-file=/etc/hyperpodrun/etcd/password",
		"-- /.hyperpodrun/hyperpodrun --nnodes 1:4 --nproc-per-node 8 --rdzv-backend etcd --rdzv-endpoint https://etcd:2379 --rdzv-id llama",
		"--rdzv-conf prefix=/hyperpodrun,cacert=/etc/hyperpodrun/etcd/ca.crt,user=$(HYPERPODRUN_ETCD_USER),password_file=/etc/hyperpodrun/etcd/password",
		"--graceful-timeout 120 /workspace/train.py --epochs 10"} {
		if !strings.Contains(cmd, w) {
			t.Errorf("command lacks %q:\n%s", w, cmd)
		}
	}
	if c.Args != nil {
		t.Error("args must be folded into the command")
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if env["HYPERPODRUN_NODE_ID"].Value != "ip-10-0-0-1" || env["PYTHON_EXEC"].Value != "python3" || env["NCCL_DEBUG"].Value != "INFO" ||
		env["HYPERPODRUN_ETCD_USER"].ValueFrom.SecretKeyRef.Name != "llama-etcd" {
		t.Errorf("env: %+v", c.Env)
	}
	if p.Spec.InitContainers[0].Image != "img:1" || len(p.Spec.Volumes) != 2 || p.Spec.Volumes[1].Secret.SecretName != "llama-etcd" {
		t.Errorf("volumes %+v init %+v", p.Spec.Volumes, p.Spec.InitContainers)
	}
	if c.Resources.Limits["nvidia.com/gpu"] != resource.MustParse("8") {
		t.Error("the accelerator limit must stay: the device plugin allocates the GPUs")
	}
	// The template is not changed.
	if ej.Spec.Template.Spec.Containers[0].Command[0] != "python3" || len(ej.Spec.Template.Spec.Volumes) != 0 {
		t.Error("PodFor changed the ElasticJob's template")
	}
	// Without auth, no credentials.
	p = PodFor(ej, spec, "n", PodOptions{Endpoints: []string{"http://e:2379"}, LauncherImage: "img"})
	if len(p.Spec.Volumes) != 1 || strings.Contains(strings.Join(p.Spec.Containers[0].Command, " "), "password") {
		t.Errorf("no-auth pod: %+v", p.Spec.Volumes)
	}
}

// A spec read back from etcd is the same spec: no update on every pass.
func TestSameSpecAfterARoundTrip(t *testing.T) {
	want, err := Translate(job(func(j *v1alpha1.ElasticJob) { j.Spec.Template.Spec.Containers[0].Args = nil }))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(want)
	var back fleet.JobSpec
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	back.SubmitTime = back.SubmitTime.Add(time.Hour)
	if !sameSpec(back, want) {
		t.Error("a stored spec differs from the one written")
	}
	back.MaxNodes = 9
	if sameSpec(back, want) {
		t.Error("a changed spec is the same")
	}
}

// The example ElasticJob (examples/kubernetes/jobs, shown in the README)
// is one the controller runs.
func TestExampleElasticJobTranslates(t *testing.T) {
	b, err := os.ReadFile("../../examples/kubernetes/jobs/elasticjob.yaml")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if !strings.Contains(doc, "kind: ElasticJob") {
			continue
		}
		var ej v1alpha1.ElasticJob
		if err := yaml.UnmarshalStrict([]byte(doc), &ej); err != nil {
			t.Fatal(err)
		}
		spec, err := Translate(&ej)
		if err != nil {
			t.Fatalf("%s: %v", ej.Name, err)
		}
		if spec.PerNode.Accelerators != 8 || spec.MaxNodes != 4 || spec.Run.Script != "/workspace/train.py" {
			t.Errorf("%+v", spec)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("%d ElasticJobs in the example", n)
	}
}

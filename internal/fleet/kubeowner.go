package fleet

import "strings"

// KubernetesOwnerEnv marks a job spec the Kubernetes controller wrote (in
// run.env): its value is the ElasticJob's namespace/name/uid. Such a job is
// changed through its ElasticJob (kubectl); the controller puts back any
// other change.
const KubernetesOwnerEnv = "HYPERPODRUN_KUBERNETES_OWNER"

// KubernetesOwner is the namespace and name of the ElasticJob that owns
// the job (ok false: none does).
func (j JobSpec) KubernetesOwner() (namespace, name string, ok bool) {
	v := j.Run.Env[KubernetesOwnerEnv]
	if v == "" {
		return "", "", false
	}
	parts := strings.SplitN(v, "/", 3)
	if len(parts) < 2 || parts[0] == "" || parts[1] == "" {
		return "", j.Name, true // malformed: still owned; name the job
	}
	return parts[0], parts[1], true
}

package kubernetes

import (
	"fmt"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

// KubeAdvice words a coordinator's message for a Kubernetes user: advice
// given in elasticctl's terms is given in kubectl's (the coordinator speaks
// to both kinds of users).
func KubeAdvice(ej *v1alpha1.ElasticJob, code api.ReasonCode, msg string) string {
	if code == api.CodeTeamNotFound {
		return fmt.Sprintf("team %q does not exist: create an ElasticTeam named %s (kubectl apply -f with kind: ElasticTeam; kubectl get elasticteams lists them)", ej.Spec.Team, ej.Spec.Team)
	}
	return msg
}

package kubernetes

import (
	"strings"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
)

// Each rule of judgeEnrollment, by name: only the agent DaemonSet's
// ServiceAccount, with a token for the enrollment audience bound to a live
// pod on the node the request names, is enrolled as that node.
func TestJudgeEnrollment(t *testing.T) {
	cfg := EnrollConfig{Namespace: "hyperpodrun", ServiceAccount: "hyperpod-agent"}
	key := make([]byte, 32)
	req := etcdauth.EnrollRequest{Node: "node-a", Token: "t", PublicKey: key}
	rev := enrollReview{Authenticated: true, Username: "system:serviceaccount:hyperpodrun:hyperpod-agent", Audiences: []string{etcdauth.EnrollAudience},
		NodeName: "node-a", PodName: "agent-x", PodUID: "uid-1"}
	pod := enrollPod{Found: true, UID: "uid-1", NodeName: "node-a", ServiceAccount: "hyperpod-agent"}
	for _, tc := range []struct {
		rule    string
		keyNode string
		req     func(*etcdauth.EnrollRequest)
		rev     func(*enrollReview)
		pod     func(*enrollPod)
		want    string // node approved; "" refused
		reason  string // the rule named in the reason
	}{
		{rule: "approved: the agent's pod on the node it asks for", want: "node-a"},
		{rule: "approved without the node claim (before Kubernetes 1.30): the pod's spec.nodeName decides", rev: func(r *enrollReview) { r.NodeName = "" }, want: "node-a"},
		{rule: "bad-request: the key names no valid node", keyNode: "../x", reason: "bad-request"},
		{rule: "bad-request: the request names another node than its key", req: func(r *etcdauth.EnrollRequest) { r.Node = "node-b" }, reason: "bad-request"},
		{rule: "bad-request: no public key", req: func(r *etcdauth.EnrollRequest) { r.PublicKey = nil }, reason: "bad-request"},
		{rule: "not-authenticated: an invalid, expired or wrong-audience token", rev: func(r *enrollReview) { *r = enrollReview{Error: "token audiences are invalid"} }, reason: "not-authenticated"},
		{rule: "wrong-audience: the review's audiences lack ours", rev: func(r *enrollReview) { r.Audiences = []string{"https://kubernetes.default.svc"} }, reason: "wrong-audience"},
		{rule: "wrong-service-account: another ServiceAccount's token", rev: func(r *enrollReview) { r.Username = "system:serviceaccount:hyperpodrun:default" }, reason: "wrong-service-account"},
		{rule: "wrong-service-account: the same name in another namespace", rev: func(r *enrollReview) { r.Username = "system:serviceaccount:team-a:hyperpod-agent" }, reason: "wrong-service-account"},
		{rule: "not-pod-bound: a token from the TokenRequest API without a pod", rev: func(r *enrollReview) { r.PodName, r.PodUID, r.NodeName = "", "", "" }, reason: "not-pod-bound"},
		{rule: "pod-gone: the pod was deleted", pod: func(p *enrollPod) { *p = enrollPod{} }, reason: "pod-gone"},
		{rule: "pod-gone: a new pod of the same name", pod: func(p *enrollPod) { p.UID = "uid-2" }, reason: "pod-gone"},
		{rule: "pod-gone: the pod is terminating", pod: func(p *enrollPod) { p.Terminating = true }, reason: "pod-gone"},
		{rule: "wrong-node: the token's node claim is another node", rev: func(r *enrollReview) { r.NodeName = "node-b" }, reason: "wrong-node"},
		{rule: "wrong-node: the pod is on another node", rev: func(r *enrollReview) { r.NodeName = "" }, pod: func(p *enrollPod) { p.NodeName = "node-b" }, reason: "wrong-node"},
		{rule: "wrong-node: the pod is not scheduled", rev: func(r *enrollReview) { r.NodeName = "" }, pod: func(p *enrollPod) { p.NodeName = "" }, reason: "wrong-node"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			rq, rv, pd, kn := req, rev, pod, tc.keyNode
			if kn == "" {
				kn = "node-a"
			}
			if tc.req != nil {
				tc.req(&rq)
			}
			if tc.rev != nil {
				tc.rev(&rv)
			}
			if tc.pod != nil {
				tc.pod(&pd)
			}
			node, reason := judgeEnrollment(kn, rq, rv, pd, cfg)
			if node != tc.want {
				t.Errorf("enrolled %q (reason %q), want %q", node, reason, tc.want)
			}
			if tc.want == "" && !strings.HasPrefix(reason, tc.reason+":") {
				t.Errorf("reason %q, want the rule %s", reason, tc.reason)
			}
			if tc.want != "" && reason != "" {
				t.Errorf("approved with a reason %q", reason)
			}
		})
	}
}

package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// EnrollConfig turns on the enrollment of hyperpod-agent pods
// (etcdauth.Enroll): a request is approved only for a token of the agent
// DaemonSet's ServiceAccount, bound to a live pod on the node it asks for.
type EnrollConfig struct {
	// Namespace and ServiceAccount are the agent DaemonSet's.
	Namespace, ServiceAccount string
	// Audience of the pods' projected token (default
	// etcdauth.EnrollAudience).
	Audience string
}

// Extra keys of a pod-bound ServiceAccount token's TokenReview (Kubernetes
// 1.30+ adds the node's).
const (
	extraNodeName = "authentication.kubernetes.io/node-name"
	extraPodName  = "authentication.kubernetes.io/pod-name"
	extraPodUID   = "authentication.kubernetes.io/pod-uid"
)

// Event reasons on the Node an enrollment names.
const (
	ReasonEnrolled         = "Enrolled"
	ReasonEnrollmentRefuse = "EnrollmentRefused"
)

// enrollReview is what a TokenReview said of a request's token.
type enrollReview struct {
	Authenticated bool
	Error         string
	Username      string
	Audiences     []string
	// NodeName, PodName and PodUID are the token's pod binding (empty when
	// the token is not bound to a pod, or, for NodeName, before 1.30).
	NodeName, PodName, PodUID string
}

// enrollPod is the pod the token is bound to, as the API server has it.
type enrollPod struct {
	Found          bool
	UID            string
	NodeName       string
	ServiceAccount string
	Terminating    bool
}

// judgeEnrollment decides a request found at enroll/<keyNode>: the node to
// enroll, or why not (reason names the rule that refused it). Pure.
func judgeEnrollment(keyNode string, req etcdauth.EnrollRequest, rev enrollReview, pod enrollPod, cfg EnrollConfig) (node, reason string) {
	wantUser := "system:serviceaccount:" + cfg.Namespace + ":" + cfg.ServiceAccount
	switch {
	case api.ValidateNodeName(keyNode) != nil:
		return "", "bad-request: the key names no valid node"
	case req.Node != keyNode:
		return "", fmt.Sprintf("bad-request: the request at %s names node %q", keyNode, fleet.ClipKey(req.Node))
	case !etcdauth.ValidEnrollKey(req.PublicKey):
		return "", fmt.Sprintf("bad-request: a %d-byte public key, want 32", len(req.PublicKey))
	case !rev.Authenticated:
		return "", "not-authenticated: the token is not valid for audience " + cfg.audience() + ": " + fleet.ClipKey(rev.Error)
	case !slices.Contains(rev.Audiences, cfg.audience()):
		return "", "wrong-audience: the token is not for " + cfg.audience()
	case rev.Username != wantUser:
		return "", fmt.Sprintf("wrong-service-account: the token is %s's, not the agent DaemonSet's (%s)", fleet.ClipKey(rev.Username), wantUser)
	case rev.PodName == "" || rev.PodUID == "":
		return "", "not-pod-bound: the token is not bound to a pod (use a projected serviceAccountToken volume)"
	case !pod.Found || pod.UID != rev.PodUID || pod.Terminating:
		return "", fmt.Sprintf("pod-gone: pod %s/%s (uid %s) no longer exists or is terminating", cfg.Namespace, rev.PodName, rev.PodUID)
	case pod.ServiceAccount != cfg.ServiceAccount:
		return "", fmt.Sprintf("wrong-service-account: pod %s/%s runs as %s", cfg.Namespace, rev.PodName, pod.ServiceAccount)
	case rev.NodeName != "" && rev.NodeName != keyNode:
		return "", fmt.Sprintf("wrong-node: the token's pod is on node %s, not %s", rev.NodeName, keyNode)
	case pod.NodeName != keyNode:
		return "", fmt.Sprintf("wrong-node: pod %s/%s is on node %q, not %s", cfg.Namespace, rev.PodName, pod.NodeName, keyNode)
	}
	return keyNode, ""
}

func (c EnrollConfig) audience() string {
	if c.Audience == "" {
		return etcdauth.EnrollAudience
	}
	return c.Audience
}

// Enroller judges the agent pods' enrollment requests (enroll/) and writes
// the approvals (enroll-approved/) the coordinator answers.
type Enroller struct {
	kube     kubernetes.Interface
	etcd     *clientv3.Client
	keys     fleet.Keys
	cfg      EnrollConfig
	recorder record.EventRecorder
	log      *slog.Logger
	now      func() time.Time
}

// NewEnroller returns an Enroller; recorder (may be nil) gets an Event on
// the Node of each request judged.
func NewEnroller(kube kubernetes.Interface, etcd *clientv3.Client, prefix string, cfg EnrollConfig, recorder record.EventRecorder, log *slog.Logger) *Enroller {
	if log == nil {
		log = slog.Default()
	}
	return &Enroller{kube: kube, etcd: etcd, keys: fleet.NewKeys(prefix), cfg: cfg, recorder: recorder, log: log, now: time.Now}
}

// Run judges every request, those there and those to come, until ctx ends.
func (e *Enroller) Run(ctx context.Context) {
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		err := e.watch(ctx)
		if ctx.Err() != nil {
			return
		}
		e.log.Warn("enrollment watch ended; starting over", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

func (e *Enroller) watch(ctx context.Context) error {
	p := e.keys.EnrollPrefix()
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	got, err := e.etcd.Get(gctx, p, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	for _, kv := range got.Kvs {
		e.handle(ctx, string(kv.Key[len(p):]), kv.Value, kv.ModRevision)
	}
	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	for wr := range e.etcd.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(got.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return err
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypePut {
				e.handle(ctx, string(ev.Kv.Key[len(p):]), ev.Kv.Value, ev.Kv.ModRevision)
			}
		}
	}
	return errors.New("watch closed")
}

// handle judges one request, writes the approval or reports the refusal,
// and deletes the request (it holds a token: no longer than needed).
func (e *Enroller) handle(ctx context.Context, keyNode string, value []byte, modRev int64) {
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var req etcdauth.EnrollRequest
	if err := json.Unmarshal(value, &req); err != nil {
		req = etcdauth.EnrollRequest{}
	}
	rev, err := e.review(hctx, req.Token)
	if err != nil {
		e.log.Warn("cannot review an enrollment token; the agent will ask again", "node", fleet.ClipKey(keyNode), "err", err)
		return
	}
	pod := e.pod(hctx, rev)
	node, reason := judgeEnrollment(keyNode, req, rev, pod, e.cfg)
	if reason == "" {
		if err := e.approve(hctx, node, req, rev); err != nil {
			e.log.Warn("cannot write an enrollment approval", "node", node, "err", err)
			return
		}
	}
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = e.etcd.Txn(dctx).If(clientv3.Compare(clientv3.ModRevision(e.keys.Enroll(keyNode)), "=", modRev)).Then(clientv3.OpDelete(e.keys.Enroll(keyNode))).Commit()
	dcancel()
	if err != nil {
		e.log.Warn("cannot delete a judged enrollment request", "node", fleet.ClipKey(keyNode), "err", err)
	}
	if reason != "" {
		e.log.Warn("refused an enrollment", "node", fleet.ClipKey(keyNode), "pod", rev.PodName, "user", fleet.ClipKey(rev.Username), "reason", reason)
		e.event(keyNode, corev1.EventTypeWarning, ReasonEnrollmentRefuse, "hyperpod-agent enrollment refused: "+reason)
		return
	}
	e.log.Info("approved an enrollment", "node", node, "pod", e.cfg.Namespace+"/"+rev.PodName)
	e.event(node, corev1.EventTypeNormal, ReasonEnrolled, fmt.Sprintf("pod %s/%s enrolled as etcd user %s", e.cfg.Namespace, rev.PodName, etcdauth.NodeRole(node)))
}

func (e *Enroller) approve(ctx context.Context, node string, req etcdauth.EnrollRequest, rev enrollReview) error {
	v, err := json.Marshal(etcdauth.EnrollApproval{Node: node, PublicKey: req.PublicKey, Pod: e.cfg.Namespace + "/" + rev.PodName, PodUID: rev.PodUID, Time: e.now().UTC()})
	if err != nil {
		return err
	}
	l, err := e.etcd.Grant(ctx, etcdauth.EnrollApprovalTTL)
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	if _, err := e.etcd.Put(ctx, e.keys.EnrollApproved(node), string(v), clientv3.WithLease(l.ID)); err != nil {
		return fmt.Errorf("write %s: %w", e.keys.EnrollApproved(node), err)
	}
	return nil
}

// review asks the API server who the token is; err only when it cannot
// answer (an invalid token is a review that did not authenticate).
func (e *Enroller) review(ctx context.Context, token string) (enrollReview, error) {
	if token == "" {
		return enrollReview{Error: "no token"}, nil
	}
	tr, err := e.kube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{e.cfg.audience()}},
	}, metav1.CreateOptions{})
	if err != nil {
		return enrollReview{}, fmt.Errorf("TokenReview: %w", err)
	}
	st := tr.Status
	first := func(k string) string {
		if v := st.User.Extra[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	return enrollReview{Authenticated: st.Authenticated, Error: st.Error, Username: st.User.Username, Audiences: st.Audiences,
		NodeName: first(extraNodeName), PodName: first(extraPodName), PodUID: first(extraPodUID)}, nil
}

// pod reads the pod the token is bound to (in the agent's namespace: a
// token of another namespace's ServiceAccount is refused by the judge).
func (e *Enroller) pod(ctx context.Context, rev enrollReview) enrollPod {
	if !rev.Authenticated || rev.PodName == "" {
		return enrollPod{}
	}
	p, err := e.kube.CoreV1().Pods(e.cfg.Namespace).Get(ctx, rev.PodName, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			e.log.Warn("cannot read an enrolling pod", "pod", rev.PodName, "err", err)
		}
		return enrollPod{}
	}
	return enrollPod{Found: true, UID: string(p.UID), NodeName: p.Spec.NodeName, ServiceAccount: p.Spec.ServiceAccountName, Terminating: p.DeletionTimestamp != nil}
}

func (e *Enroller) event(node, typ, reason, msg string) {
	if e.recorder == nil || api.ValidateNodeName(node) != nil {
		return
	}
	e.recorder.Event(&corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node}, typ, reason, msg)
}

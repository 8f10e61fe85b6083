package kubernetes_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/crypto/nacl/box"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/kubetest"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	kube "github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/manifests"
)

// enrollKube is the Kubernetes side of an enrollment test: two nodes, the
// agent DaemonSet's pod on each, and a pod of another ServiceAccount on
// node-a, each with a token as the kubelet would project it.
type enrollKube struct {
	s                   *kubetest.Server
	cs                  *kubernetes.Clientset
	nodeA, nodeB        string
	agentA, agentB, oth *corev1.Pod
}

func newEnrollKube(t *testing.T, s *kubetest.Server, suffix string) *enrollKube {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	e := &enrollKube{s: s, cs: s.Clientset(t), nodeA: "node-a" + suffix, nodeB: "node-b" + suffix}
	for _, sa := range []string{manifests.AgentServiceAccount, "other"} {
		if _, err := e.cs.CoreV1().ServiceAccounts(manifests.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, n := range []string{e.nodeA, e.nodeB} {
		if _, err := e.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name, sa, node string) *corev1.Pod {
		p, err := e.cs.CoreV1().Pods(manifests.Namespace).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name + suffix},
			Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node, Containers: []corev1.Container{{Name: "agent", Image: "hyperpod-agent:test"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	e.agentA = pod("agent-a", manifests.AgentServiceAccount, e.nodeA)
	e.agentB = pod("agent-b", manifests.AgentServiceAccount, e.nodeB)
	e.oth = pod("other-a", "other", e.nodeA)
	return e
}

// token is the pod's ServiceAccount token for audience, bound to the pod,
// as a projected serviceAccountToken volume holds it.
func (e *enrollKube) token(t *testing.T, p *corev1.Pod, audience string) string {
	t.Helper()
	exp := int64(600)
	tr, err := e.cs.CoreV1().ServiceAccounts(p.Namespace).CreateToken(ctxT(t, 30*time.Second), p.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: &exp,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of pod %s: %v", p.Name, err)
	}
	return tr.Status.Token
}

// nodeEvent waits for an Event of reason on node whose message has want.
func (e *enrollKube) nodeEvent(t *testing.T, node, reason, want string) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("a %s Event on node %s saying %q", reason, node, want), func() (bool, string) {
		evs, err := e.cs.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("involvedObject.name", node).String()})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range evs.Items {
			if ev.Reason == reason && strings.Contains(ev.Message, want) {
				return true, ""
			}
			seen = append(seen, ev.Reason+": "+ev.Message)
		}
		return false, strings.Join(seen, "; ")
	})
}

func connectEtcdAs(t *testing.T, ep, user, pw string) (*clientv3.Client, error) {
	t.Helper()
	cli, err := etcdconn.Connect(ctxT(t, 10*time.Second), etcdconn.Options{Endpoints: []string{ep}, User: user, Password: pw})
	if err == nil {
		t.Cleanup(func() { cli.Close() })
	}
	return cli, err
}

func mustEtcdAs(t *testing.T, ep, dir, user string) *clientv3.Client {
	t.Helper()
	pw := ""
	if dir != "" {
		b, err := os.ReadFile(filepath.Join(dir, user+".password"))
		if err != nil {
			t.Fatal(err)
		}
		pw = strings.TrimSpace(string(b))
	}
	cli, err := connectEtcdAs(t, ep, user, pw)
	if err != nil {
		t.Fatalf("connect to etcd as %q: %v", user, err)
	}
	return cli
}

// Issue 22, Kubernetes: each hyperpod-agent pod gets exactly its own
// node's etcd user. A real kube-apiserver checks the pods' tokens, the
// real controller judges them and the real coordinator mints the users on
// a real etcd with auth on (embedded, and Debian's etcd). The pod on node-a
// enrolls as node-a and can then register node-a and nothing of node-b; a
// token bound to a pod on node-b asking for node-a, a token of another
// ServiceAccount, and a token for another audience are refused (an Event
// on the Node says why; no user, no approval, no reply); and the shared
// enrollment user reads no request, approval or credential, and cannot
// open the sealed reply.
func TestAgentPodEnrollsAsItsOwnNodeOnly(t *testing.T) {
	s := kubetest.Start(t)
	installCRDs(t, s)
	ctlCfg := controllerIdentity(t, s)
	backends := map[string]func(t *testing.T) string{
		"embedded": func(t *testing.T) string {
			srv, _ := etcdtest.Start(t)
			return srv.Endpoints[0]
		},
		"debian-etcd": func(t *testing.T) string {
			bin, ok := etcdtest.DebianEtcd()
			if !ok {
				t.Skipf("Debian's etcd is not installed at %s: apt-get install etcd-server (.ci/run does)", bin)
			}
			return etcdtest.StartBinary(t, bin)
		},
	}
	for i, name := range []string{"embedded", "debian-etcd"} {
		t.Run(name, func(t *testing.T) {
			ep := backends[name](t)
			testEnrollment(t, newEnrollKube(t, s, fmt.Sprintf("-%d", i)), ctlCfg, ep)
		})
	}
}

func testEnrollment(t *testing.T, e *enrollKube, ctlCfg *rest.Config, ep string) {
	k := fleet.NewKeys("")
	ctx := ctxT(t, 3*time.Minute)
	dir := filepath.Join(t.TempDir(), "pw")
	if _, err := etcdauth.BootstrapFleet(ctx, mustEtcdAs(t, ep, "", ""), k, etcdauth.Parties{}, dir); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	root := mustEtcdAs(t, ep, dir, etcdauth.RootUser)
	enroll := mustEtcdAs(t, ep, dir, etcdauth.EnrollUser)
	coordCli, ctlCli := mustEtcdAs(t, ep, dir, etcdauth.CoordinatorUser), mustEtcdAs(t, ep, dir, etcdauth.KubeControllerUser)

	logs := &syncBuf{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("coordinator and controller log:\n%s", logs.String())
		}
	})
	log := slog.New(slog.NewTextHandler(logs, nil))
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	co := coordinator.New(coordCli, coordinator.Config{Logger: log.With("c", "coordinator"), NodeEnrollment: true})
	ctl, err := kube.New(kube.Config{Kube: ctlCfg, Etcd: ctlCli, Auth: true, Logger: log.With("c", "controller"),
		Enroll: &kube.EnrollConfig{Namespace: manifests.Namespace, ServiceAccount: manifests.AgentServiceAccount}})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(2)
	go func() { defer wg.Done(); co.Run(rctx) }()
	go func() { defer wg.Done(); ctl.Run(rctx) }()

	nothingFor := func(node string) {
		t.Helper()
		if _, err := root.UserGet(ctx, etcdauth.NodeRole(node)); err == nil {
			t.Errorf("etcd user %s exists after a refused enrollment", etcdauth.NodeRole(node))
		}
		for _, key := range []string{k.EnrollApproved(node), k.EnrollReply(node)} {
			if r, err := root.Get(ctx, key); err != nil || len(r.Kvs) != 0 {
				t.Errorf("after a refused enrollment, %s exists (%v)", key, err)
			}
		}
	}
	refused := func(what string, p *corev1.Pod, audience, node, rule string) {
		t.Helper()
		actx, acancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := etcdauth.Enroll(actx, enroll, k, node, e.token(t, p, audience))
			done <- err
		}()
		e.nodeEvent(t, node, kube.ReasonEnrollmentRefuse, rule)
		acancel()
		err := <-done
		if !errors.Is(err, etcdauth.ErrEnrollTimeout) || !strings.Contains(err.Error(), "kubectl describe node "+node) {
			t.Errorf("%s: the agent's error %v does not name the likely cause", what, err)
		}
		nothingFor(node)
	}
	refused("a pod on node-b asking for node-a", e.agentB, etcdauth.EnrollAudience, e.nodeA, "wrong-node")
	refused("another ServiceAccount's pod on node-a", e.oth, etcdauth.EnrollAudience, e.nodeA, "wrong-service-account")
	refused("the agent's token for the API server's audience", e.agentA, "https://kubernetes.default.svc", e.nodeA, "not-authenticated")

	// The agent's pod on node-a enrolls as node-a.
	got, err := etcdauth.Enroll(ctxT(t, time.Minute), enroll, k, e.nodeA, e.token(t, e.agentA, etcdauth.EnrollAudience))
	if err != nil {
		t.Fatalf("the agent pod on %s does not enroll: %v", e.nodeA, err)
	}
	if got.User != etcdauth.NodeRole(e.nodeA) {
		t.Fatalf("enrolled as %s, want %s", got.User, etcdauth.NodeRole(e.nodeA))
	}
	e.nodeEvent(t, e.nodeA, kube.ReasonEnrolled, got.User)
	nodeCli, err := connectEtcdAs(t, ep, got.User, got.Password)
	if err != nil {
		t.Fatalf("log in as %s with the enrolled password: %v", got.User, err)
	}
	st := fleet.New(nodeCli, "")
	lease, err := nodeCli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{e.nodeA, e.nodeB} {
		op, err := st.PutNodeOp(devices.Inventory{Node: n, Flavor: "cpu", State: devices.StateReady}, clientv3.WithLease(lease.ID))
		if err != nil {
			t.Fatal(err)
		}
		_, err = nodeCli.Do(ctx, op)
		if n == e.nodeA && err != nil {
			t.Errorf("the enrolled agent registers its own node %s: %v", n, err)
		}
		if n == e.nodeB && !fleet.IsPermissionDenied(err) {
			t.Errorf("the agent enrolled as %s registers %s: %v, want permission denied", e.nodeA, n, err)
		}
	}
	if _, err := nodeCli.Get(ctx, k.NodeAssignments(e.nodeB), clientv3.WithPrefix()); !fleet.IsPermissionDenied(err) {
		t.Errorf("the agent enrolled as %s reads %s's assignments: %v", e.nodeA, e.nodeB, err)
	}

	// The shared enrollment user: no request (tokens), approval, record or
	// credential to read, no approval to forge, and the reply it may read
	// opens only with the requester's key.
	for _, p := range []string{k.EnrollPrefix(), k.EnrollApprovedPrefix(), k.CredsPrefix(), k.NodesPrefix(), k.AssignPrefix(), k.Root()} {
		if _, err := enroll.Get(ctx, p, clientv3.WithPrefix()); !fleet.IsPermissionDenied(err) {
			t.Errorf("the shared enrollment user reads %s: %v, want permission denied", p, err)
		}
	}
	pub, _, _ := box.GenerateKey(rand.Reader)
	forged, _ := json.Marshal(etcdauth.EnrollApproval{Node: e.nodeB, PublicKey: pub[:], Time: time.Now()})
	if _, err := enroll.Put(ctx, k.EnrollApproved(e.nodeB), string(forged)); !fleet.IsPermissionDenied(err) {
		t.Errorf("the shared enrollment user approves itself: %v, want permission denied", err)
	}
	if _, err := enroll.UserChangePassword(ctx, etcdauth.NodeRole(e.nodeA), "mine"); err == nil {
		t.Error("the shared enrollment user sets a node's password")
	}
	r, err := enroll.Get(ctx, k.EnrollReply(e.nodeA))
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("the reply to node-a's agent: %v, %v", r, err)
	}
	var reply etcdauth.EnrollReply
	if err := json.Unmarshal(r.Kvs[0].Value, &reply); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(r.Kvs[0].Value), got.Password) {
		t.Error("the enrollment reply holds the password in clear")
	}
	opub, opriv, _ := box.GenerateKey(rand.Reader)
	if _, ok := box.OpenAnonymous(nil, reply.Sealed, opub, opriv); ok {
		t.Error("another key pair opens node-a's sealed password")
	}
	nothingFor(e.nodeB)
}

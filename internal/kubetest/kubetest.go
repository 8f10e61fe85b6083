// Package kubetest starts a real kube-apiserver for a test, on a private
// embedded etcd (which the test may share for the fleet's records under
// another prefix). No scheduler or controller-manager runs: tests play
// those parts themselves. A test may start real kubelets (StartKubelet,
// each on a private containerd with the CRI plugin); without one, a pod's
// phase is whatever the test sets.
//
// The binary is built from k8s.io/kubernetes at a pinned release by
// scripts/kube-apiserver.sh and cached outside the repository
// ($KUBE_CACHE, default /var/cache/hyperpodrun). When it is absent, the
// tests that need it skip with a message saying how to build it.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/syncbuf"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// daemonLogLimit bounds the daemon's output kept for a failing test's
// message (a long test's chatty daemon starts the buffer over past it).
const daemonLogLimit = 4 << 20

// Version is the Kubernetes release the tests run against.
const Version = "v1.34.2"

// cached is a binary of Version that scripts/kube-apiserver.sh builds
// (KUBE_CMD=name) and caches: $env overrides its path (none when env is
// "").
func cached(name, env string) testutil.CachedBinary {
	build := "scripts/kube-apiserver.sh"
	if name != "kube-apiserver" {
		build = "KUBE_CMD=" + name + " " + build
	}
	return testutil.CachedBinary{Name: name, File: name + "-" + Version, Env: env, CacheEnv: "KUBE_CACHE", Build: build, Takes: "10-20 minutes"}
}

// Binary returns the kube-apiserver's path: $KUBE_APISERVER, else the
// cache of scripts/kube-apiserver.sh; ok is false when it does not exist.
func Binary() (path string, ok bool) { return cached("kube-apiserver", "KUBE_APISERVER").Path() }

// Server is a running kube-apiserver.
type Server struct {
	// URL is the API server's https address.
	URL string
	// AdminToken authenticates as a member of system:masters.
	AdminToken string
	// Etcd is a client of the server's etcd; Endpoints its addresses.
	Etcd      *clientv3.Client
	Endpoints []string
	// Kubeconfig is a kubeconfig file for kubectl, as the admin.
	Kubeconfig string
	// NodeTokens authenticate each of Options.Nodes as its kubelet
	// (system:node:<name> in group system:nodes, which the Node
	// authorizer limits to that node's pods, secrets and status).
	NodeTokens map[string]string

	cmd     *exec.Cmd
	done    chan struct{}
	log     *syncbuf.Buffer
	certDir string
}

// Options are StartWith's.
type Options struct {
	// Nodes are the names of the kubelets (StartKubelet) that will run
	// against the server: each gets a token in NodeTokens.
	Nodes []string
}

// Start runs a kube-apiserver for the test (and an embedded etcd under it)
// and stops both when the test ends. It skips the test when the binary is
// absent.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with options.
func StartWith(t testing.TB, o Options) *Server {
	t.Helper()
	bin := cached("kube-apiserver", "KUBE_APISERVER").Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	etcd, err := etcdembed.Start(ctx, etcdembed.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := etcd.Client()
	if err != nil {
		etcd.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close(); etcd.Close() })

	dir := t.TempDir()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	saKey := filepath.Join(dir, "sa.key")
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	tok := make([]byte, 16)
	rand.Read(tok)
	admin := hex.EncodeToString(tok)
	tokens := filepath.Join(dir, "tokens.csv")
	lines := admin + ",admin,admin,system:masters\n"
	nodeTokens := map[string]string{}
	for _, n := range o.Nodes {
		rand.Read(tok)
		nodeTokens[n] = hex.EncodeToString(tok)
		lines += fmt.Sprintf("%s,system:node:%s,system:node:%s,system:nodes\n", nodeTokens[n], n, n)
	}
	if err := os.WriteFile(tokens, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	port := testutil.FreePort(t)
	s := &Server{URL: "https://127.0.0.1:" + strconv.Itoa(port), AdminToken: admin, Etcd: cli, Endpoints: etcd.Endpoints,
		NodeTokens: nodeTokens, done: make(chan struct{}), log: &syncbuf.Buffer{Limit: daemonLogLimit}, certDir: filepath.Join(dir, "certs")}
	s.cmd = exec.Command(bin,
		"--etcd-servers="+strings.Join(etcd.Endpoints, ","),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+saKey, "--service-account-signing-key-file="+saKey,
		"--token-auth-file="+tokens, "--authorization-mode=Node,RBAC",
		"--secure-port="+strconv.Itoa(port), "--bind-address=127.0.0.1", "--cert-dir="+s.certDir,
		"--service-cluster-ip-range=10.96.0.0/12", "--profiling=false", "--v=0",
		// A kubelet's (StartKubelet) node name resolves nowhere.
		"--kubelet-preferred-address-types=InternalIP,Hostname")
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() { s.stop(t) })
	if err := s.waitReady(90 * time.Second); err != nil {
		t.Fatalf("kube-apiserver not ready: %v\n%s", err, s.log.Tail(4000))
	}
	s.Kubeconfig = filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
`, s.URL, admin)
	if err := os.WriteFile(s.Kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *Server) stop(t testing.TB) {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	if err := syscall.Kill(s.cmd.Process.Pid, 0); err == nil {
		t.Errorf("kube-apiserver (pid %d) still alive after stop", s.cmd.Process.Pid)
	}
}

// Log is the API server's output so far (its last n bytes).
func (s *Server) Log(n int) string { return s.log.Tail(n) }

func (s *Server) waitReady(timeout time.Duration) error {
	cl := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return errors.New("kube-apiserver exited")
		default:
		}
		req, _ := http.NewRequest("GET", s.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+s.AdminToken)
		resp, err := cl.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = fmt.Errorf("/readyz: %s", resp.Status)
		} else {
			last = err
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("after %s: %v", timeout, last)
}

// Config is a client configuration authenticating with token.
func (s *Server) Config(token string) *rest.Config {
	return &rest.Config{Host: s.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 200, Burst: 400}
}

// Admin is the admin's client configuration.
func (s *Server) Admin() *rest.Config { return s.Config(s.AdminToken) }

// Clientset is the admin's typed client.
func (s *Server) Clientset(t testing.TB) *kubernetes.Clientset {
	cs, err := kubernetes.NewForConfig(s.Admin())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// RootCA creates the namespace's ConfigMap kube-root-ca.crt (the API
// server's certificate), which the controller-manager would publish: a
// real kubelet mounts it into every pod with a ServiceAccount token.
func (s *Server) RootCA(t testing.TB, namespace string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	crt, err := os.ReadFile(filepath.Join(s.certDir, "apiserver.crt"))
	if err != nil {
		t.Fatalf("the API server's certificate: %v", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": string(crt)}}
	if _, err := s.Clientset(t).CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// Namespace creates a namespace with its "default" ServiceAccount and its
// kube-root-ca.crt ConfigMap (no controller-manager creates them here, and
// pods need them).
func (s *Server) Namespace(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := s.Clientset(t)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	s.RootCA(t, name)
}

// ServiceAccountToken creates ServiceAccount namespace/name (when absent)
// and returns a token for it from the TokenRequest API: the identity a pod
// of that ServiceAccount would have.
func (s *Server) ServiceAccountToken(t testing.TB, namespace, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs := s.Clientset(t)
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// Kubectl runs Debian's kubectl against the server as the admin; it
// skips the test when kubectl is not installed.
func (s *Server) Kubectl(t testing.TB, args ...string) (string, error) {
	t.Helper()
	bin, err := exec.LookPath("kubectl")
	if err != nil {
		testutil.SkipOrFail(t, "kubectl not installed (Debian's kubectl package)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", s.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

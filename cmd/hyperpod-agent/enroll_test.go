package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// hyperpod-agent run --etcd-enroll, as the Kubernetes DaemonSet runs it:
// holding only the shared enrollment user and its pod's token, the agent
// enrolls and registers its node as the node's own etcd user; when nobody
// approves, it exits with a message that says where to look. The approval
// here is written by the test with the controller's etcd user (the
// TokenReview half is operator-shim/kubernetes's
// TestAgentPodEnrollsAsItsOwnNodeOnly, on a real kube-apiserver); the
// coordinator half runs as in the coordinator.
func TestRunEnrollsAsTheNodesOwnUser(t *testing.T) {
	srv, _ := etcdtest.Start(t)
	ep := srv.Endpoints[0]
	k := fleet.NewKeys("")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	connect := func(user, pw string) *clientv3.Client {
		t.Helper()
		cli, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: []string{ep}, User: user, Password: pw})
		if err != nil {
			t.Fatalf("connect as %q: %v", user, err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	dir := filepath.Join(t.TempDir(), "pw")
	if _, err := etcdauth.BootstrapFleet(ctx, connect("", ""), k, etcdauth.Parties{}, dir); err != nil {
		t.Fatal(err)
	}
	pw := func(user string) string {
		b, err := os.ReadFile(filepath.Join(dir, user+".password"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	root, ctl := connect(etcdauth.RootUser, pw(etcdauth.RootUser)), connect(etcdauth.KubeControllerUser, pw(etcdauth.KubeControllerUser))
	sctx, stop := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() { defer close(served); etcdauth.ServeEnrollments(sctx, root, k, nil, nil) }()
	defer func() { stop(); <-served }()
	// The controller's verdict: only the token "pod-on-k8s-1" for k8s-1.
	go func() {
		for wr := range ctl.Watch(sctx, k.EnrollPrefix(), clientv3.WithPrefix()) {
			for _, ev := range wr.Events {
				var req etcdauth.EnrollRequest
				if ev.Type != clientv3.EventTypePut || json.Unmarshal(ev.Kv.Value, &req) != nil || req.Token != "pod-on-k8s-1" || req.Node != "k8s-1" {
					continue
				}
				a, _ := json.Marshal(etcdauth.EnrollApproval{Node: req.Node, PublicKey: req.PublicKey, Time: time.Now()})
				ctl.Put(sctx, k.EnrollApproved(req.Node), string(a))
			}
		}
	}()

	files := t.TempDir()
	pwFile, tokFile := filepath.Join(files, "enroll.password"), filepath.Join(files, "token")
	if err := os.WriteFile(pwFile, []byte(pw(etcdauth.EnrollUser)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := func(node string) []string {
		return []string{"hyperpod-agent", "run", "--etcd-endpoints", ep, "--etcd-user", etcdauth.EnrollUser, "--etcd-password-file", pwFile,
			"--etcd-enroll", tokFile, "--etcd-enroll-timeout", "2s", "--node-name", node, "--run-jobs=false", "--listen", "",
			"--lease-ttl", "2s", "--disable-nvml", "--neuron-sysfs-root", trn2Sysfs, "--dev-root", trn2Dev}
	}

	// Refused: a token nobody approves. The agent says where to look.
	if err := os.WriteFile(tokFile, []byte("pod-on-k8s-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var refusedLog syncBuffer
	if code := run(args("k8s-1"), &syncBuffer{}, &refusedLog, nil); code == exitOK || !strings.Contains(refusedLog.String(), "kubectl describe node k8s-1") {
		t.Errorf("an unapproved enrollment: exit %d, %s", code, refusedLog.String())
	}
	if _, err := root.UserGet(ctx, etcdauth.NodeRole("k8s-1")); err == nil {
		t.Error("a refused enrollment created the node's user")
	}

	// Approved: the agent registers its node as hyperpod-node-k8s-1.
	if err := os.WriteFile(tokFile, []byte("pod-on-k8s-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sig := make(chan os.Signal, 1)
	var errb syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(args("k8s-1"), &syncBuffer{}, &errb, sig) }()
	testutil.Eventually(t, 30*time.Second, "node k8s-1 registered by its enrolled agent", func() (bool, string) {
		r, err := root.Get(ctx, k.Node("k8s-1"))
		if err != nil || len(r.Kvs) == 0 {
			return false, errb.String()
		}
		return true, ""
	})
	if !strings.Contains(errb.String(), "enrolled: connected to etcd as this node's own user") || !strings.Contains(errb.String(), etcdauth.NodeRole("k8s-1")) {
		t.Errorf("the agent's log does not say it runs as its node's own user:\n%s", errb.String())
	}
	sig <- syscall.SIGTERM
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit %d after SIGTERM:\n%s", code, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit within 30s of SIGTERM")
	}
}

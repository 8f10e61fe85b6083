package etcdauth

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/crypto/nacl/box"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// The etcd half of a Kubernetes agent pod's enrollment, without the
// Kubernetes half: the shared enrollment user writes a request and reads
// nothing else; only an approval (which the controller writes, and the
// shared user cannot) gets an answer; the coordinator creates the node's
// user and seals its password to the requester's key, so the shared user,
// which may read the reply, cannot open it; the password logs in as that
// node only. On the embedded etcd and Debian's.
func TestEnrollmentGivesTheApprovedKeyItsNodeUserOnly(t *testing.T) {
	for name, start := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ep := start(t)
			k := fleet.NewKeys("")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			dir := filepath.Join(t.TempDir(), "pw")
			if _, err := BootstrapFleet(ctx, mustConnectAs(t, ep, "", ""), k, Parties{}, dir); err != nil {
				t.Fatal(err)
			}
			pw := func(user string) string { return filepath.Join(dir, user+".password") }
			root := mustConnectAs(t, ep, RootUser, pw(RootUser))
			ctl := mustConnectAs(t, ep, KubeControllerUser, pw(KubeControllerUser))
			enroll := mustConnectAs(t, ep, EnrollUser, pw(EnrollUser))

			sctx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				ServeEnrollments(sctx, root, k, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
			}()
			defer func() { stop(); wg.Wait() }()

			type result struct {
				e   *Enrolled
				err error
			}
			done := make(chan result, 1)
			go func() {
				e, err := Enroll(ctx, enroll, k, "node-a", "the-pod-token")
				done <- result{e, err}
			}()
			// The controller's part: it reads the request and approves it.
			var req EnrollRequest
			testutil.Eventually(t, 20*time.Second, "node-a's enrollment request", func() (bool, string) {
				r, err := ctl.Get(ctx, k.Enroll("node-a"))
				if err != nil || len(r.Kvs) == 0 {
					return false, "none"
				}
				return json.Unmarshal(r.Kvs[0].Value, &req) == nil, string(r.Kvs[0].Value)
			})
			if req.Node != "node-a" || req.Token != "the-pod-token" || !ValidEnrollKey(req.PublicKey) {
				t.Fatalf("request %+v", req)
			}
			// What the shared user cannot do: read requests (their tokens),
			// approvals, credentials or records, approve, or set passwords.
			for _, p := range []string{k.EnrollPrefix(), k.EnrollApprovedPrefix(), k.CredsPrefix(), k.AssignPrefix(), k.NodesPrefix()} {
				if _, err := enroll.Get(ctx, p, clientv3.WithPrefix()); !fleet.IsPermissionDenied(err) {
					t.Errorf("the shared enrollment user reads %s: %v, want permission denied", p, err)
				}
			}
			opub, opriv, _ := box.GenerateKey(rand.Reader)
			forged, _ := json.Marshal(EnrollApproval{Node: "node-a", PublicKey: opub[:]})
			if _, err := enroll.Put(ctx, k.EnrollApproved("node-a"), string(forged)); !fleet.IsPermissionDenied(err) {
				t.Errorf("the shared enrollment user approves a key of its own: %v, want permission denied", err)
			}
			if _, err := enroll.UserAdd(ctx, NodeRole("node-b"), "x"); err == nil {
				t.Error("the shared enrollment user creates a node user")
			}
			if _, err := root.UserGet(ctx, NodeRole("node-a")); err == nil {
				t.Error("node-a's user exists before any approval")
			}
			a, _ := json.Marshal(EnrollApproval{Node: "node-a", PublicKey: req.PublicKey, Pod: "hyperpodrun/agent-x", Time: time.Now()})
			if _, err := ctl.Put(ctx, k.EnrollApproved("node-a"), string(a)); err != nil {
				t.Fatalf("the controller approves: %v", err)
			}
			var got result
			select {
			case got = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("no enrollment within 30s of the approval")
			}
			if got.err != nil || got.e.User != NodeRole("node-a") {
				t.Fatalf("enrolled %+v, %v", got.e, got.err)
			}
			r, err := enroll.Get(ctx, k.EnrollReply("node-a"))
			if err != nil || len(r.Kvs) != 1 {
				t.Fatalf("reply: %v %v", r, err)
			}
			var reply EnrollReply
			if err := json.Unmarshal(r.Kvs[0].Value, &reply); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(r.Kvs[0].Value), got.e.Password) {
				t.Error("the reply holds the password in clear")
			}
			if _, ok := box.OpenAnonymous(nil, reply.Sealed, opub, opriv); ok {
				t.Error("a key other than the requester's opens the reply")
			}
			if r, err := root.Get(ctx, k.EnrollApproved("node-a")); err != nil || len(r.Kvs) != 0 {
				t.Errorf("the approval is still there after the reply: %v", err)
			}
			node, err := connectAsPassword(t, ep, got.e.User, got.e.Password)
			if err != nil {
				t.Fatalf("log in with the enrolled password: %v", err)
			}
			if _, err := node.Put(ctx, k.Alive("node-a"), "1"); err != nil {
				t.Errorf("node-a writes its liveness key: %v", err)
			}
			if _, err := node.Put(ctx, k.Alive("node-b"), "1"); !fleet.IsPermissionDenied(err) {
				t.Errorf("node-a writes node-b's liveness key: %v", err)
			}
		})
	}
}

// An agent whose enrollment nobody answers says why, not just "timeout".
func TestEnrollWithoutAnswerNamesTheLikelyCause(t *testing.T) {
	for name, start := range backends(t) {
		if name != "embedded" {
			continue
		}
		ep := start(t)
		k := fleet.NewKeys("")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		dir := filepath.Join(t.TempDir(), "pw")
		if _, err := BootstrapFleet(ctx, mustConnectAs(t, ep, "", ""), k, Parties{}, dir); err != nil {
			t.Fatal(err)
		}
		enroll := mustConnectAs(t, ep, EnrollUser, filepath.Join(dir, EnrollUser+".password"))
		ectx, ecancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer ecancel()
		_, err := Enroll(ectx, enroll, k, "node-a", "tok")
		if !errors.Is(err, ErrEnrollTimeout) || !strings.Contains(err.Error(), "kubectl describe node node-a") || !strings.Contains(err.Error(), "ServiceAccount") {
			t.Errorf("error %v does not name the likely cause", err)
		}
		if _, err := Enroll(ctx, enroll, k, "../x", "tok"); err == nil {
			t.Error("a node name escaping its key was accepted")
		}
	}
}

func connectAsPassword(t *testing.T, ep, user, pw string) (*clientv3.Client, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: []string{ep}, User: user, Password: pw})
	if err == nil {
		t.Cleanup(func() { cli.Close() })
	}
	return cli, err
}

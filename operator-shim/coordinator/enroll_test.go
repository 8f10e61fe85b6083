package coordinator

import (
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/crypto/nacl/box"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/syncbuf"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// An enrollment's answer resets the node's etcd password, which no
// leadership compare can guard: a leader whose term's end has passed (a
// long pause just ended, its term's timer has not run yet) answers no
// approval, so it cannot reset the password of a node the new leader has
// just enrolled. The approval stays and is read again: once a renewal
// moves the term's end, the same leader answers it.
func TestALeaderPastItsTermAnswersNoEnrollment(t *testing.T) {
	cli, ctx := setup(t)
	k := fleet.NewKeys("")
	dir := filepath.Join(t.TempDir(), "pw")
	if _, err := etcdauth.BootstrapFleet(ctx, cli, k, etcdauth.Parties{Teams: []string{"a"}, Nodes: []string{"node-a"}}, dir); err != nil {
		t.Fatal(err)
	}
	login := func(user string) (*clientv3.Client, error) {
		pw, err := etcdconn.ReadPassword(filepath.Join(dir, user+".password"), "", "test")
		if err != nil {
			t.Fatal(err)
		}
		return etcdconn.Connect(ctx, etcdconn.Options{Endpoints: cli.Endpoints(), User: user, Password: pw})
	}
	as := func(user string) *clientv3.Client {
		c, err := login(user)
		if err != nil {
			t.Fatalf("log in as %s: %v", user, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	root, ctl := as(etcdauth.RootUser), as(etcdauth.KubeControllerUser)
	pub, _, err := box.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(etcdauth.EnrollApproval{Node: "node-a", PublicKey: pub[:], Pod: "hyperpodrun/agent-x", Time: time.Now()})
	if _, err := ctl.Put(ctx, k.EnrollApproved("node-a"), string(a)); err != nil {
		t.Fatalf("the controller approves: %v", err)
	}

	var logs syncbuf.Buffer
	var renewed atomic.Bool
	c := New(root, Config{Identity: "old", NodeEnrollment: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	c.term = &leaderTerm{ctx: ctx, end: func() time.Time {
		if renewed.Load() {
			return time.Now().Add(time.Minute)
		}
		return time.Now().Add(-time.Millisecond) // its lease's deadline less the margin has passed
	}}
	stop := c.serveEnrollments(ctx)
	defer stop()
	testutil.Eventually(t, 20*time.Second, "the leader's answer or refusal in its log", func() (bool, string) {
		l := logs.String()
		return strings.Contains(l, "cannot answer a node's enrollment") || strings.Contains(l, "enrolled a node"), l
	})
	if l := logs.String(); !strings.Contains(l, "cannot answer a node's enrollment") {
		t.Fatalf("a leader past its term did not refuse node-a's enrollment: %s", l)
	}
	if r, err := root.Get(ctx, k.EnrollReply("node-a")); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("a leader past its term answered node-a's enrollment (%v, %v)", r.Kvs, err)
	}
	if r, err := root.Get(ctx, k.EnrollApproved("node-a")); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("node-a's approval after the refusal: %v, %v; want it kept", r.Kvs, err)
	}
	nc, err := login(etcdauth.NodeRole("node-a"))
	if err != nil {
		t.Fatalf("a leader past its term reset node-a's password: %v", err)
	}
	nc.Close()

	renewed.Store(true) // a renewal's answer moved the term's end
	testutil.Eventually(t, 20*time.Second, "node-a's enrollment reply once the term goes on", func() (bool, string) {
		r, err := root.Get(ctx, k.EnrollReply("node-a"))
		return err == nil && len(r.Kvs) == 1, logs.String()
	})
	if nc, err := login(etcdauth.NodeRole("node-a")); err == nil {
		nc.Close()
		t.Error("within its term the leader answered node-a's enrollment but its old password still logs in")
	}
}

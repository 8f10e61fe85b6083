package coordinator

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// With etcd auth on, an admitted job holds credentials before its desired
// record exists, and loses them once it is deleted and none of its nodes
// is left in its rendezvous; its user then no longer authenticates.
func TestJobCredentialsMintedOnAdmissionAndRevokedWhenTheJobEnds(t *testing.T) {
	ctx, st, as := teamAFleet(t)
	coordCli, team := as(etcdauth.CoordinatorUser), fleet.New(as(etcdauth.TeamRole("a")), "")

	// Watch the order in which a job's credentials and desired record appear.
	w := coordCli.Watch(ctx, st.Keys.Root(), clientv3.WithPrefix()) // root: the admin may not read creds/
	c := New(coordCli, Config{Identity: "c", Resync: 100 * time.Millisecond, JobCredentials: true, Engine: policy.Config{MinStablePeriod: -1}})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	defer func() { cancel(); <-done }()
	if err := team.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}}); err != nil {
		t.Fatal(err)
	}
	var first string
	for first == "" {
		select {
		case r := <-w:
			for _, ev := range r.Events {
				k := string(ev.Kv.Key)
				if k == st.Keys.Creds("j") || k == st.Keys.Desired("j") {
					first = k
				}
			}
		case <-ctx.Done():
			t.Fatal("the job was never admitted")
		}
	}
	if first != st.Keys.Creds("j") {
		t.Fatalf("%s was written before the job's credentials: a node agent could start the job without its own etcd user", first)
	}
	// creds/ is the coordinator's (and the kube controller's): node agents
	// get a job's credentials in its assignments.
	agent := fleet.New(coordCli, "")
	creds, err := agent.Creds(ctx, "j")
	if err != nil || creds == nil || creds.User != etcdauth.JobRole("j") {
		t.Fatalf("credentials of the admitted job: %+v, %v", creds, err)
	}
	if err := team.DeleteJob(ctx, "j"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := agent.Creds(ctx, "j")
		if err == nil && c == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the deleted job's credentials are still there: %+v, %v", c, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: coordCli.Endpoints(), User: creds.User, Password: creds.Password}); err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Errorf("the revoked job's user still connects: %v", err)
	}
}

// A leader that does not know another leader minted a job's credentials
// since it listed the users (it was deposed and does not know yet, or the
// other minted meanwhile) reuses them: minting again would reset the
// password the job's hyperpodruns already hold.
func TestMintReusesCredentialsAnotherLeaderMinted(t *testing.T) {
	ctx, st, as := teamAFleet(t)
	coordCli := as(etcdauth.CoordinatorUser)
	c := New(coordCli, Config{Identity: "old", JobCredentials: true})
	if err := c.loadMinted(ctx); err != nil { // this term lists no job users
		t.Fatal(err)
	}
	theirs, err := etcdauth.Mint(ctx, coordCli, st.Keys, "j") // the other leader
	if err != nil {
		t.Fatal(err)
	}
	if err := c.mintFor(ctx, []api.Allocation{{Job: "j"}}); err != nil {
		t.Fatal(err)
	}
	if got := c.creds["j"]; got == nil || got.Password != theirs.Password {
		t.Fatalf("the coordinator holds %+v for the job, not the other leader's credentials", got)
	}
	jc, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: coordCli.Endpoints(), User: theirs.User, Password: theirs.Password})
	if err != nil {
		t.Fatalf("the job's hyperpodruns lost etcd: their password was reset: %v", err)
	}
	jc.Close()
}

// A leader whose lease may have ended (deposed without knowing yet: a long
// pause, a partition) neither revokes the credentials of a job another
// leader may just have admitted, nor mints any: etcd's users cannot be
// guarded by a leadership compare. Within its lease it does both.
func TestALeaderPastItsLeaseChangesNoCredentials(t *testing.T) {
	ctx, st, as := teamAFleet(t)
	coordCli := as(etcdauth.CoordinatorUser)
	c := New(coordCli, Config{Identity: "old", JobCredentials: true})
	if err := c.loadMinted(ctx); err != nil {
		t.Fatal(err)
	}
	theirs, err := etcdauth.Mint(ctx, coordCli, st.Keys, "j") // the new leader, for a job it admitted
	if err != nil {
		t.Fatal(err)
	}
	c.minted["j"] = true // the old leader's view: j ended (it minted j in an earlier run)
	ended, end := context.WithCancel(ctx)
	end()
	c.term = &leaderTerm{ctx: ended} // its lease's deadline less the margin has passed

	c.revokeEnded(ctx, map[string]bool{})
	jc, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: coordCli.Endpoints(), User: theirs.User, Password: theirs.Password})
	if err != nil {
		t.Fatalf("a leader past its lease revoked the credentials another leader minted: %v", err)
	}
	jc.Close()
	if err := c.mintFor(ctx, []api.Allocation{{Job: "k"}}); !errors.Is(err, errNotInTerm) {
		t.Fatalf("mintFor past the lease = %v, want errNotInTerm", err)
	}
	if has, err := etcdauth.HasJobUser(ctx, coordCli, "k"); err != nil || has {
		t.Fatalf("a leader past its lease minted a user for k (%v, %v)", has, err)
	}
	// Its term's timer has not run yet (a long pause just ended), but the
	// lease's deadline less the margin has passed.
	c.term = &leaderTerm{ctx: ctx, end: func() time.Time { return time.Now().Add(-time.Millisecond) }}
	c.revokeEnded(ctx, map[string]bool{})
	if has, err := etcdauth.HasJobUser(ctx, coordCli, "j"); err != nil || !has {
		t.Fatalf("a leader whose term's end has passed revoked j's credentials (%v, %v)", has, err)
	}

	c.term = &leaderTerm{ctx: ctx} // within its term
	c.revokeEnded(ctx, map[string]bool{})
	if has, err := etcdauth.HasJobUser(ctx, coordCli, "j"); err != nil || has {
		t.Fatalf("within its lease the leader did not revoke j's ended credentials (%v, %v)", has, err)
	}
	if err := c.mintFor(ctx, []api.Allocation{{Job: "k"}}); err != nil {
		t.Fatalf("within its lease: %v", err)
	}
}

// teamAFleet turns etcd auth on for a fleet with team a
// (etcdauth.Bootstrap) and returns its store and a login as each
// bootstrapped user (closed at the test's end).
func teamAFleet(t *testing.T) (context.Context, *fleet.Store, func(user string) *clientv3.Client) {
	t.Helper()
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	dir := filepath.Join(t.TempDir(), "pw")
	if _, err := etcdauth.Bootstrap(ctx, cli, st.Keys, []string{"a"}, dir); err != nil {
		t.Fatal(err)
	}
	eps := cli.Endpoints()
	as := func(user string) *clientv3.Client {
		t.Helper()
		pw, err := etcdconn.ReadPassword(filepath.Join(dir, user+".password"), "", "test")
		if err != nil {
			t.Fatal(err)
		}
		c, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: eps, User: user, Password: pw})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return ctx, st, as
}

package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// A team applied after elasticctl auth bootstrap (etcd auth on) gets its
// etcd user from the coordinator, as the bootstrap's teams have theirs: its
// password is in the team-creds record, the user logs in with it and may
// submit its own team's jobs and no other team's. A bootstrapped team's
// user keeps its password.
func TestTeamAppliedAfterBootstrapGetsItsUser(t *testing.T) {
	ctx, _, as := teamAFleet(t)
	eps := as(etcdauth.RootUser).Endpoints()
	login := func(user, pw string) (*clientv3.Client, error) {
		c, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: eps, User: user, Password: pw})
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}
	root := fleet.New(as(etcdauth.RootUser), "")
	c := New(as(etcdauth.CoordinatorUser), Config{Identity: "c", Resync: 100 * time.Millisecond, JobCredentials: true, Engine: policy.Config{MinStablePeriod: -1}})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	defer func() { cancel(); <-done }()

	admin := fleet.New(as(etcdauth.AdminUser), "")
	if err := admin.PutTeam(ctx, policy.Team{Name: "vision", Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 16}}}); err != nil {
		t.Fatal(err)
	}
	var creds *fleet.TeamCreds
	testutil.Eventually(t, 20*time.Second, "team vision's etcd user", func() (bool, string) {
		var err error
		creds, err = root.TeamCredsOf(ctx, "vision")
		return creds != nil, fmt.Sprint(err)
	})
	if creds.User != etcdauth.TeamRole("vision") {
		t.Fatalf("team vision's user is %q", creds.User)
	}
	// The record is written before the user is created (no user without
	// a kept password), and the role is granted after: wait for both.
	testutil.Eventually(t, 20*time.Second, "team vision's user to hold its role", func() (bool, string) {
		r, err := root.Cli.UserGet(ctx, creds.User)
		return err == nil && slices.Contains(r.Roles, etcdauth.TeamRole("vision")), fmt.Sprint(r, err)
	})
	vc, err := login(creds.User, creds.Password)
	if err != nil {
		t.Fatalf("team vision's user cannot log in with its recorded password: %v", err)
	}
	vision := fleet.New(vc, "")
	job := func(name, team string) fleet.JobSpec {
		return fleet.JobSpec{Job: policy.Job{Name: name, Team: team, PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}}
	}
	if err := vision.SubmitJob(ctx, job("v1", "vision")); err != nil {
		t.Errorf("team vision submits its own job: %v", err)
	}
	if err := vision.SubmitJob(ctx, job("a1", "a")); err == nil || !fleet.IsPermissionDenied(err) {
		t.Errorf("team vision submits team a's job: %v; want permission denied", err)
	}
	// The bootstrapped team's user is kept, password and all.
	if cr, err := root.TeamCredsOf(ctx, "a"); err != nil || cr != nil {
		t.Errorf("team a (bootstrapped) got a coordinator record: %+v %v", cr, err)
	}
	if err := fleet.New(as(etcdauth.TeamRole("a")), "").SubmitJob(ctx, job("a2", "a")); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("team a's bootstrapped user: %v", err)
	}
	// Only root reads the record.
	if _, err := admin.TeamCredsOf(ctx, "vision"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("the admin read team vision's password: %v", err)
	}

	// A team deleted while the coordinator leads loses its user, role and
	// kept password: its old password no longer logs in. A team whose
	// record turns malformed leaves the view but keeps its user, and the
	// bootstrapped team a (never applied) keeps its own.
	if err := admin.PutTeam(ctx, policy.Team{Name: "audio", Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 8}}}); err != nil {
		t.Fatal(err)
	}
	var audio *fleet.TeamCreds
	testutil.Eventually(t, 20*time.Second, "team audio's etcd user", func() (bool, string) {
		var err error
		audio, err = root.TeamCredsOf(ctx, "audio")
		return audio != nil, fmt.Sprint(err)
	})
	if _, err := admin.Cli.Put(ctx, admin.Keys.Team("audio"), "{not a team"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Cli.Delete(ctx, admin.Keys.Team("vision")); err != nil {
		t.Fatal(err)
	}
	// The user goes first, then its kept password: wait for both.
	testutil.Eventually(t, 20*time.Second, "team vision's user and kept password to be removed", func() (bool, string) {
		_, err := root.Cli.UserGet(ctx, creds.User)
		cr, cerr := root.TeamCredsOf(ctx, "vision")
		gone := err != nil && strings.Contains(err.Error(), "user name not found")
		return gone && cerr == nil && cr == nil, fmt.Sprint(err, cr, cerr)
	})
	if _, err := login(creds.User, creds.Password); err == nil {
		t.Error("deleted team vision's user still logs in with its old password")
	}
	if r, err := root.Cli.RoleGet(ctx, etcdauth.TeamRole("vision")); err == nil {
		t.Errorf("deleted team vision's role is still there: %v", r.Perm)
	}
	if cr, err := root.TeamCredsOf(ctx, "vision"); err != nil || cr != nil {
		t.Errorf("deleted team vision's kept password is still there: %+v %v", cr, err)
	}
	for _, team := range []string{"audio", "a"} {
		if _, err := root.Cli.UserGet(ctx, etcdauth.TeamRole(team)); err != nil {
			t.Errorf("team %s's user was removed: %v", team, err)
		}
	}
	if _, err := login(audio.User, audio.Password); err != nil {
		t.Errorf("team audio (malformed record) can no longer log in: %v", err)
	}
}

func TestTeamsGone(t *testing.T) {
	for _, tc := range []struct {
		rule     string
		madeSure []string
		inView   []string
		want     []string
	}{
		{rule: "every team still in the view keeps its user", madeSure: []string{"a", "b"}, inView: []string{"a", "b"}},
		{rule: "a team that left the view is a candidate", madeSure: []string{"a", "b", "c"}, inView: []string{"b"}, want: []string{"a", "c"}},
		{rule: "a team made sure of that left an empty view is a candidate", madeSure: []string{"a"}, inView: nil, want: []string{"a"}},
		{rule: "no team made sure of, nothing to remove", inView: []string{"a"}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			made := map[string]bool{}
			for _, n := range tc.madeSure {
				made[n] = true
			}
			view := map[string]api.Team{}
			for _, n := range tc.inView {
				view[n] = api.Team{Name: n}
			}
			if got := teamsGone(made, view); !slices.Equal(got, tc.want) {
				t.Errorf("teamsGone = %v, want %v", got, tc.want)
			}
		})
	}
}

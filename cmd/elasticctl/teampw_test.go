package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// A team applied after auth bootstrap gets its user from the coordinator;
// running the bootstrap again as root writes that user's password file,
// with which the team's elasticctl works.
func TestBootstrapAgainWritesACoordinatorMadeTeamPassword(t *testing.T) {
	ep, _ := startFleet(t, 1)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	dir := filepath.Join(t.TempDir(), "pw")
	mustCtl(t, ep, "auth", "bootstrap", "--password-dir", dir)
	as := func(user string) []string {
		return []string{"--etcd-user", user, "--etcd-password-file", filepath.Join(dir, user+".password")}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pw, err := etcdconn.ReadPassword(filepath.Join(dir, etcdauth.CoordinatorUser+".password"), "", "test")
	if err != nil {
		t.Fatal(err)
	}
	cc, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: []string{ep}, User: etcdauth.CoordinatorUser, Password: pw})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	coord := coordinator.New(cc, coordinator.Config{Identity: "c", Resync: 100 * time.Millisecond, JobCredentials: true, Engine: policy.Config{MinStablePeriod: -1}})
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { coord.Run(cctx); close(done) }()
	defer func() { stop(); <-done }()

	vision := "teams:\n- name: vision\n  quotas:\n  - flavor: nvidia-h100-80gb\n    nominal: 8\n"
	mustCtl(t, ep, append(as(etcdauth.AdminUser), "apply", "-f", writeFile(t, "vision.yaml", vision))...)
	user := etcdauth.TeamRole("vision")
	testutil.Eventually(t, 20*time.Second, "the coordinator to create team vision's user with its role", func() (bool, string) {
		r, err := cc.UserGet(ctx, user)
		return err == nil && slices.Contains(r.Roles, user), fmt.Sprint(r, err)
	})
	out := mustCtl(t, ep, append(as(etcdauth.RootUser), "auth", "bootstrap", "--password-dir", dir)...)
	if !strings.Contains(out, "user "+user+" exists (created by the coordinator): password in "+filepath.Join(dir, user+".password")) ||
		!strings.Contains(out, "user hyperpod-team-research exists: password unchanged") {
		t.Errorf("bootstrap again:\n%s", out)
	}
	if out, errs, code := ctl(t, ep, append(as(user), "get", "jobs")...); code != 0 {
		t.Errorf("team vision's elasticctl with the written password: exit %d\n%s%s", code, out, errs)
	}
}

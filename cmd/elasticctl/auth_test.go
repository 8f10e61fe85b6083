package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Team prod's elasticctl resizes, suspends or deletes team research's job:
// etcd refuses (auth on after `elasticctl auth bootstrap`), elasticctl exits
// 1 naming the user, and the job is unchanged.
func TestAuthTeamCannotTouchAnotherTeamsJob(t *testing.T) {
	ep, _ := startFleet(t, 2)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	dir := filepath.Join(t.TempDir(), "pw")
	out := mustCtl(t, ep, "auth", "bootstrap", "--password-dir", dir)
	for _, want := range []string{"user hyperpod-team-research created", "user hyperpod-team-prod created", "user root created", "etcd auth is now on"} {
		if !strings.Contains(out, want) {
			t.Errorf("bootstrap output lacks %q:\n%s", want, out)
		}
	}
	as := func(user string) []string {
		return []string{"--etcd-user", user, "--etcd-password-file", filepath.Join(dir, user+".password")}
	}
	// Without a user, nothing.
	if _, errs, code := ctl(t, ep, "get", "jobs"); code != 1 || !strings.Contains(errs, "user name") {
		t.Errorf("get jobs without a user: exit %d, %q; want 1 and etcd's refusal", code, errs)
	}
	job := writeFile(t, "sweep.yaml", elasticJob)
	if _, errs, code := ctl(t, ep, append(as("hyperpod-team-research"), "submit", "-f", job)...); code != 0 {
		t.Fatalf("research submits its job: exit %d: %s", code, errs)
	}
	for _, args := range [][]string{{"resize", "job", "sweep", "--max", "1"}, {"suspend", "sweep"}, {"delete", "sweep"}} {
		_, errs, code := ctl(t, ep, append(as("hyperpod-team-prod"), args...)...)
		if code != 1 || !strings.Contains(errs, "permission denied") || !strings.Contains(errs, `etcd user "hyperpod-team-prod" may not do this`) {
			t.Errorf("prod: elasticctl %s: exit %d, %q; want 1, permission denied naming the user", strings.Join(args, " "), code, errs)
		}
	}
	// Raising one's own quota is the admin's.
	if _, errs, code := ctl(t, ep, append(as("hyperpod-team-research"), "apply", "-f", writeFile(t, "t.yaml", teamsYAML))...); code != 1 || !strings.Contains(errs, "permission denied") {
		t.Errorf("research applies teams: exit %d, %q; want permission denied", code, errs)
	}
	out, errs, code := ctl(t, ep, append(as("hyperpod-team-research"), "get", "jobs", "sweep", "-o", "yaml")...)
	if code != 0 || !strings.Contains(out, "maxNodes: 4") || strings.Contains(out, "suspended: true") {
		t.Errorf("research's job after prod's attempts (exit %d, %s):\n%s", code, errs, out)
	}
	// The password comes from a file (0600) or the environment, never a flag.
	if _, errs, code := ctl(t, ep, "--etcd-password", "x", "get", "jobs"); code != 2 {
		t.Errorf("--etcd-password: exit %d, %q; want 2 (no such flag)", code, errs)
	}
	pw, _ := os.ReadFile(filepath.Join(dir, "hyperpod-team-research.password"))
	t.Setenv("ELASTICCTL_ETCD_PASSWORD", strings.TrimSpace(string(pw)))
	if _, errs, code := ctl(t, ep, "--etcd-user", "hyperpod-team-research", "get", "jobs"); code != 0 {
		t.Errorf("password from $ELASTICCTL_ETCD_PASSWORD: exit %d, %q", code, errs)
	}
}

// Node users: `auth bootstrap --node` creates one per node, `auth
// add-node` (as root) one for a node added later; a team may not, and a
// node name that would escape its key is a usage error.
func TestAuthNodeUsers(t *testing.T) {
	ep, _ := startFleet(t, 1)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	dir := filepath.Join(t.TempDir(), "pw")
	out := mustCtl(t, ep, "auth", "bootstrap", "--node", "node-a", "--password-dir", dir)
	if !strings.Contains(out, "user hyperpod-node-node-a created: password in "+filepath.Join(dir, "hyperpod-node-node-a.password")) {
		t.Errorf("bootstrap --node output:\n%s", out)
	}
	as := func(user string) []string {
		return []string{"--etcd-user", user, "--etcd-password-file", filepath.Join(dir, user+".password")}
	}
	if _, errs, code := ctl(t, ep, append(as("hyperpod-team-research"), "auth", "add-node", "node-b", "--password-dir", dir)...); code != 1 || !strings.Contains(errs, "permission denied") {
		t.Errorf("a team adds a node user: exit %d, %q; want permission denied", code, errs)
	}
	out, errs, code := ctl(t, ep, append(as("root"), "auth", "add-node", "node-b", "node-a", "--password-dir", dir)...)
	if code != 0 || !strings.Contains(out, "user hyperpod-node-node-b created") || !strings.Contains(out, "user hyperpod-node-node-a exists: password unchanged") {
		t.Errorf("root adds node-b: exit %d, %s\n%s", code, errs, out)
	}
	if fi, err := os.Stat(filepath.Join(dir, "hyperpod-node-node-b.password")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("node-b's password file: %v", err)
	}
	if _, errs, code := ctl(t, ep, append(as("root"), "auth", "add-node", "a/b", "--password-dir", dir)...); code != 2 {
		t.Errorf("add-node a/b: exit %d, %q; want a usage error", code, errs)
	}
	// A node's user sees what users see, not another node's keys.
	if _, errs, code := ctl(t, ep, append(as("hyperpod-node-node-a"), "get", "jobs")...); code != 0 {
		t.Errorf("node-a's user reads jobs: exit %d, %q", code, errs)
	}
}

package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// TestDemoScenario runs the demo end to end and asserts what it shows: the
// elastic job grows to the whole fleet, shrinks to 2 nodes when prod takes
// its quota back, grows back to 4 when prod finishes, and loses no step.
func TestDemoScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end")
	}
	bin := t.TempDir()
	for _, b := range [][2]string{{"hyperpodrun", "../../cmd/hyperpodrun"}, {"worker", "../worker"}} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, b[0]), b[1]).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b[0], err, out)
		}
	}
	wd, _ := os.Getwd()
	os.Chdir(filepath.Join(wd, "..", ".."))
	defer os.Chdir(wd)
	var out bytes.Buffer
	res, err := scenario(options{hyperpodrun: filepath.Join(bin, "hyperpodrun"), worker: filepath.Join(bin, "worker"), auth: true, isolation: true, out: &out})
	defer func() {
		if t.Failed() {
			t.Log(out.String())
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	// With etcd auth on, team prod's attempt to resize research's job was
	// refused by etcd, and the job went on.
	if len(res.refused) != 1 || !fleet.IsPermissionDenied(res.refused[0]) {
		t.Errorf("team prod resizing research's job: %v; want etcd's permission denied", res.refused)
	}
	// Each node agent is its own etcd user: node-0's cannot register
	// another node.
	if !fleet.IsPermissionDenied(res.nodeRefused) {
		t.Errorf("node-0's agent registering node-9: %v; want etcd's permission denied", res.nodeRefused)
	}
	// As root, each job runs as its own uid (t.TempDir's 0700 binaries
	// included: the demo shares copies), seen in /proc.
	if os.Geteuid() == 0 {
		su, pu := res.uids["sweep"], res.uids["prod"]
		if su < 200000 || pu < 200000 || su == pu {
			t.Errorf("job uids: sweep %d, prod %d; want two different uids from 200000 up", su, pu)
		}
		if res.procs["sweep"] == 0 || res.procs["prod"] == 0 {
			t.Errorf("processes running as the jobs' uids while both trained: %v; want some for each", res.procs)
		}
	} else {
		t.Logf("not root: the jobs ran as uid %d (per-job uids need root)", os.Geteuid())
	}
	if len(res.sizes) < 3 || res.sizes[0] != 4 || res.sizes[len(res.sizes)-1] != 4 {
		t.Errorf("world sizes over time %v: want 4 first and last", res.sizes)
	}
	shrunk := false
	for _, w := range res.sizes {
		shrunk = shrunk || w == 2
	}
	if !shrunk {
		t.Errorf("world sizes %v never went down to 2 for prod's reclaim", res.sizes)
	}
	// Every resize went through the sync signal: no step lost, and none
	// repeated (a kill-and-restart from an older checkpoint repeats steps).
	if res.lost != 0 || res.repeated != 0 || res.steps < 50 {
		t.Errorf("%d steps, %d lost, %d repeated: want none lost or repeated", res.steps, res.lost, res.repeated)
	}
	kinds := ""
	for _, e := range res.history {
		kinds += fmt.Sprintf("%s(%d->%d for %v) ", e.Kind, e.FromSize, e.ToSize, e.For)
		if e.Kind == policy.KindShrunk && (len(e.For) != 1 || e.For[0] != "prod" || e.ForTeam != "prod") {
			t.Errorf("shrink not explained as for job prod of team prod: %+v", e)
		}
	}
	want := []policy.ReasonKind{policy.KindAdmitted, policy.KindShrunk, policy.KindGrown}
	i := 0
	for _, e := range res.history {
		if i < len(want) && e.Kind == want[i] {
			i++
		}
	}
	if i != len(want) {
		t.Errorf("history %s: want admitted, shrunk, grown in that order", kinds)
	}
}

// TestIdentities checks who the demo's jobs and agents run as, rule by
// rule (identities' doc).
func TestIdentities(t *testing.T) {
	for _, c := range []struct {
		rule            string
		isolation, auth bool
		euid            int
		perJobUIDs      bool
		nodeUsers       bool
		jobsSay         string
	}{
		{rule: "per-job-uid", isolation: true, auth: true, euid: 0, perJobUIDs: true, nodeUsers: true, jobsSay: "its own uid from 200000-299999"},
		{rule: "not-root", isolation: true, auth: true, euid: 1000, nodeUsers: true, jobsSay: "cannot change uid"},
		{rule: "shared-uid", isolation: false, auth: true, euid: 0, jobsSay: "--allow-root-jobs"},
		{rule: "node-users", isolation: true, auth: true, euid: 1000, nodeUsers: true, jobsSay: "run as you"},
		{rule: "shared-agent", isolation: false, auth: true, euid: 1000, jobsSay: "-isolation=false"},
		{rule: "no-auth", isolation: true, auth: false, euid: 0, perJobUIDs: true, jobsSay: "its own uid"},
	} {
		t.Run(c.rule, func(t *testing.T) {
			p := identities(c.isolation, c.auth, c.euid)
			if p.perJobUIDs != c.perJobUIDs || p.nodeUsers != c.nodeUsers {
				t.Errorf("per-job uids %v, node users %v; want %v, %v", p.perJobUIDs, p.nodeUsers, c.perJobUIDs, c.nodeUsers)
			}
			if p.perJobUIDs && (p.coordFirst != 200000 || p.coordLast != 299999 || p.agentRange.First != 200000 || p.agentRange.Last != 299999) {
				t.Errorf("ranges: coordinator %d-%d, agents %s; want 200000-299999 for both", p.coordFirst, p.coordLast, p.agentRange)
			}
			if !p.perJobUIDs && (p.coordFirst != 0 || p.agentRange.Set()) {
				t.Errorf("no per-job uids, yet ranges: coordinator %d-%d, agents %s", p.coordFirst, p.coordLast, p.agentRange)
			}
			if !strings.Contains(p.jobsLine, c.jobsSay) {
				t.Errorf("the demo's first line %q does not say %q", p.jobsLine, c.jobsSay)
			}
		})
	}
}

// TestShareReadOnly: the copies are readable by anyone in a 0755
// directory, executables stay executable, a missing file keeps its path.
func TestShareReadOnly(t *testing.T) {
	src := t.TempDir()
	bin, script := filepath.Join(src, "tool"), filepath.Join(src, "train.py")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, []byte("print(1)\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(src, "missing")
	dir := filepath.Join(t.TempDir(), "shared")
	got, err := shareReadOnly(dir, bin, script, missing)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]os.FileMode{filepath.Join(dir, "tool"): 0o755, filepath.Join(dir, "train.py"): 0o644, dir: 0o755}
	for p, m := range want {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != m {
			t.Errorf("%s: mode %v, want %v", p, st.Mode().Perm(), m)
		}
	}
	if got[0] != filepath.Join(dir, "tool") || got[1] != filepath.Join(dir, "train.py") || got[2] != missing {
		t.Errorf("paths %v", got)
	}
}

func TestStatusUID(t *testing.T) {
	uid, ok := statusUID("Name:\tpython3\nUid:\t200001\t200001\t200001\t200001\nGid:\t200001\n")
	if !ok || uid != 200001 {
		t.Errorf("got %d, %v; want 200001", uid, ok)
	}
	if _, ok := statusUID("Name:\tx\n"); ok {
		t.Error("a status without Uid read as one")
	}
}

// The checkpoint parent is 1777: sticky (no job removes another's
// directory) and writable by every job's uid.
func TestMakeStickyDir(t *testing.T) {
	d := filepath.Join(t.TempDir(), "ckpt")
	if err := makeStickyDir(d); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(d)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSticky == 0 || st.Mode().Perm() != 0o777 {
		t.Errorf("mode %v, want drwxrwxrwt", st.Mode())
	}
}

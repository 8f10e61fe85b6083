package jobrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

func TestParseUIDRange(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    UIDRange
		wantErr string
	}{
		{"", UIDRange{}, ""},
		{"200000-299999", UIDRange{200000, 299999}, ""},
		{"5-5", UIDRange{5, 5}, ""},
		{"0-10", UIDRange{}, "includes uid 0 (root)"},
		{"10-5", UIDRange{}, "below the first"},
		{"200000", UIDRange{}, "want FIRST-LAST"},
		{"a-b", UIDRange{}, "want FIRST-LAST"},
		{"1-4294967295", UIDRange{}, "(uid_t)-1"},
	} {
		got, err := ParseUIDRange(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseUIDRange(%q) = %v, %v; want %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseUIDRange(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestIdentityFor(t *testing.T) {
	rng := UIDRange{200000, 200099}
	nobody := JobUser{UID: 65534, GID: 65534, Home: "/nonexistent", Set: true}
	for _, tc := range []struct {
		rule      string
		p         IdentityPolicy
		uid       uint32
		container bool
		want      Identity
		refusal   string
	}{
		{"range", IdentityPolicy{AgentUID: 0, Range: rng, User: nobody}, 200007, false, Identity{UID: 200007, GID: 200007, Set: true}, ""},
		{"range (container)", IdentityPolicy{AgentUID: 0, Range: rng}, 200007, true, Identity{UID: 200007, GID: 200007, Set: true}, ""},
		{"range-no-uid", IdentityPolicy{AgentUID: 0, Range: rng}, 0, false, Identity{}, "has no uid of its own"},
		{"range: outside", IdentityPolicy{AgentUID: 0, Range: rng}, 5, false, Identity{}, "outside this node's --job-uid-range 200000-200099"},
		{"job-user", IdentityPolicy{AgentUID: 0, User: nobody}, 200007, false, Identity{UID: 65534, GID: 65534, Home: "/nonexistent", Set: true}, ""},
		{"container", IdentityPolicy{AgentUID: 0}, 0, true, Identity{}, ""},
		{"root-refused", IdentityPolicy{AgentUID: 0}, 0, false, Identity{}, "--job-user"},
		{"as-agent (allowed root)", IdentityPolicy{AgentUID: 0, AllowRoot: true}, 0, false, Identity{}, ""},
		{"as-agent (not root)", IdentityPolicy{AgentUID: 1000}, 0, false, Identity{}, ""},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			got, why := identityFor(tc.p, "j", tc.uid, tc.container)
			if tc.refusal != "" {
				if !strings.Contains(why, tc.refusal) {
					t.Errorf("refusal %q, want %q", why, tc.refusal)
				}
				return
			}
			if why != "" || got != tc.want {
				t.Errorf("got %+v, %q; want %+v", got, why, tc.want)
			}
		})
	}
}

func TestClaimVerdict(t *testing.T) {
	for _, tc := range []struct {
		rule                 string
		heldBy, by           string
		heldRuns             bool
		wantRetake, refusing bool
	}{
		{"same-job", "a", "node-b", true, false, false},
		{"stale-own", "old", "node-a", false, true, false},
		{"other: running here", "old", "node-a", true, false, true},
		{"other: another agent's", "old", "node-b", false, false, true},
	} {
		retake, why := claimVerdict("a", "node-a", tc.heldBy, tc.by, tc.heldRuns)
		if retake != tc.wantRetake || (why != "") != tc.refusing {
			t.Errorf("%s: retake %v refusal %q; want retake %v refusing %v", tc.rule, retake, why, tc.wantRetake, tc.refusing)
		}
	}
}

// Two agents of one host share the claims: a uid is one job's at a time.
func TestUIDClaimsOnOneHost(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "uids")
	a, b := uidClaims{dir: dir, node: "node-a"}, uidClaims{dir: dir, node: "node-b"}
	none := func(string) bool { return false }
	if err := a.claim(200001, "j1", none); err != nil {
		t.Fatal(err)
	}
	if err := b.claim(200001, "j2", none); err == nil || !strings.Contains(err.Error(), "held on this host by job j1") {
		t.Errorf("a second job took uid 200001: %v", err)
	}
	if err := b.claim(200001, "j1", none); err != nil {
		t.Errorf("the same job on another agent of the host: %v", err)
	}
	if err := b.release(200001, "j1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "200001")); err != nil {
		t.Errorf("node-b's release dropped node-a's claim: %v", err)
	}
	// node-a's agent restarted: its claim of a job no longer running is
	// stale, retaken by node-a only.
	if err := a.claim(200001, "j3", none); err != nil {
		t.Errorf("node-a could not retake its own stale claim: %v", err)
	}
	if err := a.release(200001, "j3"); err != nil {
		t.Fatal(err)
	}
	if err := b.claim(200001, "j2", none); err != nil {
		t.Errorf("a released uid: %v", err)
	}
}

// procUID is the real uid of a process (/proc/<pid>/status).
func procUID(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
			return f[1]
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pid)
	return ""
}

// asUID runs a shell command as uid:uid (no groups) and returns its output
// and whether it succeeded.
func asUID(uid uint32, script string) (string, bool) {
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// A fake hyperpodrun: makes a helper directory and a log under its
// --log-dir (as hyperpodrun does for PYTHONPATH), starts a worker, and
// reports its pid, its worker's, its TMPDIR, log dir, password file and
// HOME to $OUT/<job>.
const reportingHyperpodrun = `#!/bin/sh
job= conf= logdir=
while [ $# -gt 0 ]; do
  case "$1" in
    --rdzv-id) job=$2; shift;;
    --rdzv-conf) conf=$2; shift;;
    --log-dir) logdir=$2; shift;;
  esac
  shift
done
mkdir -p "$logdir/$job/py" && echo "the log of $job" > "$logdir/$job/out.log" || exit 3
sh -c 'while :; do sleep 0.05; done' &
pw=$(echo "$conf" | tr ',' '\n' | sed -n 's/^password_file=//p')
echo "$$ $! $TMPDIR $logdir $pw $HOME" > "$OUT/$job.tmp" && mv "$OUT/$job.tmp" "$OUT/$job"
wait
`

// Two teams' jobs on one node with --job-uid-range run as two uids, and
// neither can reach the other: not its password file, not its
// environment, not its logs, not its helper directory or TMPDIR, not its
// processes (signals). A job leaving the node releases its uid and its log
// directory goes back to root. A job without a uid in the range is refused
// with a problem record that says why.
func TestTwoJobsOnOneNodeCannotReachEachOther(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent runs as root and the jobs as their own uids")
	}
	out := sharedDir(t)
	hpr := filepath.Join(out, "hyperpodrun")
	os.WriteFile(hpr, []byte(reportingHyperpodrun), 0o755)
	logBase, err := os.MkdirTemp("", "joblogs-") // the jobs reach it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(logBase) })
	tmp, err := os.MkdirTemp("", "hpa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	jobs := map[string]uint32{"train-a": 200001, "train-b": 200002, "no-uid": 0, "outside": 7}
	for job := range jobs {
		team := "team-" + job
		if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: job, Team: team, PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
			Run: fleet.RunSpec{Script: "/bin/true", NoPython: true, MaxRestarts: 3, Env: map[string]string{"OUT": out}}}); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(fleet.JobCreds{Job: job, User: "job-" + job, Password: "secret-of-" + job})
		if _, err := cli.Put(ctx, st.Keys.Creds(job), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	logs := &syncBuf{}
	r := New(Config{Hyperpodrun: hpr, Endpoints: srv.Endpoints, Output: &syncBuf{}, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		UIDRange: UIDRange{200000, 200099}, JobUser: JobUser{UID: 65534, GID: 65534, Set: true}, LogDir: logBase, TempDir: tmp,
		CgroupParent: NoCgroup, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(rctx, nodeagent.Node{Name: "node-a", Prefix: "/hyperpodrun", Client: cli}); close(done) }()
	defer func() { stop(); <-done }()
	// The coordinator's assignments to node-a: each job's uid, and its
	// credentials for this node.
	assign := func(job string) {
		t.Helper()
		v, _ := json.Marshal(fleet.Assignment{Job: job, Generation: 1, UID: jobs[job],
			Creds: &fleet.JobCreds{Job: job, User: "job-" + job, Password: "secret-of-" + job}})
		if _, err := cli.Put(ctx, st.Keys.Assignment("node-a", job), string(v)); err != nil {
			t.Fatal(err)
		}
	}
	for _, job := range []string{"train-a", "train-b", "no-uid", "outside"} {
		assign(job)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s\n%s", what, logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	type run struct {
		hpr, worker           int
		tmp, logDir, pw, home string
	}
	report := func(job string) (run, bool) {
		b, err := os.ReadFile(filepath.Join(out, job))
		f := strings.Fields(string(b))
		if err != nil || len(f) != 6 {
			return run{}, false
		}
		var x run
		x.hpr, _ = strconv.Atoi(f[0])
		x.worker, _ = strconv.Atoi(f[1])
		x.tmp, x.logDir, x.pw, x.home = f[2], f[3], f[4], f[5]
		return x, true
	}
	var a, b run
	waitFor("both jobs' runs", func() bool {
		var okA, okB bool
		a, okA = report("train-a")
		b, okB = report("train-b")
		return okA && okB
	})
	uidA, uidB := jobs["train-a"], jobs["train-b"]
	for _, c := range []struct {
		what string
		pid  int
		want uint32
	}{{"train-a's hyperpodrun", a.hpr, uidA}, {"train-a's worker", a.worker, uidA}, {"train-b's hyperpodrun", b.hpr, uidB}, {"train-b's worker", b.worker, uidB}} {
		if got := procUID(t, c.pid); got != strconv.Itoa(int(c.want)) {
			t.Errorf("%s (pid %d) runs as uid %s, want %d", c.what, c.pid, got, c.want)
		}
	}
	if a.logDir != filepath.Join(logBase, "node-a", "train-a") || a.home != a.tmp || a.pw != filepath.Join(a.tmp, "etcd.password") {
		t.Errorf("train-a: --log-dir %s, HOME %s, TMPDIR %s, password file %s", a.logDir, a.home, a.tmp, a.pw)
	}
	if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", a.hpr)); strings.Contains(string(cmdline), "secret-of-") {
		t.Errorf("a password is on train-a's command line: %q", cmdline)
	}
	// What train-b's uid tries against train-a, and (the control) what
	// train-a's own uid can do.
	for _, c := range []struct{ what, script string }{
		{"read train-a's password file", "cat " + a.pw},
		{"read train-a's hyperpodrun's environ", fmt.Sprintf("cat /proc/%d/environ", a.hpr)},
		{"read train-a's worker's environ", fmt.Sprintf("cat /proc/%d/environ", a.worker)},
		{"read train-a's log", "cat " + filepath.Join(a.logDir, "train-a", "out.log")},
		{"list train-a's log directory", "ls " + a.logDir},
		{"write train-a's helper (PYTHONPATH) directory", "touch " + filepath.Join(a.logDir, "train-a", "py", "evil.py")},
		{"write train-a's TMPDIR", "touch " + filepath.Join(a.tmp, "evil")},
		{"signal train-a's hyperpodrun", fmt.Sprintf("kill -0 %d", a.hpr)},
		{"signal train-a's worker", fmt.Sprintf("kill -0 %d", a.worker)},
	} {
		if o, ok := asUID(uidB, c.script); ok {
			t.Errorf("train-b's uid could %s (%s): %s", c.what, c.script, o)
		} else if strings.HasPrefix(c.what, "signal") && !strings.Contains(o, "not permitted") {
			t.Errorf("%s: %q, want the kernel's EPERM", c.what, o)
		}
		if o, ok := asUID(uidA, c.script); !ok {
			t.Errorf("train-a's own uid cannot %s (%s): %s", c.what, c.script, o)
		}
	}
	if pw, ok := asUID(uidA, "cat "+a.pw); !ok || strings.TrimSpace(pw) != "secret-of-train-a" {
		t.Errorf("train-a's password file holds %q", pw)
	}
	claim := filepath.Join(tmp, "uids", strconv.Itoa(int(uidA)))
	if c, err := os.ReadFile(claim); err != nil || string(c) != "train-a\nnode-a\n" {
		t.Errorf("train-a's uid claim: %q, %v", c, err)
	}
	// The jobs without a uid of the range are refused, saying why.
	for job, want := range map[string]string{"no-uid": "has no uid of its own", "outside": "outside this node's --job-uid-range 200000-200099"} {
		waitFor(job+"'s problem record", func() bool {
			p, ok := problemOf(t, ctx, st, job, "node-a")
			return ok && strings.Contains(p.Message, want)
		})
		if _, ran := report(job); ran {
			t.Errorf("%s ran", job)
		}
	}
	// train-a leaves the node: its uid is released and its log directory
	// is root's again.
	if _, err := cli.Delete(ctx, st.Keys.Assignment("node-a", "train-a")); err != nil {
		t.Fatal(err)
	}
	waitFor("train-a's uid to be released", func() bool { _, err := os.Stat(claim); return os.IsNotExist(err) })
	waitFor("train-a's log directory to be root's", func() bool { return ownerOf(t, a.logDir) == 0 })
	if o, ok := asUID(uidA, "ls "+a.logDir); ok {
		t.Errorf("train-a's uid still reads its log directory after leaving: %s", o)
	}
}

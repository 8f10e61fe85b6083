package jobrunner

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

func TestJobEnv(t *testing.T) {
	t.Setenv("HYPERPOD_ETCD_PASSWORD", "agent-secret")
	t.Setenv("ETCDCTL_KEY", "/etc/agent/key.pem")
	spec := func(env map[string]string) fleet.JobSpec {
		return fleet.JobSpec{Job: policy.Job{Name: "j"}, Run: fleet.RunSpec{Script: "t.py", Env: env}}
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		allow   []string
		want    []string // entries that must be there
		wantErr string
	}{
		{name: "base only", want: []string{"PATH=" + DefaultPath, "LANG=C.UTF-8", "HOME=/home/job"}},
		{name: "the spec's own", env: map[string]string{"NCCL_DEBUG": "INFO", "LANG": "de_DE.UTF-8"}, want: []string{"NCCL_DEBUG=INFO", "LANG=de_DE.UTF-8"}},
		{name: "LD_PRELOAD", env: map[string]string{"LD_PRELOAD": "/tmp/evil.so"}, wantErr: "run.env LD_PRELOAD is refused: the dynamic loader's settings run code of the job's choosing inside every process; remove it from the job, or start hyperpod-agent with --allow-job-env LD_PRELOAD"},
		{name: "LD_LIBRARY_PATH", env: map[string]string{"LD_LIBRARY_PATH": "/x"}, wantErr: "run.env LD_LIBRARY_PATH is refused"},
		{name: "PATH", env: map[string]string{"PATH": "/tmp"}, wantErr: "run.env PATH is refused: the agent sets PATH"},
		{name: "HYPERPODRUN_", env: map[string]string{"HYPERPODRUN_CONTROL_SOCKET": "/tmp/s"}, wantErr: "run.env HYPERPODRUN_CONTROL_SOCKET is refused"},
		{name: "allowed by the agent", env: map[string]string{"LD_LIBRARY_PATH": "/opt/cuda/lib64"}, allow: []string{"LD_LIBRARY_PATH"}, want: []string{"LD_LIBRARY_PATH=/opt/cuda/lib64"}},
		{name: "bad name", env: map[string]string{"A=B": "x"}, wantErr: "is not a valid environment variable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, err := jobEnv(spec(tc.env), EnvOptions{Allow: tc.allow, Home: "/home/job"}, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			all := strings.Join(env, "\n")
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("env lacks %q:\n%s", w, all)
				}
			}
			if strings.Contains(all, "agent-secret") || strings.Contains(all, "/etc/agent/key.pem") {
				t.Errorf("the agent's environment leaked into the job's:\n%s", all)
			}
		})
	}
}

func TestRefuseRootAndParseJobUser(t *testing.T) {
	nobody := JobUser{UID: 65534, GID: 65534, Set: true}
	for _, tc := range []struct {
		agentUID int
		u        JobUser
		allow    bool
		refused  bool
	}{
		{0, JobUser{}, false, true},
		{0, JobUser{}, true, false},
		{0, nobody, false, false},
		{1000, JobUser{}, false, false},
	} {
		if got := refuseRoot(tc.agentUID, tc.u, tc.allow) != ""; got != tc.refused {
			t.Errorf("refuseRoot(%d, %+v, %v) refused=%v, want %v", tc.agentUID, tc.u, tc.allow, got, tc.refused)
		}
	}
	if u, err := ParseJobUser("nobody"); err != nil || u.UID != 65534 || !u.Set {
		t.Errorf("ParseJobUser(nobody) = %+v, %v", u, err)
	}
	if u, err := ParseJobUser("1234:99"); err != nil || u.UID != 1234 || u.GID != 99 {
		t.Errorf("ParseJobUser(1234:99) = %+v, %v", u, err)
	}
	for s, want := range map[string]string{"root": "is root", "0": "is root", "no-such-user-x": "give a user of this host", "5:x": "numeric gid"} {
		if _, err := ParseJobUser(s); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseJobUser(%q) = %v, want %q", s, err, want)
		}
	}
}

// The agent runs as root with its etcd credentials in its environment; the
// job it starts runs as nobody and sees none of them. A job asking for
// LD_PRELOAD is refused with the reason on its finish record, and runs
// nothing.
func TestJobRunsAsItsUserWithItsOwnEnvironmentOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a job as another user")
	}
	u, err := ParseJobUser("nobody")
	if err != nil {
		t.Skipf("no user nobody here: %v", err)
	}
	t.Setenv("HYPERPOD_ETCD_PASSWORD", "agent-secret")
	t.Setenv("ETCDCTL_KEY", "/etc/agent/key.pem")
	dir, err := os.MkdirTemp("", "jobenv-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o777)
	worker := filepath.Join(dir, "w.sh")
	os.WriteFile(worker, []byte(`#!/bin/sh
env > "$OUT/env.tmp"; id -u >> "$OUT/env.tmp"; mv "$OUT/env.tmp" "$OUT/env"
`), 0o755)
	hpr := hyperpodrun(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	for _, j := range []fleet.JobSpec{
		{Job: policy.Job{Name: "j", Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
			Run: fleet.RunSpec{Script: worker, NoPython: true, Env: map[string]string{"OUT": dir}}},
		{Job: policy.Job{Name: "evil", Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
			Run: fleet.RunSpec{Script: worker, NoPython: true, Env: map[string]string{"OUT": dir, "LD_PRELOAD": filepath.Join(dir, "evil.so")}}},
	} {
		if err := st.SubmitJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	var out syncBuf
	r := New(Config{Hyperpodrun: hpr, Endpoints: srv.Endpoints, Output: &out, JobUser: u})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(rctx, nodeagent.Node{Name: "node-a", Prefix: "/hyperpodrun", Client: cli}); close(done) }()
	defer func() { stop(); <-done }()
	for i, job := range []string{"j", "evil"} {
		if err := st.Place(ctx, fleet.Desired{Allocation: policy.Allocation{Job: job, Size: 1, Nodes: []string{"node-a"}}, Generation: int64(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	var envOut []byte
	for {
		if envOut, err = os.ReadFile(filepath.Join(dir, "env")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job never ran:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	lines := strings.Split(strings.TrimSpace(string(envOut)), "\n")
	if uid := lines[len(lines)-1]; uid != "65534" {
		t.Errorf("the job ran as uid %s, want nobody (65534)", uid)
	}
	if s := string(envOut); strings.Contains(s, "agent-secret") || strings.Contains(s, "ETCDCTL_KEY") || strings.Contains(s, "HYPERPOD_ETCD_PASSWORD") {
		t.Errorf("the job sees the agent's credentials in its environment:\n%s", s)
	}
	for {
		if e, ok := finishOf(t, ctx, st, "evil"); ok {
			if e.Outcome != fleet.Failed || !strings.Contains(e.Message, "run.env LD_PRELOAD is refused") || !strings.Contains(e.Message, "--allow-job-env LD_PRELOAD") {
				t.Errorf("the LD_PRELOAD job's finish record: %+v", e)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the LD_PRELOAD job was never refused:\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if strings.Contains(out.String(), "node-a/evil ") {
		t.Errorf("the refused job ran:\n%s", out.String())
	}
}

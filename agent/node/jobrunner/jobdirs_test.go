package jobrunner

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// ownerOf is a path's uid (not following a final symlink).
func ownerOf(t *testing.T, p string) uint32 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid
}

// sharedDir is a temporary directory anyone may write (the tests' own
// channel from the jobs' processes, which run as other uids).
func sharedDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "jobdirs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	os.Chmod(d, 0o777)
	return d
}

// The attack of issue 22: a job fills its log directory with thousands of
// entries and, while the root agent starts and restarts it, keeps swapping
// a subdirectory for a symlink to a root-owned directory. The agent used to
// walk the tree and Lchown every path to the job user, so the walk went
// through the symlink and gave root's files to the job. Now it changes the
// owner of the job's top directory only, through its descriptor: the
// root-owned files keep their owner, however many restarts.
func TestSymlinkSwapRaceNeverChownsRootFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent runs as root and the job as nobody")
	}
	const jobUID = 65534
	out := sharedDir(t)
	hpr := filepath.Join(out, "hyperpodrun")
	// A fake hyperpodrun: counts its starts and runs until killed.
	os.WriteFile(hpr, []byte("#!/bin/sh\necho $$ >> \"$OUT/runs\"\nwhile :; do sleep 0.05; done\n"), 0o755)
	logBase := t.TempDir()
	tmp, err := os.MkdirTemp("", "hpa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	// Root's directory, with root's files, that the job aims at.
	target := t.TempDir()
	const n = 2000
	for i := range n {
		if err := os.WriteFile(filepath.Join(target, fmt.Sprintf("f%04d", i)), []byte("root's"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The job's log directory as an earlier run of the job left it: a
	// large tree of the job's own, and a subdirectory named like root's
	// files.
	jobDir := filepath.Join(logBase, "node-a", "j")
	for _, d := range []string{filepath.Join(jobDir, "big"), filepath.Join(jobDir, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3000 {
		os.WriteFile(filepath.Join(jobDir, "big", fmt.Sprintf("b%04d", i)), nil, 0o644)
	}
	for i := range n {
		os.WriteFile(filepath.Join(jobDir, "sub", fmt.Sprintf("f%04d", i)), nil, 0o644)
	}
	filepath.WalkDir(jobDir, func(p string, _ os.DirEntry, err error) error {
		if err == nil {
			os.Lchown(p, jobUID, jobUID)
		}
		return nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
		Run: fleet.RunSpec{Script: "/bin/true", NoPython: true, MaxRestarts: 100, Env: map[string]string{"OUT": out}}}); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuf{}
	r := New(Config{Hyperpodrun: hpr, Endpoints: srv.Endpoints, Output: &syncBuf{}, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		JobUser: JobUser{UID: jobUID, GID: jobUID, Set: true}, LogDir: logBase, TempDir: tmp, CgroupParent: NoCgroup,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.Run(rctx, nodeagent.Node{Name: "node-a", Prefix: "/hyperpodrun", Client: cli}); close(done) }()
	defer func() { stop(); <-done }()

	// The job's swapper: sub <-> a symlink to root's directory, as fast
	// as it can, for as long as the agent starts the job.
	var swaps atomic.Int64
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sub, real := filepath.Join(jobDir, "sub"), filepath.Join(jobDir, "sub.real")
		for {
			select {
			case <-quit:
				os.Remove(sub)
				os.Rename(real, sub)
				return
			default:
			}
			if os.Rename(sub, real) == nil {
				os.Symlink(target, sub)
				os.Remove(sub)
				os.Rename(real, sub)
				swaps.Add(1)
			}
		}
	}()
	defer func() { close(quit); wg.Wait() }()

	runs := func() int {
		b, _ := os.ReadFile(filepath.Join(out, "runs"))
		return strings.Count(string(b), "\n")
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s\n%s", what, logs.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	pid := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		if p := r.jobs["j"]; p != nil && p.cmd != nil {
			return p.cmd.Process.Pid
		}
		return 0
	}
	if err := st.Place(ctx, fleet.Desired{Allocation: policy.Allocation{Job: "j", Size: 1, Nodes: []string{"node-a"}}, Generation: 1}); err != nil {
		t.Fatal(err)
	}
	const starts = 8
	for i := 1; i <= starts; i++ {
		waitFor(fmt.Sprintf("start %d of the job", i), func() bool { return runs() >= i && pid() != 0 })
		if i < starts {
			syscall.Kill(pid(), syscall.SIGKILL)
			waitFor("the killed run to end", func() bool { p := pid(); return p == 0 || runs() > i })
		}
	}
	if swaps.Load() == 0 {
		t.Fatal("the swapper never swapped")
	}
	var stolen []string
	if ownerOf(t, target) != 0 {
		stolen = append(stolen, target)
	}
	for i := range n {
		if p := filepath.Join(target, fmt.Sprintf("f%04d", i)); ownerOf(t, p) != 0 {
			stolen = append(stolen, p)
		}
	}
	if len(stolen) > 0 {
		t.Errorf("%d root-owned path(s) were given to the job through its symlink after %d starts and %d swaps, e.g. %s", len(stolen), starts, swaps.Load(), stolen[0])
	}
	// The job's own directory is the job's, and no one else's to read.
	var st2 syscall.Stat_t
	if err := syscall.Lstat(jobDir, &st2); err != nil || st2.Uid != jobUID || st2.Mode&0o777 != 0o700 {
		t.Errorf("the job's log directory %s: uid %d mode %o (%v), want %d and 0700", jobDir, st2.Uid, st2.Mode&0o777, err, jobUID)
	}
}

// The base of the runs' directories (--job-run-dir) holds every job's
// password file and TMPDIR: one that someone else owns, or that anyone may
// write, was accepted, and that someone could read or replace what the
// agent put there. The runner now refuses to start, saying what is wrong
// and how to fix it.
func TestRunDirBaseNotRootsIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a directory someone else owns")
	}
	_, cli := etcdtest.Start(t)
	for _, tc := range []struct {
		name  string
		setup func(d string) string
		want  []string
	}{
		{"owned by another uid", func(d string) string { os.Chown(d, 65534, 65534); return d },
			[]string{"is owned by uid 65534", "chown root:root"}},
		{"writable by anyone", func(d string) string { os.Chmod(d, 0o777); return d },
			[]string{"writable by group or others", "chmod 0711"}},
		{"a symlink", func(d string) string {
			l := d + ".link"
			os.Symlink(d, l)
			t.Cleanup(func() { os.Remove(l) })
			return l
		}, []string{"not a real directory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := os.MkdirTemp("", "hpa")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(d) })
			base := tc.setup(d)
			r := New(Config{TempDir: base, AllowRootJobs: true, Output: &syncBuf{}, CgroupParent: NoCgroup})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = r.Run(ctx, nodeagent.Node{Name: "node-a", Prefix: "/hyperpodrun", Client: cli})
			if err == nil {
				t.Fatalf("the runner accepted %s as its runs' directory", base)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// Under --runtime containerd --job-user, the job's log directory was made
// root:root 0755: hyperpodrun in the container (the job's uid) could not
// make its own log directory there, and the job crash-looped. Now the
// directory is the job's (0700) and the job trains; the container's
// console log is root's, beside it in the node's directory.
func TestContainerJobUserOwnsItsLogDirAndTrains(t *testing.T) {
	if testing.Short() {
		t.Skip("containerd, registry, coordinator and an agent")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to run containerd")
	}
	f := newContainerFleet(t)
	f.jobUser, f.allowRoot = JobUser{UID: 4242, GID: 4242, Set: true}, false
	f.startAgent("node-1")
	f.submit("logs", 1, 1, fleet.RunSpec{Image: f.image, Script: "/bin/worker", NoPython: true, MaxRestarts: 1,
		Args: []string{"--steps", "200", "--step-time", "20ms"}})
	f.waitFor("training", 90*time.Second, func() bool { s, _ := f.steps(); return len(s) >= 3 })
	dir := filepath.Join(f.logDir, "node-1", "logs")
	var st syscall.Stat_t
	if err := syscall.Lstat(dir, &st); err != nil || st.Uid != 4242 || st.Mode&0o777 != 0o700 {
		t.Errorf("the job's log directory %s: uid %d mode %o (%v), want 4242 and 0700", dir, st.Uid, st.Mode&0o777, err)
	}
	// torchrun's layout: <log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/
	runs, _ := filepath.Glob(filepath.Join(dir, "logs_*"))
	if len(runs) != 1 {
		t.Errorf("hyperpodrun's run log directories in the container: %q, want one logs_<random>", runs)
	} else if err := syscall.Lstat(runs[0], &st); err != nil || st.Uid != 4242 {
		t.Errorf("hyperpodrun's run log directory in the container: uid %d (%v), want 4242", st.Uid, err)
	}
	if err := syscall.Lstat(filepath.Join(f.logDir, "node-1", "logs.log"), &st); err != nil || st.Uid != 0 || st.Mode&0o777 != 0o600 {
		t.Errorf("the console log: uid %d mode %o (%v), want root's 0600", st.Uid, st.Mode&0o777, err)
	}
}

func TestUnsearchable(t *testing.T) {
	d := t.TempDir()
	closed := filepath.Join(d, "closed")
	inner := filepath.Join(closed, "inner")
	if err := os.MkdirAll(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(d, 0o755)
	os.Chmod(filepath.Dir(d), 0o755)
	os.Chmod(closed, 0o750)
	if got := unsearchable(inner); got != closed {
		t.Errorf("unsearchable(%s) = %q, want %s", inner, got, closed)
	}
	os.Chmod(closed, 0o711)
	if got := unsearchable(inner); got != "" {
		t.Errorf("unsearchable(%s) = %q, want none", inner, got)
	}
}

// JobLogDir never follows a symlink and never trusts a directory someone
// else owns: each refusal names the path and the fix; a good layout gives
// the job its own directory, 0700, and its parents are root's 0711.
func TestJobLogDirRefusesWhatItCannotTrust(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give directories to other users")
	}
	elsewhere := t.TempDir()
	id := Identity{UID: 200005, GID: 200005, Set: true}
	for _, tc := range []struct {
		rule  string
		setup func(base string)
		want  string
	}{
		{"node dir is a symlink", func(base string) { os.Symlink(elsewhere, filepath.Join(base, "node-a")) }, "is not a real directory"},
		{"node dir is the job user's", func(base string) {
			os.Mkdir(filepath.Join(base, "node-a"), 0o755)
			os.Chown(filepath.Join(base, "node-a"), 65534, 65534)
		}, "is owned by uid 65534"},
		{"job dir is a symlink", func(base string) {
			os.Mkdir(filepath.Join(base, "node-a"), 0o711)
			os.Symlink(elsewhere, filepath.Join(base, "node-a", "j"))
		}, "the agent does not follow it"},
		{"base writable by others", func(base string) { os.Chmod(base, 0o777) }, "writable by group or others"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			base := t.TempDir()
			tc.setup(base)
			_, err := JobLogDir(base, "node-a", "j", id)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
			if ownerOf(t, elsewhere) != 0 {
				t.Errorf("the symlink's target was given away")
			}
		})
	}
	base := t.TempDir()
	dir, err := JobLogDir(base, "node-a", "j", id)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		uid  uint32
		mode uint32
	}{{base, 0, 0o711}, {filepath.Join(base, "node-a"), 0, 0o711}, {dir, id.UID, 0o700}} {
		var st syscall.Stat_t
		if err := syscall.Lstat(c.path, &st); err != nil || st.Uid != c.uid || st.Mode&0o7777 != c.mode {
			t.Errorf("%s: uid %d mode %o (%v), want %d %o", c.path, st.Uid, st.Mode&0o7777, err, c.uid, c.mode)
		}
	}
	if err := ReleaseJobLogDir(base, "node-a", "j"); err != nil || ownerOf(t, dir) != 0 {
		t.Errorf("released: owner %d, %v; want root's", ownerOf(t, dir), err)
	}
}

package containers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/hyperpodrun/hyperpodrun/internal/ctrdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/ociimage"
)

func TestDangerousMountSourceRules(t *testing.T) {
	for _, c := range []struct {
		rule, path string
		want       string // "" = allowed; else a word of the reason
	}{
		{"the host's root", "/", "root file system"},
		{"the host's root, spelled with slashes", "//", "root file system"},
		{"a relative path", "data/ckpt", "relative"},
		{"an empty path", "", "empty"},
		{"dot-dot anywhere", "/data/../etc", `".."`},
		{"procfs", "/proc", "process interface"},
		{"a process's root through procfs", "/proc/1/root", "process interface"},
		{"sysfs", "/sys/fs/cgroup", "sysfs"},
		{"device nodes", "/dev/sda", "device nodes"},
		{"the runtime sockets", "/run", "runtime sockets"},
		{"containerd's socket", "/run/containerd/containerd.sock", "runtime sockets"},
		{"docker's socket through /var/run", "/var/run/docker.sock", "runtime sockets"},
		{"containerd's state", "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs", "containerd's state"},
		{"the kubelet's state", "/var/lib/kubelet/pods", "kubelet"},
		{"the host's configuration", "/etc", "configuration"},
		{"the host's password hashes", "/etc/shadow", "configuration"},
		{"the boot partition", "/boot", "kernel"},
		{"root's home", "/root/.ssh", "root's home"},
		{"a directory holding /var/run", "/var", "holding /var/run"},
		{"a directory holding containerd's state", "/var/lib", "holding /var/lib/containerd"},
		{"a clean-able path into /etc", "/etc/./ssl/", "configuration"},
		{"a data directory", "/data", ""},
		{"a shared file system's checkpoints", "/fsx/checkpoints/llama", ""},
		{"a user's home", "/home/alice/data", ""},
		{"the host's /usr", "/usr", ""},
		{"a temporary directory", "/tmp/job-7", ""},
		{"the logs under /var/log", "/var/log/jobs", ""},
		{"a name that starts like /etc is not under it", "/etcd-data", ""},
		{"a name that starts like /proc is not under it", "/proceeds", ""},
		{"a name that starts like /run is not under it", "/runs/7", ""},
	} {
		got := DangerousMountSource(c.path)
		if (got == "") != (c.want == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: DangerousMountSource(%q) = %q, want %q", c.rule, c.path, got, c.want)
		}
	}
}

func TestCheckMountRules(t *testing.T) {
	// The node's file system as EvalSymlinks would see it.
	links := map[string]string{
		"/data/escape":     "/home/other/secrets",
		"/data/to-etc":     "/etc",
		"/data/latest":     "/data/ckpt/7",
		"/fsx":             "/mnt/fsx",
		"/fsx/team-a":      "/mnt/fsx/team-a",
		"/fsx/team-a/ckpt": "/mnt/fsx/team-a/ckpt",
		"/data/agent-link": "/data/agent-runs/123",
	}
	resolve := func(p string) (string, error) {
		if p == "/data/missing" {
			return "", os.ErrNotExist
		}
		if r, ok := links[p]; ok {
			return r, nil
		}
		return p, nil
	}
	data := []string{"/data"}
	protected := []string{"/data/agent-runs"}
	for _, c := range []struct {
		rule, source string
		allow        []string
		want         string // the path to mount, or "refused: <word of the reason>"
	}{
		{"an empty allow-list refuses every mount", "/data/ckpt", nil, "refused: allows no host mounts"},
		{"the allowed directory itself", "/data", data, "/data"},
		{"a path under an allowed directory", "/data/ckpt/run1", data, "/data/ckpt/run1"},
		{"slashes are cleaned", "/data//ckpt/", data, "/data/ckpt"},
		{"any of several allowed directories", "/scratch/x", []string{"/data", "/scratch"}, "/scratch/x"},
		{"a sibling with the same prefix is not under it", "/data2/x", data, "refused: not within an allowed directory"},
		{"a parent of the allowed directory", "/", data, "refused: root file system"},
		{"outside every allowed directory", "/home/alice", data, "refused: not within an allowed directory"},
		{"a relative source", "data/ckpt", data, "refused: relative"},
		{"dot-dot out of the allowed directory", "/data/../etc/shadow", data, `refused: ".."`},
		{"containerd's socket", "/run/containerd/containerd.sock", data, "refused: never mounted"},
		{"a dangerous path even when allowed", "/etc/ssl", []string{"/etc"}, "refused: never mounted"},
		{"a symlink leading out of the allowed directory", "/data/escape", data, "refused: through a symbolic link"},
		{"a symlink leading to /etc", "/data/to-etc", data, "refused: through a symbolic link"},
		{"a symlink staying inside", "/data/latest", data, "/data/ckpt/7"},
		{"an allowed directory that is a symlink itself", "/fsx/team-a/ckpt", []string{"/fsx"}, "/mnt/fsx/team-a/ckpt"},
		{"the agent's own directory", "/data/agent-runs/123", data, "refused: the node agent's own directory"},
		{"an allowed / still refuses what is never mounted", "/etc/shadow", []string{"/"}, "refused: never mounted"},
		{"a directory holding the agent's own", "/data", []string{"/"}, "refused: the node agent's own directory"},
		{"the allowed directory holding the agent's own", "/data", data, "refused: the node agent's own directory"},
		{"a symlink to the agent's own directory", "/data/agent-link", data, "refused: the node agent's own directory"},
		{"a source that does not exist", "/data/missing", data, "refused: cannot be resolved"},
	} {
		prot := protected
		if c.rule == "the allowed directory itself" {
			prot = nil
		}
		got, err := CheckMount(c.source, "/mnt", c.allow, prot, resolve)
		if err != nil {
			if !errors.Is(err, ErrRefused) {
				t.Errorf("%s: error does not wrap ErrRefused: %v", c.rule, err)
			}
			got = "refused: " + err.Error()
			if !strings.Contains(err.Error(), "--allow-mount-source") || !strings.Contains(err.Error(), fmt.Sprintf("%q", c.source)) {
				t.Errorf("%s: the reason names neither the mount nor the fix: %v", c.rule, err)
			}
		}
		want := c.want
		if strings.HasPrefix(want, "refused: ") {
			if !strings.HasPrefix(got, "refused: ") || !strings.Contains(got, strings.TrimPrefix(want, "refused: ")) {
				t.Errorf("%s: CheckMount(%q, allow %v) = %q, want %s", c.rule, c.source, c.allow, got, want)
			}
			continue
		}
		if got != want {
			t.Errorf("%s: CheckMount(%q, allow %v) = %q, want %q", c.rule, c.source, c.allow, got, want)
		}
	}
}

// connect is another runtime on the fixture's containerd with cfg.
func (f *fixture) connect(t *testing.T, cfg Config) *Runtime {
	t.Helper()
	cfg.Address = f.ctrd.Address
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rt, err := Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// left lists the containers and the snapshots left in the namespace.
func left(t *testing.T, rt *Runtime) (ids, snaps []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(containerdCtx(context.Background(), rt.cfg.Namespace), 30*time.Second)
	defer cancel()
	ids, err := rt.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.client.SnapshotService(rt.snapshotter()).Walk(ctx, func(_ context.Context, i snapshots.Info) error {
		if i.Kind == snapshots.KindActive {
			snaps = append(snaps, i.Name)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ids, snaps
}

// A job's container, seen from inside: no capability in any set,
// containerd's default seccomp filter, no_new_privileges, the job's uid
// and gid (and no other group), and RLIMIT_NOFILE as the node sets it.
func TestConfinedContainerHasNoCapabilitiesSeccompNoNewPrivsTheJobsUIDAndNoFile(t *testing.T) {
	f := newFixture(t)
	// Below this machine's hard limit: a sandbox's root may lack
	// CAP_SYS_RESOURCE (containerd's default is 1024).
	f.rt = f.connect(t, Config{NoFile: 4096})
	uid, gid := uint32(4242), uint32(4343)
	// The run's files become the job's (the password file is 0600); a
	// link among them is not followed.
	runDir, outside := t.TempDir(), filepath.Join(t.TempDir(), "root-owned")
	os.WriteFile(filepath.Join(runDir, "etcd.password"), []byte("pw-for-the-job\n"), 0o600)
	os.WriteFile(outside, []byte("x"), 0o600)
	os.Symlink(outside, filepath.Join(runDir, "link"))
	ex, out := f.run(t, Spec{UID: &uid, GID: &gid, RunDir: runDir, Mounts: []Mount{{Source: runDir, Target: RunDir, ReadOnly: true}}},
		`cat /proc/self/status; cat /proc/self/limits; id; cat `+RunDir+`/etcd.password`)
	if ex.Code != 0 {
		t.Fatalf("exit %d:\n%s", ex.Code, out)
	}
	if !strings.Contains(out, "pw-for-the-job") {
		t.Errorf("the job's uid cannot read the run's password file:\n%s", out)
	}
	if fi, err := os.Stat(outside); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("a file a link in the run's directory points to changed owner: %v", err)
	}
	for _, want := range []string{
		"CapInh:\t0000000000000000\n", "CapPrm:\t0000000000000000\n", "CapEff:\t0000000000000000\n",
		"CapBnd:\t0000000000000000\n", "CapAmb:\t0000000000000000\n",
		"NoNewPrivs:\t1\n", "Seccomp:\t2\n",
		"Uid:\t4242\t4242\t4242\t4242\n", "Gid:\t4343\t4343\t4343\t4343\n", "Groups:\t4343 \n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("/proc/self/status lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "Max open files            4096                 4096                 files") {
		t.Errorf("RLIMIT_NOFILE is not 4096 soft and hard:\n%s", out)
	}
	// Root in the image gets nothing either (--allow-root-jobs).
	ex, out = f.run(t, Spec{}, `grep -E '^(CapEff|CapBnd|Seccomp|NoNewPrivs|Uid):' /proc/self/status; grep 'open files' /proc/self/limits`)
	for _, want := range []string{"CapEff:\t0000000000000000\n", "CapBnd:\t0000000000000000\n", "Seccomp:\t2\n", "NoNewPrivs:\t1\n", "Uid:\t0\t"} {
		if ex.Code != 0 || !strings.Contains(out, want) {
			t.Errorf("a root image run on purpose (exit %d) lacks %q:\n%s", ex.Code, want, out)
		}
	}
	if ids, snaps := left(t, f.rt); len(ids) != 0 || len(snaps) != 0 {
		t.Errorf("left behind: containers %v, snapshots %v", ids, snaps)
	}
}

// An image whose user is root, with no identity for the job, is refused
// with the reason and the fix; nothing of it is left. An image whose user
// is not root runs as that user.
func TestConfineRefusesARootImageWithoutAnIdentity(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := f.rt.Start(ctx, Spec{Image: f.image, Job: "j", Node: "n", Args: []string{"/bin/sh", "-c", "id"}, LogPath: filepath.Join(t.TempDir(), "o.log")})
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "runs as root") || !strings.Contains(err.Error(), "--job-user") {
		t.Errorf("a root image without an identity: %v, want ErrRefused naming root and --job-user", err)
	}
	if ids, snaps := left(t, f.rt); len(ids) != 0 || len(snaps) != 0 {
		t.Errorf("a refused container left: containers %v, snapshots %v", ids, snaps)
	}

	files, _ := ctrdtest.BusyboxFiles()
	img, err := ociimage.Build(ociimage.Spec{Files: files, Env: []string{"PATH=/bin"}, User: "1234:1234", Architecture: "amd64"})
	if err != nil {
		t.Fatal(err)
	}
	ref := f.reg.Host + "/test/nonroot:v1"
	if _, err := ociimage.Push(ctx, img, ref, ociimage.PushOptions{Auth: authn.Anonymous, Insecure: true}); err != nil {
		t.Fatal(err)
	}
	ex, out := f.run(t, Spec{Image: ref}, `grep -E '^(Uid|CapEff):' /proc/self/status`)
	if ex.Code != 0 || !strings.Contains(out, "Uid:\t1234\t") || !strings.Contains(out, "CapEff:\t0000000000000000") {
		t.Errorf("a non-root image without an identity (exit %d):\n%s", ex.Code, out)
	}
}

// Host mounts: within an allowed directory they work; /, containerd's
// socket, a path outside the allow-list and a symlink leading out of an
// allowed directory are refused before anything is pulled or made.
func TestConfineMountsOnlyWithinTheAllowList(t *testing.T) {
	f := newFixture(t)
	allowed, outside := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(allowed, "ckpt"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(allowed, "ckpt", "step"), []byte("step 7\n"), 0o644)
	os.WriteFile(filepath.Join(outside, "secret"), []byte("secret\n"), 0o644)
	if err := os.Symlink(outside, filepath.Join(allowed, "escape")); err != nil {
		t.Fatal(err)
	}
	f.rt = f.connect(t, Config{AllowMountSources: []string{allowed}})
	ex, out := f.run(t, Spec{JobMounts: []Mount{{Source: filepath.Join(allowed, "ckpt"), Target: "/ckpt", ReadOnly: true}}}, `cat /ckpt/step`)
	if ex.Code != 0 || out != "step 7\n" {
		t.Errorf("a mount within the allowed directory (exit %d): %q", ex.Code, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, m := range []struct{ rule, source, why string }{
		{"the host's root", "/", "root file system"},
		{"containerd's socket", f.ctrd.Address, "agent's own directory"},
		{"containerd's usual socket", DefaultAddress, "never mounted"},
		{"outside the allow-list", outside, "not within an allowed directory"},
		{"a symlink out of the allowed directory", filepath.Join(allowed, "escape"), "through a symbolic link"},
	} {
		// An image that does not exist: a refusal comes before the pull.
		_, err := f.rt.Start(ctx, Spec{Image: f.reg.Host + "/test/never-pulled:v1", Job: "j", Node: "n", AllowRoot: true, Args: []string{"/bin/true"},
			JobMounts: []Mount{{Source: m.source, Target: "/host"}}, LogPath: filepath.Join(t.TempDir(), "o.log")})
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), m.why) || !strings.Contains(err.Error(), allowed) || !strings.Contains(err.Error(), "--allow-mount-source") {
			t.Errorf("%s: Start = %v; want ErrRefused saying %q, the allow-list and the fix", m.rule, err, m.why)
		}
	}
	if ids, snaps := left(t, f.rt); len(ids) != 0 || len(snaps) != 0 {
		t.Errorf("left behind: containers %v, snapshots %v", ids, snaps)
	}
}

package containers

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/ctrdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// fixture is a private containerd, a loopback registry and a busybox
// image pushed to it.
type fixture struct {
	ctrd  *ctrdtest.Containerd
	reg   *ctrdtest.Registry
	image string
	rt    *Runtime
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctrd := ctrdtest.StartContainerd(t)
	reg := ctrdtest.StartRegistry(t)
	files, err := ctrdtest.BusyboxFiles()
	if err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ref, err := reg.Push(ctx, "test/busybox", "v1", ctrdtest.Image{Files: files, Entrypoint: []string{"/bin/sh"}})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := Connect(ctx, Config{Address: ctrd.Address, CDIDirs: []string{t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return &fixture{ctrd: ctrd, reg: reg, image: ref, rt: rt}
}

// run starts a container running script under /bin/sh and waits for it.
func (f *fixture) run(t *testing.T, s Spec, script string) (Exit, string) {
	return f.runWith(t, s, script, nil)
}

// runWith is run, calling during (if set) while the task runs.
func (f *fixture) runWith(t *testing.T, s Spec, script string, during func(*Task)) (Exit, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if s.Image == "" && s.UID == nil {
		// busybox's user is root: these tests run it as root on purpose
		// (confine_test.go runs it as a job's uid).
		s.AllowRoot = true
	}
	if s.Image == "" {
		s.Image = f.image
	}
	s.Job, s.Node = "job-a", "node-1"
	s.Args = []string{"/bin/sh", "-c", script}
	s.LogPath = filepath.Join(t.TempDir(), "out.log")
	reg, err := f.rt.CDI()
	if err != nil {
		t.Fatal(err)
	}
	s.CDI = reg
	task, err := f.rt.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if during != nil {
		during(task)
	}
	ex, err := task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	out, _ := os.ReadFile(s.LogPath)
	return ex, string(out)
}

func TestContainerRunsWithLimitsHostNetworkAndMounts(t *testing.T) {
	f := newFixture(t)
	host := t.TempDir()
	os.WriteFile(filepath.Join(host, "ckpt"), []byte("step 7\n"), 0o644)
	hostname, _ := os.Hostname()
	var limit string
	ex, out := f.runWith(t, Spec{
		Env:         []string{"GREETING=hello"},
		Mounts:      []Mount{{Source: host, Target: "/ckpt", ReadOnly: true}},
		ShmSize:     256 << 20,
		MemoryBytes: 512 << 20,
		CPUs:        1,
	}, `echo "$GREETING"; cat /ckpt/ckpt; touch /ckpt/x 2>/dev/null && echo writable || echo readonly; cat /proc/sys/kernel/hostname; df -k /dev/shm | tail -1; echo started; trap 'exit 3' USR2; while :; do sleep 0.1; done`, func(task *Task) {
		// The limits, read from the host: the container's own cgroup
		// (cgroup v1 memory controller, or v2).
		testutil.Eventually(t, 30*time.Second, "the task log to say started", testutil.True(func() bool { b, _ := os.ReadFile(task.LogPath); return strings.Contains(string(b), "started") }))
		for _, p := range []string{"/sys/fs/cgroup/memory/hyperpodrun/" + task.ID + "/memory.limit_in_bytes", "/sys/fs/cgroup/hyperpodrun/" + task.ID + "/memory.max"} {
			if b, err := os.ReadFile(p); err == nil {
				limit = strings.TrimSpace(string(b))
			}
		}
		task.Signal(syscall.SIGUSR2)
	})
	if limit != "536870912" {
		t.Errorf("the container's memory limit is %q, want 536870912 (perNode.memory)", limit)
	}
	if ex.Code != 3 {
		t.Errorf("exit code %d, want 3; output:\n%s", ex.Code, out)
	}
	for _, want := range []string{"hello\n", "step 7\n", "readonly\n", hostname + "\n", "262144"} {
		if !strings.Contains(out, want) {
			t.Errorf("container output lacks %q (env, read-only mount, host network, shm size, memory limit):\n%s", want, out)
		}
	}
	if ids, err := f.rt.List(context.Background(), ""); err != nil || len(ids) != 0 {
		t.Errorf("containers left after Remove: %v %v", ids, err)
	}
}

func TestCDIExposesOnlyTheAllocatedDevices(t *testing.T) {
	f := newFixture(t)
	// Four fake GPUs: character devices with /dev/null's numbers.
	dev := t.TempDir()
	var devs strings.Builder
	for i := range 4 {
		p := filepath.Join(dev, fmt.Sprintf("nvidia%d", i))
		if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, int(1<<8|3)); err != nil {
			t.Skipf("cannot make device nodes: %v", err)
		}
		fmt.Fprintf(&devs, "  - name: \"%d\"\n    containerEdits:\n      deviceNodes:\n        - path: /dev/nvidia%d\n          hostPath: %s\n", i, i, p)
	}
	spec := "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n" + devs.String() +
		"containerEdits:\n  env:\n    - NVIDIA_CDI=yes\n"
	if err := os.WriteFile(filepath.Join(f.rt.cfg.CDIDirs[0], "nvidia.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := f.rt.CDI()
	if err != nil {
		t.Fatal(err)
	}
	accels := fakeGPUs(4)
	plan, err := PlanDevices(accels[1:3], reg, dev, exists)
	if err != nil {
		t.Fatal(err)
	}
	ex, out := f.run(t, Spec{Devices: plan}, `ls /dev | grep nvidia; echo "$NVIDIA_VISIBLE_DEVICES $NVIDIA_CDI"`)
	if ex.Code != 0 || out != "nvidia1\nnvidia2\n1,2 yes\n" {
		t.Errorf("inside the container (exit %d):\n%s\nwant nvidia1 and nvidia2 only", ex.Code, out)
	}
	// A device the specs lack is an error naming it.
	accels[3].Index = 7
	if _, err := PlanDevices(accels[3:], reg, dev, exists); err == nil || !strings.Contains(err.Error(), "nvidia.com/gpu=7 is missing") {
		t.Errorf("missing CDI device: %v", err)
	}
}

func TestPullOfAMissingTagIsImageNotFound(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := f.rt.Pull(ctx, f.reg.Host+"/test/busybox:nope")
	if !errors.Is(err, ErrImageNotFound) || !strings.Contains(err.Error(), "busybox:nope") {
		t.Errorf("pull of a missing tag: %v", err)
	}
	// The config.json parser (TestPullWithCredentialsFromADockerConfig
	// pulls with it from a registry that wants credentials).
	cfg := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfg, []byte(`{"auths":{"`+f.reg.Host+`":{"auth":"dXNlcjpwYXNz"}}}`), 0o600)
	if u, p, err := DockerCredentials(cfg, f.reg.Host); err != nil || u != "user" || p != "pass" {
		t.Errorf("DockerCredentials: %q %q %v", u, p, err)
	}
}

func TestAdoptFindsARunningContainerByLabel(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := Spec{Image: f.image, Job: "job-a", Team: "t", Node: "node-1", Generation: 4, AllowRoot: true, Args: []string{"/bin/sh", "-c", "trap 'echo bye; exit 5' USR2; while :; do sleep 0.1; done"}, LogPath: filepath.Join(t.TempDir(), "o.log")}
	task, err := f.rt.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	other := s
	other.Node, other.LogPath = "node-2", filepath.Join(t.TempDir(), "o2.log")
	t2, err := f.rt.Start(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Remove(context.Background())
	// A new connection (a restarted agent) finds node-1's one container.
	rt2, err := Connect(ctx, Config{Address: f.ctrd.Address})
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.Close()
	got, err := rt2.Adopt(ctx, "node-1")
	if err != nil || len(got) != 1 || got[0].ID != task.ID || got[0].Job != "job-a" || got[0].Generation != 4 || got[0].LogPath != s.LogPath || got[0].Pid() != task.Pid() {
		t.Fatalf("adopted %+v, %v; want %s", got, err, task.ID)
	}
	if err := got[0].Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	ex, err := got[0].Wait(ctx)
	if err != nil || ex.Code != 5 {
		t.Errorf("adopted task's exit: %+v %v", ex, err)
	}
	if err := got[0].Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if ids, _ := rt2.List(ctx, "node-1"); len(ids) != 0 {
		t.Errorf("left: %v", ids)
	}
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// A registry that wants credentials: the pull works with a docker-style
// config.json that has them (--registry-config), and fails without.
func TestPullWithCredentialsFromADockerConfig(t *testing.T) {
	ctrd := ctrdtest.StartContainerd(t)
	reg := ctrdtest.StartRegistryWithAuth(t, "trainer", "s3cret")
	files, err := ctrdtest.BusyboxFiles()
	if err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ref, err := reg.Push(ctx, "private/busybox", "v1", ctrdtest.Image{Files: files})
	if err != nil {
		t.Fatal(err)
	}
	anon, err := Connect(ctx, Config{Address: ctrd.Address})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.Pull(ctx, ref); err == nil {
		t.Fatal("a pull without credentials from a registry that wants them succeeded")
	}
	cfg := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfg, []byte(`{"auths":{"`+reg.Host+`":{"auth":"`+base64.StdEncoding.EncodeToString([]byte("trainer:s3cret"))+`"}}}`), 0o600)
	rt, err := Connect(ctx, Config{Address: ctrd.Address, DockerConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if _, err := rt.Pull(ctx, ref); err != nil {
		t.Fatalf("pull with the config's credentials: %v", err)
	}
}

// A test that stops half-way leaves a running container behind; the
// fixture's cleanup (ctrdtest) must kill it, not only containerd and its
// shims, whose death a container survives.
func TestFixtureCleanupKillsContainersATestLeft(t *testing.T) {
	var pid uint32
	t.Run("leaves a container running", func(t *testing.T) {
		f := newFixture(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		task, err := f.rt.Start(ctx, Spec{Image: f.image, Job: "left", Node: "n", AllowRoot: true, Args: []string{"/bin/sh", "-c", "while :; do sleep 0.1; done"}, LogPath: filepath.Join(t.TempDir(), "o.log")})
		if err != nil {
			t.Fatal(err)
		}
		pid = task.Pid()
		if pid == 0 || syscall.Kill(int(pid), 0) != nil {
			t.Fatalf("the container's init %d is not running", pid)
		}
	})
	if pid == 0 {
		t.Fatal("no container was started")
	}
	testutil.Eventually(t, 30*time.Second, "the container init to be gone or a zombie", testutil.True(func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return err != nil || strings.Contains(string(b), ") Z ")
	}))

}

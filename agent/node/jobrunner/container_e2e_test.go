package jobrunner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/agent/node/containers"
	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/ctrdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

var (
	staticOnce sync.Once
	staticDir  string
	staticErr  error
)

// staticBinaries builds a static hyperpodrun and the bundled worker once:
// they run inside a busybox image.
func staticBinaries(t *testing.T) (hyperpodrun, worker string) {
	t.Helper()
	return staticBinariesTB(t)
}

func staticBinariesTB(t testing.TB) (hyperpodrun, worker string) {
	t.Helper()
	staticOnce.Do(func() {
		staticDir, staticErr = os.MkdirTemp("", "static-")
		if staticErr != nil {
			return
		}
		for name, pkg := range map[string]string{"hyperpodrun": "../../../cmd/hyperpodrun", "worker": "../../../examples/worker"} {
			cmd := exec.Command("go", "build", "-tags", "osusergo,netgo",
				"-ldflags", `-linkmode external -extldflags "-static"`, "-o", filepath.Join(staticDir, name), pkg)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
			if out, err := cmd.CombinedOutput(); err != nil {
				staticErr = fmt.Errorf("build static %s: %v\n%s", name, err, out)
				return
			}
		}
	})
	if staticErr != nil {
		t.Fatal(staticErr)
	}
	return filepath.Join(staticDir, "hyperpodrun"), filepath.Join(staticDir, "worker")
}

// containerFleet is a private containerd and registry with the worker's
// image, an etcd, a coordinator, and node agents in containerd mode.
type containerFleet struct {
	t      *testing.T
	ctx    context.Context
	ctrd   *ctrdtest.Containerd
	reg    *ctrdtest.Registry
	image  string
	cli    *clientv3.Client
	eps    []string
	st     *fleet.Store
	hpr    string
	devDir string
	out    *syncBuf
	logs   *syncBuf
	logDir string
	mu     sync.Mutex
	agents map[string]context.CancelFunc
	done   map[string]chan struct{}
	// What the agents started after a change get: the host directories
	// jobs may mount (default: the temp dir, where the tests' checkpoint
	// directories are), the job user (default none), whether a root image
	// may run as root (default yes: busybox's user is root) and the
	// containers' RLIMIT_NOFILE (0: the runtime's default).
	allowMounts []string
	jobUser     JobUser
	allowRoot   bool
	noFile      uint64
	// uidRange is the agents' --job-uid-range (default none); with
	// keepRunDirs a node's --run-dir outlives its agent's restarts, as a
	// real node's does (default: a fresh one per agent start).
	uidRange    UIDRange
	keepRunDirs bool
	runDirs     map[string]string
}

const e2eFlavor = "fake-gpu"

func newContainerFleet(t *testing.T, coordOpts ...func(*coordinator.Config)) *containerFleet {
	t.Helper()
	ctrd := ctrdtest.StartContainerd(t)
	reg := ctrdtest.StartRegistry(t)
	hpr, worker := staticBinaries(t)
	files, err := ctrdtest.BusyboxFiles()
	if err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	files = append(files, ctrdtest.File{Path: "bin/worker", Source: worker, Mode: 0o755})
	image, err := reg.Push(ctx, "team/worker", "v1", ctrdtest.Image{Files: files})
	if err != nil {
		t.Fatal(err)
	}
	srv, cli := etcdtest.Start(t)
	f := &containerFleet{t: t, ctx: ctx, ctrd: ctrd, reg: reg, image: image, cli: cli, eps: srv.Endpoints, st: fleet.New(cli, ""),
		hpr: hpr, devDir: t.TempDir(), out: &syncBuf{}, logs: &syncBuf{}, logDir: t.TempDir(),
		agents: map[string]context.CancelFunc{}, done: map[string]chan struct{}{}, runDirs: map[string]string{},
		allowMounts: []string{os.TempDir()}, allowRoot: true}
	// Two fake GPUs per node: character devices with /dev/null's numbers
	// (no CDI spec: the device nodes themselves go into the container).
	for _, n := range []string{"nvidia0", "nvidia1"} {
		if err := syscall.Mknod(filepath.Join(f.devDir, n), syscall.S_IFCHR|0o666, int(1<<8|3)); err != nil {
			t.Skipf("cannot make device nodes: %v", err)
		}
	}
	if err := f.st.PutTeam(ctx, policy.Team{Name: "t", Weight: 1, Quotas: []policy.FlavorQuota{{Flavor: e2eFlavor, Nominal: 8}}}); err != nil {
		t.Fatal(err)
	}
	ccfg := coordinator.Config{Engine: policy.Config{MinStablePeriod: -1}, Resync: 200 * time.Millisecond}
	for _, o := range coordOpts {
		o(&ccfg)
	}
	coord := coordinator.New(cli, ccfg)
	cctx, stop := context.WithCancel(context.Background())
	cdone := make(chan struct{})
	go func() { coord.Run(cctx); close(cdone) }()
	t.Cleanup(func() {
		stop()
		<-cdone
		f.mu.Lock()
		names := make([]string, 0, len(f.agents))
		for n := range f.agents {
			names = append(names, n)
		}
		f.mu.Unlock()
		for _, n := range names {
			f.stopAgent(n)
		}
		if t.Failed() {
			t.Logf("agents' log:\n%s\njobs' output:\n%s", f.logs.String(), f.out.String())
		}
	})
	return f
}

// startAgent starts node name's agent: a node agent whose runner runs
// containers through the fleet's containerd.
func (f *containerFleet) startAgent(name string) {
	f.t.Helper()
	log := slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelInfo})).With("agent", name)
	rt, err := containers.Connect(f.ctx, containers.Config{Address: f.ctrd.Address, CDIDirs: []string{filepath.Join(f.devDir, "cdi")}, DevRoot: f.devDir, Logger: log,
		AllowMountSources: f.allowMounts, NoFile: f.noFile})
	if err != nil {
		f.t.Fatal(err)
	}
	tmp, keep := f.runDirs[name], f.keepRunDirs
	if tmp == "" {
		var err error
		if tmp, err = os.MkdirTemp("", "hpa"); err != nil {
			f.t.Fatal(err)
		}
		if keep {
			f.runDirs[name] = tmp
			f.t.Cleanup(func() { os.RemoveAll(tmp) })
		}
	}
	r := New(Config{Endpoints: f.eps, Output: f.out, Logger: log, TempDir: tmp, LogDir: f.logDir, RdzvConf: "lease_ttl=3",
		Containers: rt, ContainerHyperpodrun: f.hpr, BackoffBase: 200 * time.Millisecond, DrainMargin: time.Second,
		JobUser: f.jobUser, AllowRootJobs: f.allowRoot, UIDRange: f.uidRange})
	devDir := f.devDir
	agent, err := nodeagent.New(f.cli, nodeagent.Config{NodeName: name, LeaseTTL: 10 * time.Second, Workloads: r, Logger: log,
		Discover: func(context.Context) (*devices.Inventory, error) {
			inv := &devices.Inventory{Node: name, Flavor: e2eFlavor, Flavors: []string{e2eFlavor}, VCPUs: 8, MemoryBytes: 8 << 30, UpdatedAt: time.Now().UTC()}
			for g := range 2 {
				inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNVIDIA, Index: g, Flavor: e2eFlavor, Minor: g,
					DevicePath: filepath.Join(devDir, "nvidia"+strconv.Itoa(g)), Healthy: true})
			}
			return inv, nil
		}})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		agent.Run(ctx)
		rt.Close()
		if !keep {
			os.RemoveAll(tmp)
		}
		close(done)
	}()
	f.mu.Lock()
	f.agents[name], f.done[name] = cancel, done
	f.mu.Unlock()
}

// stopAgent stops an agent as a crash would (its containers go on).
func (f *containerFleet) stopAgent(name string) {
	f.mu.Lock()
	cancel, done := f.agents[name], f.done[name]
	delete(f.agents, name)
	f.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

func (f *containerFleet) waitFor(what string, timeout time.Duration, cond func() bool) {
	f.t.Helper()
	testutil.Eventually(f.t, timeout, what, testutil.True(cond))
}

// containers lists the fleet's containers (every node's).
func (f *containerFleet) containers() []string {
	rt, err := containers.Connect(f.ctx, containers.Config{Address: f.ctrd.Address})
	if err != nil {
		f.t.Fatal(err)
	}
	defer rt.Close()
	ids, err := rt.List(f.ctx, "")
	if err != nil {
		f.t.Fatal(err)
	}
	return ids
}

var stepLine = regexp.MustCompile(`(?m)^\S+ step=(\d+) world_size=(\d+) `)

// steps returns rank 0's step lines: step numbers and world sizes, in order.
func (f *containerFleet) steps() (steps, worlds []int) {
	for _, m := range stepLine.FindAllStringSubmatch(f.out.String(), -1) {
		s, _ := strconv.Atoi(m[1])
		w, _ := strconv.Atoi(m[2])
		steps, worlds = append(steps, s), append(worlds, w)
	}
	return steps, worlds
}

// lastWorld is the world size of rank 0's last step line (0: none yet).
func (f *containerFleet) lastWorld() int {
	_, w := f.steps()
	if len(w) == 0 {
		return 0
	}
	return w[len(w)-1]
}

func (f *containerFleet) finished(job string) *fleet.Finish {
	fin, _, err := f.st.Finished(f.ctx)
	if err != nil {
		return nil
	}
	if x, ok := fin[job]; ok {
		return &x
	}
	return nil
}

func (f *containerFleet) submit(name string, minN, maxN int, run fleet.RunSpec) {
	f.t.Helper()
	err := f.st.SubmitJob(f.ctx, fleet.JobSpec{Job: policy.Job{Name: name, Team: "t", Flavor: e2eFlavor, PerNode: policy.Resources{Accelerators: 2, VCPUs: 1, Memory: 512 << 20},
		MinNodes: minN, MaxNodes: maxN, Elastic: minN != maxN, SubmitTime: time.Now().UTC()}, Run: run})
	if err != nil {
		f.t.Fatal(err)
	}
}

func (f *containerFleet) resize(job string, maxN int) {
	f.t.Helper()
	if _, err := f.st.UpdateJob(f.ctx, job, func(j *fleet.JobSpec) error { j.MaxNodes = maxN; return nil }); err != nil {
		f.t.Fatal(err)
	}
}

// The end to end: two agents in containerd mode and a coordinator
// run an elastic job from a registry image; it shrinks 2 -> 1 and grows
// 1 -> 2 with no step lost or repeated; an agent SIGKILLed mid-job (here:
// stopped as a crash stops it) is restarted and adopts its container; no
// container is left when the job ends.
func TestContainerJobResizesLosesNoStepAndLeavesNoContainer(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end: containerd, registry, coordinator and two agents")
	}
	f := newContainerFleet(t)
	f.startAgent("node-1")
	f.startAgent("node-2")
	ckpt := t.TempDir()
	const total = 260
	f.submit("train", 1, 2, fleet.RunSpec{Image: f.image, Script: "/bin/worker", NoPython: true,
		Args:   []string{"--steps", strconv.Itoa(total), "--step-time", "40ms", "--ckpt-dir", "/ckpt"},
		Mounts: []fleet.Mount{{Source: ckpt, Target: "/ckpt"}}, ShmSize: 128 << 20, GracefulTimeoutSeconds: 20})

	f.waitFor("rank 0 training at world size 2", 90*time.Second, func() bool { return f.lastWorld() == 2 })
	if got := len(f.containers()); got != 2 {
		t.Fatalf("%d containers for a 2-node job, want 2", got)
	}
	// Inside: exactly the allocated devices, the job's env, host network.
	if !strings.Contains(f.logs.String(), "started job in a container") {
		t.Errorf("no container start logged")
	}

	f.resize("train", 1)
	f.waitFor("rank 0 training at world size 1", 60*time.Second, func() bool { return f.lastWorld() == 1 })
	f.waitFor("the drained node's container removed", 30*time.Second, func() bool { return len(f.containers()) == 1 })

	// The agent of the node still running crashes and comes back: it
	// adopts its container (no second one, no orphan) and training goes on.
	d, err := f.st.Desired(f.ctx, "train")
	if err != nil || len(d.Nodes) != 1 {
		t.Fatalf("desired after the shrink: %+v %v", d, err)
	}
	survivor := d.Nodes[0]
	before := f.containers()
	f.stopAgent(survivor)
	f.startAgent(survivor)
	f.waitFor("the restarted agent adopting its container", 30*time.Second, func() bool {
		return strings.Contains(f.logs.String(), "adopted the job's running container")
	})
	if after := f.containers(); len(after) != 1 || after[0] != before[0] {
		t.Errorf("containers after the agent's restart: %v, before %v (want the same one)", after, before)
	}
	s0, _ := f.steps()
	f.waitFor("training to go on after the adoption", 30*time.Second, func() bool { s, _ := f.steps(); return len(s) > len(s0)+5 })

	f.resize("train", 2)
	f.waitFor("rank 0 training at world size 2 again", 90*time.Second, func() bool {
		_, w := f.steps()
		grown := false
		for i := 1; i < len(w); i++ {
			if w[i-1] == 1 && w[i] == 2 {
				grown = true
			}
		}
		return grown
	})
	f.waitFor("the job to finish", 120*time.Second, func() bool { return f.finished("train") != nil })
	if fin := f.finished("train"); fin.Outcome != fleet.Succeeded {
		t.Fatalf("job finished %+v", fin)
	}
	// Every step exactly once: rank 0's lines in the containers' log
	// files (consoleLog). The agents' consoles miss what
	// was printed while node-1's agent was down; the files do not.
	count := map[int]int{}
	for _, node := range []string{"node-1", "node-2"} {
		b, err := os.ReadFile(f.consoleLog(node, "train"))
		if err != nil && node == survivor {
			t.Fatalf("container log file: %v", err)
		}
		for _, m := range regexp.MustCompile(`(?m)^step=(\d+) world_size=\d+ `).FindAllStringSubmatch(string(b), -1) {
			n, _ := strconv.Atoi(m[1])
			count[n]++
		}
	}
	for s := 1; s <= total; s++ {
		if count[s] != 1 {
			t.Errorf("step %d ran %d times (want once: no step lost or repeated)", s, count[s])
		}
	}
	if len(count) != total {
		t.Errorf("%d distinct steps, want %d", len(count), total)
	}
	_, worlds := f.steps()
	t.Logf("steps 1..%d once each; world sizes seen in order: %v", total, compact(worlds))
	f.waitFor("every container gone after the job ended", 30*time.Second, func() bool { return len(f.containers()) == 0 })
}

// A pull of a tag that does not exist fails the job with the reason,
// which elasticctl describe job shows (the finish record); the node stays
// usable.
func TestMissingImageTagFailsTheJobWithTheReason(t *testing.T) {
	if testing.Short() {
		t.Skip("containerd, registry, coordinator and an agent")
	}
	f := newContainerFleet(t)
	f.startAgent("node-1")
	f.submit("typo", 1, 1, fleet.RunSpec{Image: f.reg.Host + "/team/worker:v2-does-not-exist", Script: "/bin/worker", NoPython: true})
	f.waitFor("the job to fail", 60*time.Second, func() bool { return f.finished("typo") != nil })
	fin := f.finished("typo")
	if fin.Outcome != fleet.Failed || !strings.Contains(fin.Message, "v2-does-not-exist") || !strings.Contains(fin.Message, "image not found") || !strings.Contains(fin.Message, "node-1") {
		t.Errorf("finish record: %+v", fin)
	}
	// The node is not at fault: the next job runs on it.
	f.submit("ok", 1, 1, fleet.RunSpec{Image: f.image, Script: "/bin/worker", NoPython: true, Args: []string{"--steps", "3", "--step-time", "10ms"}})
	f.waitFor("the next job on the same node", 60*time.Second, func() bool { x := f.finished("ok"); return x != nil && x.Outcome == fleet.Succeeded })
	f.waitFor("its container gone", 30*time.Second, func() bool { return len(f.containers()) == 0 })
}

// containerd down: the job is not failed; the node records why it cannot
// run it (describe job shows it) and starts it once containerd is back.
func TestContainerdDownIsANodeProblemNotAJobFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("containerd, registry, coordinator and an agent")
	}
	f := newContainerFleet(t)
	f.startAgent("node-1")
	f.ctrd.Kill()
	f.submit("waits", 1, 1, fleet.RunSpec{Image: f.image, Script: "/bin/worker", NoPython: true, Args: []string{"--steps", "3", "--step-time", "10ms"}})
	f.waitFor("a problem record for the job", 60*time.Second, func() bool {
		ps, _, err := f.st.Problems(f.ctx, "waits")
		return err == nil && len(ps) == 1 && ps[0].Node == "node-1" && strings.Contains(ps[0].Message, "cannot start the job's container")
	})
	if fin := f.finished("waits"); fin != nil {
		t.Fatalf("the job was failed for the node's containerd: %+v", fin)
	}
}

func compact(ws []int) []int {
	var out []int
	for _, w := range ws {
		if len(out) == 0 || out[len(out)-1] != w {
			out = append(out, w)
		}
	}
	return out
}

// A real PyTorch DDP run (gloo, 2 workers) in a container: the image is a
// merged-/usr skeleton (bin, lib, lib64 and sbin link into /usr, with
// copies of the host's /etc/alternatives links, where Debian's BLAS links
// point, and loader cache) and the job mounts the host's /usr read-only
// (allowed by the agent's --allow-mount-source), so the host's Python and
// Debian's torch run inside; the training script comes in through a mount too. The
// agent's static hyperpodrun launches the workers; the Python helper
// reaches them on PYTHONPATH from hyperpodrun itself.
func TestPyTorchDDPTrainsInAContainer(t *testing.T) {
	if testing.Short() {
		t.Skip("containerd, registry, coordinator, an agent and PyTorch")
	}
	if out, err := exec.Command("/usr/bin/python3", "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("PyTorch is not installed in /usr/bin/python3 (apt-get install python3-torch): %v %s", err, out)
	}
	f := newContainerFleet(t)
	skeleton := []ctrdtest.File{{Path: "tmp/", Mode: 0o1777}, {Path: "usr/", Mode: 0o755}, {Path: "etc/passwd", Data: []byte("root:x:0:0:root:/root:/bin/sh\n")},
		{Path: "bin", Link: "usr/bin"}, {Path: "lib", Link: "usr/lib"}, {Path: "lib64", Link: "usr/lib64"}, {Path: "sbin", Link: "usr/sbin"},
		{Path: "etc/ld.so.cache", Source: "/etc/ld.so.cache"}}
	// The host's /etc is never mounted into a job (containers.
	// DangerousMountSource): Debian's alternatives links, where its BLAS
	// links point, come as links in the image.
	alts, err := os.ReadDir("/etc/alternatives")
	if err != nil {
		t.Skipf("no /etc/alternatives: %v", err)
	}
	for _, a := range alts {
		if target, err := os.Readlink(filepath.Join("/etc/alternatives", a.Name())); err == nil {
			skeleton = append(skeleton, ctrdtest.File{Path: "etc/alternatives/" + a.Name(), Link: target})
		}
	}
	image, err := f.reg.Push(f.ctx, "team/host-python", "v1", ctrdtest.Image{Files: skeleton})
	if err != nil {
		t.Fatal(err)
	}
	scripts, err := filepath.Abs("../../../examples/pytorch")
	if err != nil {
		t.Fatal(err)
	}
	f.allowMounts = append(f.allowMounts, "/usr", scripts)
	f.startAgent("node-1")
	f.submit("ddp", 1, 1, fleet.RunSpec{Image: image, Script: "/scripts/train_elastic.py", NProcPerNode: "2", Python: "/usr/bin/python3",
		Args: []string{"--steps", "8", "--ckpt-dir", "/ckpt", "--backend", "gloo"},
		Mounts: []fleet.Mount{{Source: "/usr", Target: "/usr", ReadOnly: true},
			{Source: scripts, Target: "/scripts", ReadOnly: true}, {Source: t.TempDir(), Target: "/ckpt"}},
		Env: map[string]string{"OMP_NUM_THREADS": "1"}, ShmSize: 256 << 20})
	f.waitFor("the DDP job to finish", 4*time.Minute, func() bool { return f.finished("ddp") != nil })
	if fin := f.finished("ddp"); fin.Outcome != fleet.Succeeded {
		t.Fatalf("DDP job: %+v\n%s", fin, f.out.String())
	}
	out := f.out.String()
	if !strings.Contains(out, "step=8 world_size=2 ") {
		t.Errorf("no step 8 at world size 2 (2 DDP workers in one container):\n%s", out)
	}
	f.waitFor("its container gone", 30*time.Second, func() bool { return len(f.containers()) == 0 })
}

// A container that dies (its hyperpodrun SIGKILLed from the host) is a
// node failure, as a dead hyperpodrun is: the container is removed, a new
// one starts on the node after the backoff, training resumes from the
// committed checkpoint and the job succeeds; nothing is left.
func TestDeadContainerIsRestartedLikeADeadHyperpodrun(t *testing.T) {
	if testing.Short() {
		t.Skip("containerd, registry, coordinator and an agent")
	}
	f := newContainerFleet(t)
	f.startAgent("node-1")
	f.submit("crash", 1, 1, fleet.RunSpec{Image: f.image, Script: "/bin/worker", NoPython: true, MaxRestarts: 3,
		Args:   []string{"--steps", "60", "--step-time", "40ms", "--ckpt-dir", "/ckpt", "--ckpt-every", "5"},
		Mounts: []fleet.Mount{{Source: t.TempDir(), Target: "/ckpt"}}})
	f.waitFor("training", 60*time.Second, func() bool { s, _ := f.steps(); return len(s) >= 12 })
	first := f.containers()
	if len(first) != 1 {
		t.Fatalf("containers: %v", first)
	}
	rt, err := containers.Connect(f.ctx, containers.Config{Address: f.ctrd.Address})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	tasks, err := rt.Adopt(f.ctx, "node-1")
	if err != nil || len(tasks) != 1 {
		t.Fatalf("find the container: %v %v", tasks, err)
	}
	if err := syscall.Kill(int(tasks[0].Pid()), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	f.waitFor("a new container for the job", 60*time.Second, func() bool {
		c := f.containers()
		return len(c) == 1 && c[0] != first[0]
	})
	f.waitFor("the job to finish", 90*time.Second, func() bool { return f.finished("crash") != nil })
	if fin := f.finished("crash"); fin.Outcome != fleet.Succeeded {
		t.Fatalf("job: %+v", fin)
	}
	if !strings.Contains(f.logs.String(), "node failure") || !strings.Contains(f.logs.String(), "was killed by SIGKILL") {
		t.Errorf("the dead container was not judged a node failure killed by SIGKILL:\n%s", f.logs.String())
	}
	if !regexp.MustCompile(`resumed at step \d+`).MatchString(f.out.String()) {
		t.Errorf("the new container did not resume from the checkpoint")
	}
	f.waitFor("no container left", 30*time.Second, func() bool { return len(f.containers()) == 0 })
}

// A stop escalates: a container whose launcher ignores the drain signal is
// SIGKILLed once the job's graceful timeout (+ the agent's margin, 1 s
// here) has passed, and removed.
func TestStopEscalatesToSIGKILLAfterTheJobsTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("containerd, registry, coordinator and an agent")
	}
	f := newContainerFleet(t)
	f.startAgent("node-1")
	f.submit("stubborn", 1, 1, fleet.RunSpec{Image: f.image, Script: "/bin/worker", NoPython: true, GracefulTimeoutSeconds: 1,
		Command: []string{"/bin/sh", "-c", "trap '' USR2; echo ignoring-drains; while :; do sleep 0.1; done", "sh"}})
	f.waitFor("the container running", 60*time.Second, func() bool { return strings.Contains(f.out.String(), "ignoring-drains") })
	if _, err := f.st.UpdateJob(f.ctx, "stubborn", func(j *fleet.JobSpec) error { j.Suspended = true; return nil }); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f.waitFor("the container killed and removed", 60*time.Second, func() bool { return len(f.containers()) == 0 })
	if !strings.Contains(f.logs.String(), "did not exit within its grace period: killing it") {
		t.Errorf("no escalation logged:\n%s", f.logs.String())
	}
	if took := time.Since(start); took < 2*time.Second {
		t.Errorf("killed after %s, before the job's graceful timeout (1 s) + margin (1 s)", took)
	}
}

// submitAround writes a job's spec as SubmitJob does, or, where SubmitJob
// refuses it (a submit-time check), straight into etcd: the agent must
// refuse what reaches it anyway (an older coordinator, a hand-written
// record).
func (f *containerFleet) submitAround(name string, run fleet.RunSpec) {
	f.t.Helper()
	j := fleet.JobSpec{Job: policy.Job{Name: name, Team: "t", Flavor: e2eFlavor, PerNode: policy.Resources{Accelerators: 2, VCPUs: 1, Memory: 512 << 20},
		MinNodes: 1, MaxNodes: 1, SubmitTime: time.Now().UTC()}, Run: run}
	err := f.st.SubmitJob(f.ctx, j)
	if err == nil {
		return
	}
	f.t.Logf("submit refused %s (%v): writing its spec around the check", name, err)
	b, err := json.Marshal(j)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.cli.Put(f.ctx, f.st.Keys.Spec(j.Team, j.Name), string(b)); err != nil {
		f.t.Fatal(err)
	}
}

// consoleLog is the host file of a job's container output on node:
// <log-dir>/<node>/<job>.log (<log-dir>/<job>/<node>.log before issue 22).
func (f *containerFleet) consoleLog(node, job string) string {
	p := filepath.Join(f.logDir, node, job+".log")
	if _, err := os.Stat(p); err != nil {
		if old := filepath.Join(f.logDir, job, node+".log"); exists(old) {
			return old
		}
	}
	return p
}

// problemOf is node's problem record of job ("" when none).
func (f *containerFleet) problemOf(job string) string {
	ps, _, err := f.st.Problems(f.ctx, job)
	if err != nil || len(ps) == 0 {
		return ""
	}
	return ps[0].Node + ": " + ps[0].Message
}

// A running job container, seen from inside by the job itself: no
// capability in any set, containerd's default seccomp filter,
// no_new_privileges, the job's uid and gid, RLIMIT_NOFILE as the node
// sets it; a mount within the node's allowed directories works.
func TestConfinedJobContainerHasNoCapabilitiesSeccompNoNewPrivsAndTheJobsUID(t *testing.T) {
	if testing.Short() {
		t.Skip("containerd, registry, coordinator and an agent")
	}
	f := newContainerFleet(t)
	f.jobUser, f.allowRoot, f.noFile = JobUser{UID: 4242, GID: 4343, Set: true}, false, 4096
	data := t.TempDir()
	if err := os.WriteFile(filepath.Join(data, "shard"), []byte("shard-0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(data, 0o755)
	f.startAgent("node-1")
	f.submit("confined", 1, 1, fleet.RunSpec{Image: f.image, Script: "/bin/worker", NoPython: true, GracefulTimeoutSeconds: 1,
		Mounts:  []fleet.Mount{{Source: data, Target: "/data", ReadOnly: true}},
		Command: []string{"/bin/sh", "-c", "grep -E '^(Cap|Seccomp|NoNewPrivs|Uid|Gid)' /proc/self/status; grep 'open files' /proc/self/limits; cat /data/shard; echo confined-ready; trap 'exit 0' USR2; while :; do sleep 0.1; done", "sh"}})
	f.waitFor("the job's container to report", 60*time.Second, func() bool { return strings.Contains(f.out.String(), "confined-ready") })
	out := f.out.String()
	for _, want := range []string{
		"CapInh:\t0000000000000000", "CapPrm:\t0000000000000000", "CapEff:\t0000000000000000",
		"CapBnd:\t0000000000000000", "CapAmb:\t0000000000000000",
		"Seccomp:\t2", "NoNewPrivs:\t1", "Uid:\t4242\t4242\t4242\t4242", "Gid:\t4343\t4343\t4343\t4343",
		"shard-0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the job's container lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`Max open files\s+4096\s+4096\s+files`).MatchString(out) {
		t.Errorf("the job's RLIMIT_NOFILE is not 4096 (the node's setting):\n%s", out)
	}
	if _, err := f.st.UpdateJob(f.ctx, "confined", func(j *fleet.JobSpec) error { j.Suspended = true; return nil }); err != nil {
		t.Fatal(err)
	}
	f.waitFor("its container gone", 60*time.Second, func() bool { return len(f.containers()) == 0 })
}

// Host mounts the node does not allow are refused before any container is
// made, with a problem record (elasticctl describe job) that names the
// mount, the node's allow-list and the fix: the host's /, containerd's
// socket, and a symlink inside an allowed directory that leads out of it.
func TestConfineRefusesHostRootSocketAndSymlinkEscapeMounts(t *testing.T) {
	if testing.Short() {
		t.Skip("containerd, registry, coordinator and three agents")
	}
	f := newContainerFleet(t)
	allowed := t.TempDir()
	secret := t.TempDir()
	if err := os.Symlink(secret, filepath.Join(allowed, "escape")); err != nil {
		t.Fatal(err)
	}
	f.allowMounts = []string{allowed}
	for _, n := range []string{"node-1", "node-2", "node-3"} {
		f.startAgent(n)
	}
	jobs := map[string]struct {
		source, why string
	}{
		"root-fs": {"/", "root file system"},
		"socket":  {f.ctrd.Address, "agent's own directory"},
		"escape":  {filepath.Join(allowed, "escape"), "through a symbolic link"},
	}
	for name, j := range jobs {
		f.submitAround(name, fleet.RunSpec{Image: f.image, Script: "/bin/worker", NoPython: true, Args: []string{"--steps", "3"},
			Mounts: []fleet.Mount{{Source: j.source, Target: "/host"}}})
	}
	for name, j := range jobs {
		f.waitFor("a problem record for "+name, 60*time.Second, func() bool { return f.problemOf(name) != "" })
		p := f.problemOf(name)
		for _, want := range []string{"refuses the job's container", fmt.Sprintf("%q", j.source), j.why, allowed, "--allow-mount-source"} {
			if !strings.Contains(p, want) {
				t.Errorf("job %s's problem record lacks %q: %s", name, want, p)
			}
		}
		if fin := f.finished(name); fin != nil {
			t.Errorf("job %s finished (%+v): a refused mount is the node's word, not the job's end", name, fin)
		}
	}
	if c := f.containers(); len(c) != 0 {
		t.Errorf("containers made for refused specs: %v", c)
	}
	if strings.Contains(f.logs.String(), "started job in a container") {
		t.Errorf("a container started for a refused spec:\n%s", f.logs.String())
	}
}

// With no identity for the job (no --job-user, no --job-uid-range) an
// image whose user is root is refused with the reason and the fix; it
// never runs as root unasked.
func TestConfineRefusesARootImageWithoutAJobIdentity(t *testing.T) {
	if testing.Short() {
		t.Skip("containerd, registry, coordinator and an agent")
	}
	f := newContainerFleet(t)
	f.allowRoot = false
	f.startAgent("node-1")
	f.submit("as-root", 1, 1, fleet.RunSpec{Image: f.image, Script: "/bin/worker", NoPython: true, Args: []string{"--steps", "3"}})
	f.waitFor("a problem record", 60*time.Second, func() bool { return f.problemOf("as-root") != "" })
	p := f.problemOf("as-root")
	for _, want := range []string{"runs as root", "--job-uid-range", "--job-user"} {
		if !strings.Contains(p, want) {
			t.Errorf("the problem record lacks %q: %s", want, p)
		}
	}
	if strings.Contains(f.logs.String(), "started job in a container") || len(f.containers()) != 0 {
		t.Errorf("the root image ran:\n%s", f.logs.String())
	}
}

// Issue 22: an agent that restarts adopts its job's container and claims
// the job's uid again (<run-dir>/uids/<uid>), so the uid stays the job's
// on the node across the restart: when the job leaves the node, the claim
// is released and the job's log directory taken back (root's, 0700), so a
// job given that uid later can neither read it nor be refused the uid.
func TestAdoptedContainerClaimsItsJobsUIDAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("containerd, registry, coordinator and an agent")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to run containerd and jobs as their own uids")
	}
	const first, last = 61000, 61009
	f := newContainerFleet(t, func(c *coordinator.Config) { c.JobUIDFirst, c.JobUIDLast = first, last })
	f.uidRange, f.allowRoot, f.keepRunDirs = UIDRange{First: first, Last: last}, false, true
	f.startAgent("node-1")
	f.submit("owner", 1, 1, fleet.RunSpec{Image: f.image, Script: "/bin/worker", NoPython: true, GracefulTimeoutSeconds: 5,
		Args: []string{"--steps", "100000", "--step-time", "50ms"}})
	f.waitFor("training", 90*time.Second, func() bool { s, _ := f.steps(); return len(s) >= 3 })
	d, err := f.st.Desired(f.ctx, "owner")
	if err != nil || d == nil || d.UID < first || d.UID > last {
		t.Fatalf("desired record %+v (%v): want a uid in %d-%d", d, err, first, last)
	}
	claim := filepath.Join(f.runDirs["node-1"], "uids", strconv.FormatUint(uint64(d.UID), 10))
	if b, err := os.ReadFile(claim); err != nil || string(b) != "owner\nnode-1\n" {
		t.Fatalf("claim of uid %d: %q (%v), want owner's by node-1", d.UID, b, err)
	}

	f.stopAgent("node-1")
	f.startAgent("node-1")
	f.waitFor("the restarted agent adopting the container", 30*time.Second, func() bool {
		return strings.Contains(f.logs.String(), "adopted the job's running container")
	})
	if _, err := f.st.UpdateJob(f.ctx, "owner", func(j *fleet.JobSpec) error { j.Suspended = true; return nil }); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the job's container gone", 60*time.Second, func() bool { return len(f.containers()) == 0 })
	testutil.Eventually(t, 30*time.Second, "the job's uid claim released once it left the node", func() (bool, string) {
		b, err := os.ReadFile(claim)
		return errors.Is(err, os.ErrNotExist), fmt.Sprintf("%q %v", b, err)
	})
	dir := filepath.Join(f.logDir, "node-1", "owner")
	var st syscall.Stat_t
	if err := syscall.Lstat(dir, &st); err != nil || st.Uid != 0 || st.Mode&0o777 != 0o700 {
		t.Errorf("the job's log directory %s after it left: uid %d mode %o (%v), want root's 0700 (taken back from uid %d)", dir, st.Uid, st.Mode&0o777, err, d.UID)
	}
}

// Package containers is the node agent's containerd runtime: it pulls a
// job's image, runs the job's hyperpodrun in a container of it (in its own
// containerd namespace, labelled with job, team, node and generation), with
// exactly the allocated accelerators (CDI, else device nodes), cgroup
// limits from the job's per-node request and host networking, and finds
// the containers again by label when the agent restarts (adoption).
//
// What the runner decides (when to start, drain, restart) stays in
// agent/node/jobrunner; this package only speaks containerd.
package containers

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	ctrcontainers "github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// Defaults.
const (
	// DefaultAddress is containerd's usual socket.
	DefaultAddress = "/run/containerd/containerd.sock"
	// DefaultNamespace is the containerd namespace of the jobs' containers.
	DefaultNamespace = "hyperpodrun"
)

// Labels on every container the agent makes.
const (
	LabelJob        = "hyperpodrun.io/job"
	LabelTeam       = "hyperpodrun.io/team"
	LabelNode       = "hyperpodrun.io/node"
	LabelGeneration = "hyperpodrun.io/generation"
	LabelLog        = "hyperpodrun.io/log"
	LabelRunDir     = "hyperpodrun.io/run-dir"
)

// Paths inside a job's container.
const (
	// HyperpodrunPath is where the agent's static hyperpodrun is mounted.
	HyperpodrunPath = "/.hyperpodrun/hyperpodrun"
	// RunDir holds the run's files: rdzv-endpoint, rdzv-conf and the
	// job's etcd password (read-only).
	RunDir = "/run/hyperpodrun"
	// LogDir is hyperpodrun's --log-dir, the host's <log-dir>/<job>.
	LogDir = "/var/log/hyperpodrun"
)

// Config says how to reach containerd and what the containers get.
type Config struct {
	// Address is containerd's socket (DefaultAddress).
	Address string
	// Namespace is the containerd namespace (DefaultNamespace).
	Namespace string
	// Snapshotter is containerd's snapshotter ("" is containerd's default).
	Snapshotter string
	// PlainHTTP lists registries (host[:port]) pulled over plain HTTP;
	// localhost and 127.0.0.1 always are.
	PlainHTTP []string
	// DockerConfig is a docker-style config.json with registry
	// credentials ("auths"); "" reads none.
	DockerConfig string
	// CDIDirs are where CDI specs live (default /etc/cdi and /var/run/cdi).
	CDIDirs []string
	// DevRoot is where device nodes live (default /dev).
	DevRoot string
	// PullProgress is how often a long pull logs its progress (10s).
	PullProgress time.Duration
	// AllowMountSources are the host directories whose contents jobs may
	// bind-mount (Spec.JobMounts; hyperpod-agent --allow-mount-source).
	// Empty: no job mount at all.
	AllowMountSources []string
	// NoFile is the containers' RLIMIT_NOFILE, soft and hard
	// (DefaultNoFile), clipped to the node's fs.nr_open.
	NoFile uint64
	Logger *slog.Logger
}

// Runtime runs containers through one containerd.
type Runtime struct {
	cfg    Config
	client *containerd.Client
	log    *slog.Logger
	pullMu sync.Mutex // one pull of an image at a time
}

// Connect dials containerd and checks that it answers within ctx.
func Connect(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.Address == "" {
		cfg.Address = DefaultAddress
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if len(cfg.CDIDirs) == 0 {
		cfg.CDIDirs = []string{"/etc/cdi", "/var/run/cdi"}
	}
	if cfg.DevRoot == "" {
		cfg.DevRoot = "/dev"
	}
	if cfg.PullProgress <= 0 {
		cfg.PullProgress = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	asked := cfg.NoFile != 0
	if !asked {
		cfg.NoFile = DefaultNoFile
	}
	if n := maxNoFile(); n > 0 && cfg.NoFile > n {
		level := slog.LevelDebug
		if asked {
			level = slog.LevelWarn
		}
		cfg.Logger.Log(ctx, level, "containers get a lower RLIMIT_NOFILE than asked: this node allows no more", "asked", cfg.NoFile, "given", n)
		cfg.NoFile = n
	}
	if _, err := os.Stat(cfg.Address); err != nil {
		return nil, fmt.Errorf("containerd socket %s: %w", cfg.Address, err)
	}
	client, err := containerd.New(cfg.Address, containerd.WithDefaultNamespace(cfg.Namespace), containerd.WithTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", cfg.Address, err)
	}
	vctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := client.Version(vctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("containerd at %s does not answer: %w", cfg.Address, err)
	}
	return &Runtime{cfg: cfg, client: client, log: cfg.Logger}, nil
}

// Close closes the connection; containers go on.
func (rt *Runtime) Close() error { return rt.client.Close() }

// Namespace is the containerd namespace of the containers.
func (rt *Runtime) Namespace() string { return rt.cfg.Namespace }

// Address is containerd's socket.
func (rt *Runtime) Address() string { return rt.cfg.Address }

// containerdCtx puts the namespace in ctx.
func containerdCtx(ctx context.Context, ns string) context.Context {
	return namespaces.WithNamespace(ctx, ns)
}

// ErrImageNotFound marks a pull of an image that does not exist: the job's
// spec is wrong, not the node.
var ErrImageNotFound = errors.New("image not found")

// ErrDevice marks accelerators that cannot reach the container (a missing
// CDI device): the job fails on the node with the reason.
var ErrDevice = errors.New("device injection")

// Pull makes sure ref is present and unpacked, pulling it when it is not.
// A long pull logs its progress. A missing image or tag wraps
// ErrImageNotFound.
func (rt *Runtime) Pull(ctx context.Context, ref string) (containerd.Image, error) {
	ctx = containerdCtx(ctx, rt.cfg.Namespace)
	rt.pullMu.Lock()
	defer rt.pullMu.Unlock()
	if img, err := rt.client.GetImage(ctx, ref); err == nil {
		if ok, err := img.IsUnpacked(ctx, rt.cfg.Snapshotter); err == nil && ok {
			return img, nil
		}
	}
	start := time.Now()
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(rt.cfg.PullProgress)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				var have, total int64
				if sts, err := rt.client.ContentStore().ListStatuses(ctx); err == nil {
					for _, s := range sts {
						have += s.Offset
						total += s.Total
					}
				}
				rt.log.Info("pulling image", "image", ref, "elapsed", time.Since(start).Round(time.Second), "bytes", have, "of", total)
			}
		}
	}()
	opts := []containerd.RemoteOpt{containerd.WithPullUnpack, containerd.WithResolver(rt.resolver())}
	if rt.cfg.Snapshotter != "" {
		opts = append(opts, containerd.WithPullSnapshotter(rt.cfg.Snapshotter))
	}
	img, err := rt.client.Pull(ctx, ref, opts...)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("pull %s: %w: %v (check run.image: the registry has no such repository or tag)", ref, ErrImageNotFound, err)
		}
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	rt.log.Info("pulled image", "image", ref, "took", time.Since(start).Round(time.Millisecond))
	return img, nil
}

// resolver resolves and fetches from registries: plain HTTP for loopback
// and Config.PlainHTTP, credentials from Config.DockerConfig.
func (rt *Runtime) resolver() remotes.Resolver {
	return docker.NewResolver(docker.ResolverOptions{Hosts: rt.hosts()})
}

// hosts configures each registry host: plain HTTP or TLS, and credentials.
func (rt *Runtime) hosts() docker.RegistryHosts {
	plain := func(host string) (bool, error) {
		if ok, _ := docker.MatchLocalhost(host); ok {
			return true, nil
		}
		for _, h := range rt.cfg.PlainHTTP {
			if h == host {
				return true, nil
			}
		}
		return false, nil
	}
	creds := func(host string) (string, string, error) {
		if rt.cfg.DockerConfig == "" {
			return "", "", nil
		}
		return DockerCredentials(rt.cfg.DockerConfig, host)
	}
	return docker.ConfigureDefaultRegistries(
		docker.WithPlainHTTP(plain),
		docker.WithAuthorizer(docker.NewDockerAuthorizer(docker.WithAuthCreds(creds))),
	)
}

// DockerCredentials reads a registry's user and password from a
// docker-style config.json ({"auths": {"<host>": {"auth": base64(user:pass)}}},
// or "username"/"password"). No entry: no credentials.
func DockerCredentials(path, host string) (string, string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("registry credentials: %w", err)
	}
	var cf struct {
		Auths map[string]struct {
			Auth     string `json:"auth"`
			Username string `json:"username"`
			Password string `json:"password"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(b, &cf); err != nil {
		return "", "", fmt.Errorf("registry credentials %s: not a docker config.json: %w", path, err)
	}
	for _, key := range []string{host, "https://" + host, "http://" + host} {
		a, ok := cf.Auths[key]
		if !ok {
			continue
		}
		if a.Auth == "" {
			return a.Username, a.Password, nil
		}
		raw, err := base64.StdEncoding.DecodeString(a.Auth)
		if err != nil {
			return "", "", fmt.Errorf("registry credentials %s: auths[%q].auth is not base64: %w", path, key, err)
		}
		user, pass, ok := strings.Cut(string(raw), ":")
		if !ok {
			return "", "", fmt.Errorf("registry credentials %s: auths[%q].auth is not base64 of user:password", path, key)
		}
		return user, pass, nil
	}
	return "", "", nil
}

// Mount is a host path bind-mounted into the container.
type Mount struct {
	Source, Target string
	ReadOnly       bool
}

// Spec is one container to run.
type Spec struct {
	Job, Team, Node string
	Generation      int64
	Image           string
	// Args is the whole command line (hyperpodrun and its arguments).
	Args []string
	Env  []string
	// Mounts are the agent's own bind mounts (hyperpodrun, the run dir,
	// the log dir), mounted as they are.
	Mounts []Mount
	// JobMounts are the mounts the job's spec asks for (run.mounts): each
	// must pass CheckMount against Config.AllowMountSources, or Start
	// refuses the container (ErrRefused) before it pulls or creates
	// anything.
	JobMounts []Mount
	// Protected are the agent's own directories (the runs' directories,
	// the jobs' logs): no job mount may be within one or hold one.
	Protected []string
	// ShmSize is /dev/shm's size in bytes (0: containerd's 64 MiB).
	ShmSize int64
	// CPUs and MemoryBytes limit the container's cgroup (0: no limit).
	CPUs        int
	MemoryBytes int64
	// Devices are the accelerators (PlanDevices).
	Devices Plan
	// UID and GID run the container as this user (the job's identity);
	// nil: the image's user, which Start refuses when it is root unless
	// AllowRoot.
	UID, GID *uint32
	// AllowRoot lets a container without UID run as an image user that is
	// root (hyperpod-agent --allow-root-jobs); it still gets no
	// capability.
	AllowRoot bool
	// LogPath is the host file the container's stdout and stderr go to.
	LogPath string
	// RunDir is the run's host directory (files the container reads);
	// chowned to the container's user before it starts.
	RunDir string
	// CDI are the node's CDI specs, which inject Devices.CDI.
	CDI *CDISpecs
}

// Task is one container of a job and its running (or ended) task.
type Task struct {
	rt        *Runtime
	ID        string
	Job, Node string
	// Generation is the desired record's generation it was started for.
	Generation int64
	// LogPath is the host file of its output.
	LogPath string
	// RunDir is the run's host directory.
	RunDir string
	// UID is the user its processes run as (its OCI spec's), known for
	// an adopted container: a job's own uid is claimed again from it.
	UID       uint32
	container containerd.Container
	task      containerd.Task // nil: no task (it was never started or is gone)
	exit      <-chan containerd.ExitStatus
}

var unsafeID = regexp.MustCompile(`[^A-Za-z0-9]+`)

// containerID is a unique containerd id for a run of job on node.
func containerID(job, node string) string {
	id := strings.Trim(unsafeID.ReplaceAllString(job, "-"), "-") + "." + strings.Trim(unsafeID.ReplaceAllString(node, "-"), "-") + "." + strconv.FormatInt(time.Now().UnixNano(), 36)
	if len(id) > 76 {
		id = id[len(id)-76:]
		id = strings.TrimLeft(id, "-.")
	}
	return id
}

// specOpts lists the OCI spec options of s; the image's own config
// comes first, the confinement (confine.go) last. jobMounts are s.JobMounts
// as CheckMount resolved them.
func (rt *Runtime) specOpts(img containerd.Image, s Spec, jobMounts []Mount, reg *cdi.Cache) []oci.SpecOpts {
	opts := []oci.SpecOpts{
		oci.WithImageConfig(img),
		oci.WithProcessArgs(s.Args...),
		oci.WithEnv(append(append([]string{}, s.Env...), s.Devices.Env...)),
		// Host networking: NCCL over EFA/InfiniBand and the rendezvous
		// see the node's own interfaces (docs/containers.md).
		oci.WithHostNamespace(specs.NetworkNamespace),
		oci.WithHostHostsFile,
		oci.WithHostResolvconf,
	}
	var mounts []specs.Mount
	for _, m := range append(append([]Mount{}, s.Mounts...), jobMounts...) {
		o := []string{"rbind", "rprivate"}
		if m.ReadOnly {
			o = append(o, "ro")
		} else {
			o = append(o, "rw")
		}
		mounts = append(mounts, specs.Mount{Type: "bind", Source: m.Source, Destination: m.Target, Options: o})
	}
	opts = append(opts, oci.WithMounts(mounts))
	if s.ShmSize > 0 {
		opts = append(opts, oci.WithDevShmSize(s.ShmSize/1024))
	}
	if s.MemoryBytes > 0 {
		opts = append(opts, oci.WithMemoryLimit(uint64(s.MemoryBytes)))
	}
	if s.CPUs > 0 {
		const period = 100000
		opts = append(opts, oci.WithCPUCFS(int64(s.CPUs)*period, period))
	}
	if s.UID != nil {
		opts = append(opts, oci.WithUIDGID(*s.UID, *s.GID))
	} else if !s.AllowRoot {
		opts = append(opts, refuseRoot(s.Image))
	}
	for _, n := range s.Devices.Nodes {
		opts = append(opts, oci.WithLinuxDevice(n, "rwm"))
	}
	if len(s.Devices.CDI) > 0 {
		names := s.Devices.CDI
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *ctrcontainers.Container, sp *oci.Spec) error {
			if _, err := reg.InjectDevices(sp, names...); err != nil {
				return fmt.Errorf("%w: inject CDI devices %s: %v", ErrDevice, strings.Join(names, ","), err)
			}
			return nil
		})
	}
	return append(opts, withConfinement(rt.cfg.NoFile))
}

// jobMounts checks the job's mounts (CheckMount) and returns them with
// their sources resolved.
func (rt *Runtime) jobMounts(s Spec) ([]Mount, error) {
	protected := append([]string{filepath.Dir(rt.cfg.Address)}, s.Protected...)
	var out []Mount
	for _, m := range s.JobMounts {
		src, err := CheckMount(m.Source, m.Target, rt.cfg.AllowMountSources, protected, filepath.EvalSymlinks)
		if err != nil {
			return nil, err
		}
		m.Source = src
		out = append(out, m)
	}
	return out, nil
}

// CDI loads the node's CDI specs (Config.CDIDirs).
func (rt *Runtime) CDI() (*CDISpecs, error) {
	cache, err := cdi.NewCache(cdi.WithSpecDirs(rt.cfg.CDIDirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("%w: read CDI specs in %s: %v", ErrDevice, strings.Join(rt.cfg.CDIDirs, ", "), err)
	}
	return &CDISpecs{cache: cache}, nil
}

// CDISpecs are the CDI specs found on the node (a CDIRegistry).
type CDISpecs struct{ cache *cdi.Cache }

// HasDevice implements CDIRegistry.
func (c *CDISpecs) HasDevice(name string) bool { return c.cache.GetDevice(name) != nil }

// HasKind implements CDIRegistry.
func (c *CDISpecs) HasKind(kind string) bool {
	for _, d := range c.cache.ListDevices() {
		if strings.HasPrefix(d, kind+"=") {
			return true
		}
	}
	return false
}

// snapshotter is the snapshotter's name (containerd's default when
// Config.Snapshotter is "").
func (rt *Runtime) snapshotter() string {
	if rt.cfg.Snapshotter != "" {
		return rt.cfg.Snapshotter
	}
	return defaults.DefaultSnapshotter
}

// DevRoot is where the device nodes live.
func (rt *Runtime) DevRoot() string { return rt.cfg.DevRoot }

// Start pulls s.Image if need be, creates the container and starts its
// task. On error nothing of it is left.
func (rt *Runtime) Start(ctx context.Context, s Spec) (*Task, error) {
	// A mount the node does not allow refuses the container before
	// anything is pulled or made.
	jobMounts, err := rt.jobMounts(s)
	if err != nil {
		return nil, err
	}
	img, err := rt.Pull(ctx, s.Image)
	if err != nil {
		return nil, err
	}
	ctx = containerdCtx(ctx, rt.cfg.Namespace)
	id := containerID(s.Job, s.Node)
	labels := map[string]string{
		LabelJob: s.Job, LabelTeam: s.Team, LabelNode: s.Node,
		LabelGeneration: strconv.FormatInt(s.Generation, 10),
		LabelLog:        s.LogPath, LabelRunDir: s.RunDir,
	}
	var cache *cdi.Cache
	if s.CDI != nil {
		cache = s.CDI.cache
	} else if len(s.Devices.CDI) > 0 {
		return nil, fmt.Errorf("%w: CDI devices %s without the node's CDI specs", ErrDevice, strings.Join(s.Devices.CDI, ","))
	}
	copts := []containerd.NewContainerOpts{
		containerd.WithImage(img),
		containerd.WithContainerLabels(labels),
	}
	if rt.cfg.Snapshotter != "" {
		copts = append(copts, containerd.WithSnapshotter(rt.cfg.Snapshotter))
	}
	copts = append(copts,
		containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(rt.specOpts(img, s, jobMounts, cache)...),
	)
	c, err := rt.client.NewContainer(ctx, id, copts...)
	if err != nil {
		// A spec option that fails (a refusal, a CDI device) fails after
		// the snapshot was prepared: it goes too.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		if rerr := rt.client.SnapshotService(rt.snapshotter()).Remove(rctx, id); rerr != nil && !errdefs.IsNotFound(rerr) {
			rt.log.Warn("cannot remove the snapshot of a container that was not made", "snapshot", id, "err", rerr)
		}
		cancel()
		if errors.Is(err, ErrDevice) || errors.Is(err, ErrRefused) {
			return nil, err
		}
		return nil, fmt.Errorf("create container for %s: %w", s.Image, err)
	}
	t := &Task{rt: rt, ID: id, Job: s.Job, Node: s.Node, Generation: s.Generation, LogPath: s.LogPath, RunDir: s.RunDir, container: c}
	fail := func(err error) (*Task, error) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		t.remove(dctx)
		return nil, err
	}
	// The run's files become the container user's: the password file is
	// 0600 and hyperpodrun refuses a looser one.
	if s.RunDir != "" {
		sp, err := c.Spec(ctx)
		if err != nil {
			return fail(fmt.Errorf("read the container's spec: %w", err))
		}
		uid, gid := int(sp.Process.User.UID), int(sp.Process.User.GID)
		if err := giveRunDir(s.RunDir, uid, gid); err != nil {
			return fail(fmt.Errorf("give the run's files to the container's user %d: %w", uid, err))
		}
	}
	if err := os.MkdirAll(filepath.Dir(s.LogPath), 0o755); err != nil {
		return fail(fmt.Errorf("make the container's log directory: %w", err))
	}
	task, err := c.NewTask(ctx, cio.LogFile(s.LogPath))
	if err != nil {
		return fail(fmt.Errorf("create the container's task: %w", err))
	}
	t.task = task
	// Wait before Start: an exit is never missed.
	if t.exit, err = task.Wait(context.WithoutCancel(ctx)); err != nil {
		return fail(fmt.Errorf("wait on the container's task: %w", err))
	}
	if err := task.Start(ctx); err != nil {
		return fail(fmt.Errorf("start the container's task: %w", err))
	}
	return t, nil
}

// giveRunDir gives the run's directory and the files the agent wrote in it
// (one level: the agent writes no subdirectory) to uid:gid. It never
// follows a symbolic link (os.Root, Lchown) and gives the directory itself
// last, so nothing of uid's can change it while it is walked.
func giveRunDir(dir string, uid, gid int) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	f, err := root.Open(".")
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := root.Lchown(n, uid, gid); err != nil {
			return err
		}
	}
	return root.Lchown(".", uid, gid)
}

// Adopt finds the containers this node's agent made (by label) and returns
// them with their tasks, so a restarted agent goes on with them instead of
// starting duplicates. A container whose task is gone (or never started)
// comes back with an exit already reported.
func (rt *Runtime) Adopt(ctx context.Context, node string) ([]*Task, error) {
	ctx = containerdCtx(ctx, rt.cfg.Namespace)
	cs, err := rt.client.Containers(ctx, fmt.Sprintf("labels.%q==%q", LabelNode, node))
	if err != nil {
		return nil, fmt.Errorf("list the node's containers: %w", err)
	}
	var out []*Task
	for _, c := range cs {
		labels, err := c.Labels(ctx)
		if err != nil {
			return nil, fmt.Errorf("read container %s's labels: %w", c.ID(), err)
		}
		gen, _ := strconv.ParseInt(labels[LabelGeneration], 10, 64)
		t := &Task{rt: rt, ID: c.ID(), Job: labels[LabelJob], Node: node, Generation: gen, LogPath: labels[LabelLog], RunDir: labels[LabelRunDir], container: c}
		if sp, err := c.Spec(ctx); err != nil {
			rt.log.Warn("cannot read an adopted container's spec: its user is unknown", "container", c.ID(), "err", err)
		} else if sp.Process != nil {
			t.UID = sp.Process.User.UID
		}
		task, err := c.Task(ctx, nil)
		switch {
		case errdefs.IsNotFound(err):
			ch := make(chan containerd.ExitStatus, 1)
			ch <- *containerd.NewExitStatus(255, time.Now(), errors.New("the container has no task"))
			t.exit = ch
		case err != nil:
			return nil, fmt.Errorf("load container %s's task: %w", c.ID(), err)
		default:
			t.task = task
			if t.exit, err = task.Wait(context.WithoutCancel(ctx)); err != nil {
				return nil, fmt.Errorf("wait on container %s's task: %w", c.ID(), err)
			}
		}
		out = append(out, t)
	}
	return out, nil
}

// RemoveImage deletes an image and lets containerd collect its content
// and snapshots (a later Pull fetches it again).
func (rt *Runtime) RemoveImage(ctx context.Context, ref string) error {
	ctx = containerdCtx(ctx, rt.cfg.Namespace)
	err := rt.client.ImageService().Delete(ctx, ref, images.SynchronousDelete())
	if err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove image %s: %w", ref, err)
	}
	return nil
}

// Pid is the container's init process on the host (0 without a task).
func (t *Task) Pid() uint32 {
	if t.task == nil {
		return 0
	}
	return t.task.Pid()
}

// Signal sends sig to the container's hyperpodrun (its init process).
func (t *Task) Signal(sig syscall.Signal) error {
	if t.task == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(containerdCtx(context.Background(), t.rt.cfg.Namespace), 10*time.Second)
	defer cancel()
	err := t.task.Kill(ctx, sig)
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

// Kill SIGKILLs every process of the container.
func (t *Task) Kill() error {
	if t.task == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(containerdCtx(context.Background(), t.rt.cfg.Namespace), 10*time.Second)
	defer cancel()
	err := t.task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll)
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

// Exit is how a container's task ended.
type Exit struct {
	Code uint32
	Err  error
}

// Wait blocks until the container's task exits (or ctx ends) and returns
// its exit status.
func (t *Task) Wait(ctx context.Context) (Exit, error) {
	select {
	case st := <-t.exit:
		code, _, err := st.Result()
		return Exit{Code: code, Err: err}, nil
	case <-ctx.Done():
		return Exit{}, ctx.Err()
	}
}

// Remove deletes the task, the container and its snapshot.
func (t *Task) Remove(ctx context.Context) error {
	return t.remove(containerdCtx(ctx, t.rt.cfg.Namespace))
}

func (t *Task) remove(ctx context.Context) error {
	var errs []error
	if t.task != nil {
		if _, err := t.task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete task: %w", err))
		}
	} else if task, err := t.container.Task(ctx, nil); err == nil {
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete task: %w", err))
		}
	}
	if err := t.container.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete container: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove container %s: %w", t.ID, err)
	}
	return nil
}

// List returns the ids of the containers in the namespace with the label
// node (every node's when node is "").
func (rt *Runtime) List(ctx context.Context, node string) ([]string, error) {
	ctx = containerdCtx(ctx, rt.cfg.Namespace)
	var filters []string
	if node != "" {
		filters = append(filters, fmt.Sprintf("labels.%q==%q", LabelNode, node))
	}
	cs, err := rt.client.Containers(ctx, filters...)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.ID())
	}
	return ids, nil
}

// Follow copies the lines appended to path from offset on to w, each
// prefixed, until stop is closed; then it copies what is left and returns.
// The shim writes the file from a pipe, so the last lines may land just
// after the task's exit is reported: after stop, Follow reads on until the
// file has not grown for 300 ms (at most 3 s). abort ends it at once (the
// agent stops; the container goes on).
func Follow(path string, offset int64, w io.Writer, prefix string, stop, abort <-chan struct{}) {
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	var rd *bufio.Reader
	var partial string
	var stopped, quiet time.Time
	for {
		if f == nil {
			if g, err := os.Open(path); err == nil {
				if _, err := g.Seek(offset, io.SeekStart); err == nil {
					f, rd = g, bufio.NewReaderSize(g, 64<<10)
				} else {
					g.Close()
				}
			}
		}
		grew := false
		if rd != nil {
			for {
				line, err := rd.ReadString('\n')
				if line != "" {
					grew = true
				}
				if err != nil {
					partial += line
					break
				}
				fmt.Fprintln(w, prefix+strings.TrimSuffix(partial+line, "\n"))
				partial = ""
			}
		}
		now := time.Now()
		if !stopped.IsZero() {
			if grew {
				quiet = now
			}
			select {
			case <-abort:
				return
			default:
			}
			if now.Sub(quiet) >= 300*time.Millisecond || now.Sub(stopped) >= 3*time.Second {
				if partial != "" {
					fmt.Fprintln(w, prefix+partial)
				}
				return
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		select {
		case <-abort:
			return
		case <-stop:
			stopped, quiet = now, now
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Size is the size of the file at path (0 when it does not exist).
func Size(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

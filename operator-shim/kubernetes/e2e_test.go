package kubernetes_test

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/kubetest"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	kube "github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/podsup"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// kubelet plays the kubelet's part, since none can run here: for every
// pod pinned to a node it "runs the container": the pod supervisor
// (package podsup, the real one) with the pod's --job and --node, whose
// child stands in for hyperpodrun: a shell that exits 0 on SIGUSR2 (as a
// drained hyperpodrun does once its workers checkpointed) and 143 on
// SIGTERM. It reports the container's state and exit in the pod's status
// as a kubelet would, passes a graceful deletion on as SIGTERM, and removes
// the pod (grace period 0) once its container is gone.
type kubelet struct {
	t    *testing.T
	cs   kubernetes.Interface
	etcd *clientv3.Client
	dir  string

	mu      sync.Mutex
	runs    map[types.UID]*podRun
	overlap []string // a pod started on a node while another job's pod ran there
	// killed lists pods deleted while their container still ran.
	killed []string
	wg     sync.WaitGroup
	// hyperpodrun, when set, is a built hyperpodrun: the kubelet runs the
	// pod's own command line after the supervisor's "--" (the tools'
	// directory mapped to it) instead of the shell stand-in.
	hyperpodrun string
	// exits are the containers' ends: pod -> "code message".
	exits map[string]string
}

type podRun struct {
	name, node, job string
	sig             chan os.Signal
	termed          bool
}

// child stands in for hyperpodrun.
const child = `trap 'exit 0' USR2; trap 'exit 143' TERM; while :; do sleep 0.1; done`

func newKubelet(t *testing.T, cs kubernetes.Interface, etcd *clientv3.Client) *kubelet {
	return &kubelet{t: t, cs: cs, etcd: etcd, dir: t.TempDir(), runs: map[types.UID]*podRun{}, exits: map[string]string{}}
}

func (k *kubelet) run(ctx context.Context) {
	f := informers.NewSharedInformerFactoryWithOptions(k.cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = kube.JobLabel }))
	inf := f.Core().V1().Pods().Informer()
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { k.sync(ctx, o.(*corev1.Pod)) },
		UpdateFunc: func(_, o any) { k.sync(ctx, o.(*corev1.Pod)) },
	})
	f.Start(ctx.Done())
	<-ctx.Done()
	f.Shutdown()
}

func flag(cmd []string, name string) string {
	for _, a := range cmd {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

func (k *kubelet) sync(ctx context.Context, p *corev1.Pod) {
	if ctx.Err() != nil || p.Spec.NodeName == "" {
		return
	}
	k.mu.Lock()
	r := k.runs[p.UID]
	if p.DeletionTimestamp != nil {
		switch {
		case r != nil && !r.termed:
			r.termed = true
			k.killed = append(k.killed, p.Name)
			k.mu.Unlock()
			r.sig <- syscall.SIGTERM // the container's exit removes the pod
		case r == nil:
			k.mu.Unlock()
			k.remove(p)
		default:
			k.mu.Unlock()
		}
		return
	}
	if r != nil || p.Status.Phase != corev1.PodPending && p.Status.Phase != "" {
		k.mu.Unlock()
		return
	}
	for _, o := range k.runs {
		if o.node == p.Spec.NodeName {
			k.overlap = append(k.overlap, fmt.Sprintf("%s started on %s while %s ran there", p.Name, o.node, o.name))
		}
	}
	cmd := p.Spec.Containers[0].Command
	r = &podRun{name: p.Name, node: p.Spec.NodeName, job: flag(cmd, "job"), sig: make(chan os.Signal, 2)}
	k.runs[p.UID] = r
	k.mu.Unlock()
	trainer := p.Spec.Containers[0].Name
	k.setStatus(ctx, p, corev1.PodRunning, corev1.ContainerStatus{Name: trainer, Ready: true, Started: ptr(true),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}})
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		term := filepath.Join(k.dir, string(p.UID))
		argv, env := []string{"/bin/sh", "-c", child}, []string(nil)
		var out *syncBuf
		if k.hyperpodrun != "" {
			argv, env = k.realCommand(p)
			out = &syncBuf{}
		}
		cfg := podsup.Config{Etcd: k.etcd, Job: r.job, Node: flag(cmd, "node"), Argv: argv, Env: env,
			TerminationLog: term, Signals: r.sig, Logger: slog.New(slog.NewTextHandler(discard{}, nil))}
		code, err := k.supervise(cfg, out)
		if err != nil {
			k.t.Errorf("pod %s: %v", p.Name, err)
		}
		msg, _ := os.ReadFile(term)
		phase := corev1.PodSucceeded
		if code != 0 {
			phase = corev1.PodFailed
		}
		k.setStatus(context.Background(), p, phase, corev1.ContainerStatus{Name: trainer,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), Message: string(msg), FinishedAt: metav1.Now()}}})
		k.mu.Lock()
		delete(k.runs, p.UID)
		k.exits[p.Name] = fmt.Sprintf("%d %s", code, msg)
		if out != nil && code != 0 && !r.termed {
			k.t.Logf("pod %s exited %d:\n%s", p.Name, code, out.String())
		}
		k.mu.Unlock()
		if cur, err := k.cs.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{}); err == nil && cur.DeletionTimestamp != nil {
			k.remove(cur)
		}
	}()
}

// realCommand is the pod's hyperpodrun command line with the tools'
// directory mapped to the built binary, and the container's environment.
func (k *kubelet) realCommand(p *corev1.Pod) ([]string, []string) {
	c := p.Spec.Containers[0]
	i := slices.Index(c.Command, "--")
	argv := slices.Clone(c.Command[i+1:])
	argv[0] = k.hyperpodrun
	// A short TMPDIR: hyperpodrun's control socket lives under it, and a
	// unix socket path holds at most 107 bytes.
	tmp, err := os.MkdirTemp("", "kp")
	if err != nil {
		k.t.Error(err)
	}
	k.t.Cleanup(func() { os.RemoveAll(tmp) })
	env := []string{"PATH=/usr/bin:/bin", "TMPDIR=" + tmp, "HOME=" + tmp}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	return argv, env
}

// supervise runs the pod supervisor with its child's output in out (nil:
// the test's).
func (k *kubelet) supervise(cfg podsup.Config, out *syncBuf) (int, error) {
	if out == nil {
		return podsup.Run(context.Background(), cfg)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 1, err
	}
	done := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			out.Write(buf[:n])
			if err != nil {
				close(done)
				return
			}
		}
	}()
	cfg.Stdout = w
	code, err := podsup.Run(context.Background(), cfg)
	w.Close()
	<-done
	r.Close()
	return code, err
}

// setStatus writes the pod's phase and trainer status as the kubelet does.
func (k *kubelet) setStatus(ctx context.Context, p *corev1.Pod, phase corev1.PodPhase, cs corev1.ContainerStatus) {
	for range 20 {
		cur, err := k.cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return // gone
		}
		cur.Status.Phase = phase
		cur.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
		if _, err = k.cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err == nil || !apierrors.IsConflict(err) {
			return
		}
	}
}

func (k *kubelet) remove(p *corev1.Pod) {
	zero := int64(0)
	k.cs.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}})
}

// stop ends every container still running (as a node shutting down) and
// waits for each to be gone.
func (k *kubelet) stop(t *testing.T) {
	k.mu.Lock()
	for _, r := range k.runs {
		if !r.termed {
			r.termed = true
			r.sig <- syscall.SIGTERM
		}
	}
	k.mu.Unlock()
	done := make(chan struct{})
	go func() { k.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Error("containers still running 30s after the kubelet stopped them")
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func ptr[T any](v T) *T { return &v }

func gpuNode(t *testing.T, cs kubernetes.Interface, name string) {
	ctx := ctxT(t, 30*time.Second)
	n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kube.InstanceTypeLabel: "p5.48xlarge"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status = corev1.NodeStatus{
		Capacity:    corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8"), corev1.ResourceCPU: resource.MustParse("192"), corev1.ResourceMemory: resource.MustParse("2Ti")},
		Allocatable: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8"), corev1.ResourceCPU: resource.MustParse("190"), corev1.ResourceMemory: resource.MustParse("1900Gi")},
		Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
	}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func elasticJob(name, team, class string, minR, maxR int32) *v1alpha1.ElasticJob {
	return &v1alpha1.ElasticJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"}, Spec: v1alpha1.ElasticJobSpec{
		Team: team, PriorityClassName: class, Flavor: "nvidia-h100-80gb",
		ElasticPolicy: v1alpha1.ElasticPolicy{MinReplicas: minR, MaxReplicas: maxR, GracefulShutdownTimeoutInSeconds: 20},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "trainer", Image: "registry.example.com/ml/train:v1", Command: []string{"python3", "train.py"},
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}},
		}}}},
	}}
}

// livePods lists a job's pods that are not being deleted, by node.
func livePods(t *testing.T, cs kubernetes.Interface, job string) (map[string]*corev1.Pod, int) {
	ps, err := cs.CoreV1().Pods("ml").List(context.Background(), metav1.ListOptions{LabelSelector: kube.JobLabel + "=" + job})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*corev1.Pod{}
	for i := range ps.Items {
		p := &ps.Items[i]
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			out[p.Spec.NodeName] = p
		}
	}
	return out, len(ps.Items)
}

func eventReasons(t *testing.T, cs kubernetes.Interface, obj string) []string {
	evs, err := cs.CoreV1().Events("ml").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + obj})
	if err != nil {
		t.Fatal(err)
	}
	var rs []string
	for _, e := range evs.Items {
		rs = append(rs, e.Reason)
	}
	return rs
}

func eventsText(t *testing.T, cs kubernetes.Interface, obj string) string {
	evs, _ := cs.CoreV1().Events("ml").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + obj})
	var b strings.Builder
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "%s %s: %s\n", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// TestElasticJobEndToEnd: two teams and an ElasticJob of 1..4 nodes on 4
// Kubernetes Nodes, with the real coordinator (in process) and the
// controller (with its least-privilege ServiceAccount) on the same etcd as
// the API server. A higher-priority ElasticJob of the other team takes its
// quota back: the first shrinks (the leaving pods drain, exit 0, and only
// then are deleted) and grows back when the other job is deleted. A pod
// deleted by hand is a node failure: a new pod joins on its node. The test
// plays the kubelet (type kubelet), since none runs here.
func TestElasticJobEndToEnd(t *testing.T) {
	e := startEnv(t, envOptions{})
	ctx, cs, cl, st, k := e.ctx, e.cs, e.cl, e.st, e.k
	bg := e.bg

	// Track the job's status over time.
	var hmu sync.Mutex
	var history []string
	seen := func() []string { hmu.Lock(); defer hmu.Unlock(); return slices.Clone(history) }
	bg(func(ctx context.Context) {
		last := ""
		for ctx.Err() == nil {
			if j, err := cl.ElasticJobs("ml").Get(ctx, "sweep", metav1.GetOptions{}); err == nil {
				cur := fmt.Sprintf("%s %d/%d %s %s", j.Status.Phase, j.Status.CurrentReplicas, j.Status.DesiredReplicas, j.Status.Decision, j.Status.Reason)
				if cur != last {
					hmu.Lock()
					history = append(history, cur)
					hmu.Unlock()
					last = cur
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	// 1. The elastic job of research grows into prod's idle quota: 4 pods.
	if _, err := cl.ElasticJobs("ml").Create(ctx, elasticJob("sweep", "research", "low", 1, 4), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	status := e.status
	waitFor(t, 2*time.Minute, "sweep runs on 4 nodes", func() (bool, string) {
		pods, _ := livePods(t, cs, "sweep")
		s := status("sweep")
		return len(pods) == 4 && s.Phase == v1alpha1.PhaseRunning && s.CurrentReplicas == 4 && s.DesiredReplicas == 4, fmt.Sprintf("%d pods, status %+v", len(pods), s)
	})
	if spec, err := st.Job(ctx, "sweep"); err != nil || spec.Team != "research" || spec.MaxNodes != 4 || !spec.Elastic {
		t.Fatalf("the job spec in etcd: %+v %v", spec, err)
	}
	before, _ := livePods(t, cs, "sweep")

	// 2. prod's high-priority job takes its quota back: sweep shrinks to 2;
	// the leaving pods drain (exit 0, "drained") and only then go.
	if _, err := cl.ElasticJobs("ml").Create(ctx, elasticJob("serve", "prod", "high", 2, 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "sweep shrunk to 2 for serve, serve on the 2 freed nodes", func() (bool, string) {
		sw, _ := livePods(t, cs, "sweep")
		se, _ := livePods(t, cs, "serve")
		s := status("sweep")
		return len(sw) == 2 && len(se) == 2 && s.DesiredReplicas == 2 && s.CurrentReplicas == 2 &&
				slices.Contains(s.ShrunkFor, "serve") && status("serve").CurrentReplicas == 2,
			fmt.Sprintf("sweep %d pods %+v; serve %d pods", len(sw), s, len(se))
	})
	sw, _ := livePods(t, cs, "sweep")
	se, _ := livePods(t, cs, "serve")
	for n := range se {
		if sw[n] != nil {
			t.Fatalf("node %s runs both jobs", n)
		}
		if before[n] == nil {
			t.Fatalf("serve runs on %s, which sweep did not hold", n)
		}
	}
	reasons := eventReasons(t, cs, "sweep")
	for _, r := range []string{"Submitted", kube.ReasonPodCreated, "Shrunk", kube.ReasonDraining, kube.ReasonDrained} {
		if !slices.Contains(reasons, r) {
			t.Errorf("sweep has no %s event:\n%s", r, eventsText(t, cs, "sweep"))
		}
	}
	if txt := eventsText(t, cs, "sweep"); !strings.Contains(txt, "exited 0 after the workers checkpointed") || !strings.Contains(txt, "for serve") {
		t.Errorf("no drained-pod event:\n%s", txt)
	}

	// 3. A pod deleted by hand is a node failure: a new pod joins on its node.
	victim := sw[slices.Sorted(func(yield func(string) bool) {
		for n := range sw {
			if !yield(n) {
				return
			}
		}
	})[0]]
	if err := cs.CoreV1().Pods("ml").Delete(ctx, victim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "a new sweep pod on "+victim.Spec.NodeName, func() (bool, string) {
		pods, _ := livePods(t, cs, "sweep")
		p := pods[victim.Spec.NodeName]
		return p != nil && p.UID != victim.UID && len(pods) == 2 && status("sweep").CurrentReplicas == 2, fmt.Sprintf("%d pods", len(pods))
	})
	if txt := eventsText(t, cs, "sweep"); !strings.Contains(txt, "deleted by someone else: a node failure") {
		t.Errorf("no node-failure event:\n%s", txt)
	}

	// 4. serve is deleted: its pods drain and go, the ElasticJob goes with
	// its finalizer, and sweep grows back to 4.
	if err := cl.ElasticJobs("ml").Delete(ctx, "serve", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "sweep back on 4 nodes, serve gone", func() (bool, string) {
		pods, _ := livePods(t, cs, "sweep")
		_, all := livePods(t, cs, "serve")
		_, err := cl.ElasticJobs("ml").Get(ctx, "serve", metav1.GetOptions{})
		s := status("sweep")
		return len(pods) == 4 && all == 0 && apierrors.IsNotFound(err) && s.CurrentReplicas == 4 && s.DesiredReplicas == 4,
			fmt.Sprintf("sweep %d pods %+v, serve pods %d, get serve: %v", len(pods), s, all, err)
	})
	if _, err := st.Job(ctx, "serve"); err == nil {
		t.Error("serve's spec is still in etcd")
	}
	if txt := eventsText(t, cs, "sweep"); !strings.Contains(txt, "Grown") && !strings.Contains(txt, "FairShare") {
		t.Errorf("no growth event:\n%s", txt)
	}

	// The status went 4 -> 2 (reclaimed for serve) -> 4 (the history's
	// poller reads it every 50 ms: it may not have seen 4/4 yet).
	waitFor(t, 10*time.Second, "the status history reaches 4/4", func() (bool, string) {
		h := seen()
		return len(h) > 0 && strings.HasPrefix(h[len(h)-1], "Running 4/4"), fmt.Sprintf("%q", h)
	})
	h := seen()
	i4 := slices.IndexFunc(h, func(s string) bool { return strings.HasPrefix(s, "Running 4/4") })
	i2 := slices.IndexFunc(h, func(s string) bool {
		return strings.HasPrefix(s, "Running ") && strings.Contains(s, "/2 Shrunk Reclaim")
	})
	last := h[len(h)-1]
	if i4 < 0 || i2 < i4 || !strings.HasPrefix(last, "Running 4/4") {
		t.Errorf("status history: %q", h)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.overlap) > 0 {
		t.Errorf("pods of two jobs ran on one node at once: %q", k.overlap)
	}
	// Only the pod deleted by hand was deleted while it ran: every other
	// pod that left was drained first.
	if len(k.killed) != 1 || k.killed[0] != victim.Name {
		t.Errorf("pods deleted while their container ran: %q (want only %s)", k.killed, victim.Name)
	}
}

type envOptions struct {
	// Auth: the controller runs as with etcd auth on (pods need the
	// job's credentials record).
	Auth bool
	// LeaderElection: run two controllers with leader election.
	LeaderElection bool
	// Hyperpodrun: the kubelet runs this hyperpodrun binary as the pods'
	// command line says, instead of the shell stand-in.
	Hyperpodrun string
	// EtcdAuth: the fleet's records live on a second etcd with auth on
	// (etcdauth.Bootstrap; kube-apiserver cannot log in to one), the
	// coordinator runs as its user and mints each job's credentials, and
	// the controller runs as its own least-privilege user.
	EtcdAuth bool
	// Resync is the controller's resync period (default 1s).
	Resync time.Duration
	// DebianEtcd: with EtcdAuth, the fleet's etcd is Debian's etcd binary
	// when installed (etcdtest.DebianEtcd), which checks no permission on
	// keepalives, as a third party's attack on a lease needs; else the
	// embedded one.
	DebianEtcd bool
}

// env is a real API server with the CRDs, 4 GPU Nodes, the teams research
// (nominal 8) and prod (nominal 24) as ElasticTeams, the coordinator and
// the controller on its etcd, and the test's kubelet.
type env struct {
	t   *testing.T
	s   *kubetest.Server
	cs  *kubernetes.Clientset
	cl  *kube.Client
	st  *fleet.Store
	k   *kubelet
	ctx context.Context
	// ctls are the controllers (two with leader election), with their
	// cancel functions.
	ctls    []*kube.Controller
	cancels []context.CancelFunc
	wg      sync.WaitGroup
}

func (e *env) bg(f func(context.Context)) {
	e.wg.Add(1)
	go func() { defer e.wg.Done(); f(e.ctx) }()
}

// oneLeader waits until exactly one of the controllers (started with
// LeaderElection) leads, and returns its index in ctls.
func (e *env) oneLeader() int {
	e.t.Helper()
	leader := -1
	waitFor(e.t, 30*time.Second, "one leader", func() (bool, string) {
		n := 0
		for i, c := range e.ctls {
			if c.Leading() {
				n, leader = n+1, i
			}
		}
		return n == 1, fmt.Sprintf("%d leading", n)
	})
	return leader
}

func (e *env) status(name string) v1alpha1.ElasticJobStatus {
	j, err := e.cl.ElasticJobs("ml").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		return v1alpha1.ElasticJobStatus{Phase: err.Error()}
	}
	return j.Status
}

func startEnv(t *testing.T, o envOptions) *env {
	if testing.Short() {
		t.Skip("short: runs an API server, the coordinator, the controller and the pods")
	}
	s := kubetest.Start(t)
	installCRDs(t, s)
	ctlCfg := controllerIdentity(t, s)
	s.Namespace(t, "ml")
	fleetCli, coordCli, ctlCli, podEPs := s.Etcd, s.Etcd, s.Etcd, s.Endpoints
	if o.EtcdAuth {
		var open *clientv3.Client
		var eps []string
		if bin, ok := etcdtest.DebianEtcd(); ok && o.DebianEtcd {
			eps = []string{etcdtest.StartBinary(t, bin)}
			var err error
			if open, err = etcdconn.Connect(context.Background(), etcdconn.Options{Endpoints: eps}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { open.Close() })
		} else {
			srv, cli := etcdtest.Start(t)
			open, eps = cli, srv.Endpoints
		}
		dir := t.TempDir()
		bctx, bcancel := context.WithTimeout(context.Background(), time.Minute)
		if _, err := etcdauth.Bootstrap(bctx, open, fleet.NewKeys(""), []string{"research", "prod"}, dir); err != nil {
			t.Fatalf("etcd auth bootstrap: %v", err)
		}
		as := func(user string) *clientv3.Client {
			pw, err := os.ReadFile(filepath.Join(dir, user+".password"))
			if err != nil {
				t.Fatal(err)
			}
			cli, err := etcdconn.Connect(bctx, etcdconn.Options{Endpoints: eps, User: user, Password: strings.TrimSpace(string(pw))})
			if err != nil {
				t.Fatalf("connect as %s: %v", user, err)
			}
			t.Cleanup(func() { cli.Close() })
			return cli
		}
		fleetCli, coordCli, ctlCli, podEPs = as(etcdauth.RootUser), as(etcdauth.CoordinatorUser), as(etcdauth.KubeControllerUser), eps
		bcancel()
	}
	e := &env{t: t, s: s, cs: s.Clientset(t), st: fleet.New(fleetCli, "")}
	var err error
	if e.cl, err = kube.NewClient(s.Admin()); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuf{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("coordinator and controller log:\n%s", logs.String())
		}
	})
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithCancel(context.Background())
	e.ctx = ctx
	e.k = newKubelet(t, e.cs, fleetCli)
	e.k.hyperpodrun = o.Hyperpodrun
	t.Cleanup(func() {
		cancel()
		e.k.stop(t)
		e.wg.Wait()
	})
	for i := 1; i <= 4; i++ {
		gpuNode(t, e.cs, fmt.Sprintf("n%d", i))
	}
	co := coordinator.New(coordCli, coordinator.Config{Resync: 300 * time.Millisecond, Engine: policy.Config{MinStablePeriod: time.Second}, Logger: log,
		JobCredentials: o.EtcdAuth})
	e.bg(func(ctx context.Context) { co.Run(ctx) })
	n := 1
	if o.LeaderElection {
		n = 2
	}
	for i := range n {
		cfg := kube.Config{Kube: ctlCfg, Etcd: ctlCli, PodEndpoints: podEPs, LauncherImage: "launcher:test", Auth: o.Auth || o.EtcdAuth,
			Nodes: true, Teams: true, DrainMargin: 20 * time.Second, Resync: cmp.Or(o.Resync, time.Second), Logger: log.With("controller", i)}
		if o.LeaderElection {
			cfg.LeaderElection = &kube.LeaderElection{Namespace: "hyperpodrun", Name: "hyperpod-kube-controller", Identity: fmt.Sprintf("ctl-%d", i),
				LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond}
		}
		ctl, err := kube.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithCancel(ctx)
		e.ctls = append(e.ctls, ctl)
		e.cancels = append(e.cancels, ccancel)
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			if err := ctl.Run(cctx); err != nil && ctx.Err() == nil && cctx.Err() == nil {
				t.Errorf("controller %d: %v", i, err)
			}
		}()
	}
	e.bg(e.k.run)
	for _, tm := range []struct {
		name    string
		nominal int32
	}{{"research", 8}, {"prod", 24}} {
		if _, err := e.cl.ElasticTeams().Create(ctx, &v1alpha1.ElasticTeam{ObjectMeta: metav1.ObjectMeta{Name: tm.name},
			Spec: v1alpha1.ElasticTeamSpec{Quotas: []v1alpha1.FlavorQuota{{Flavor: "nvidia-h100-80gb", Nominal: tm.nominal}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, time.Minute, "4 nodes and 2 teams in the fleet", func() (bool, string) {
		nodes, _, _ := e.st.Nodes(ctx)
		teams, _, _ := e.st.Teams(ctx)
		return len(nodes) == 4 && len(teams) == 2 && nodes[0].Flavor == "nvidia-h100-80gb", fmt.Sprintf("%d nodes, %d teams", len(nodes), len(teams))
	})
	return e
}

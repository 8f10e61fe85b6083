package kubernetes_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/kubetest"
	"github.com/hyperpodrun/hyperpodrun/internal/ociimage"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	kube "github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/manifests"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// The images of the kubelet end-to-end test, imported into each node's
// containerd (no registry): tags other than latest, so the kubelet uses
// the imported image (pull policy IfNotPresent).
const (
	e2eAgentImage    = "example.com/hyperpodrun/hyperpod-agent:e2e"
	e2eLauncherImage = "example.com/hyperpodrun/hyperpod-kube-controller:e2e"
	e2eTrainerImage  = "example.com/ml/worker:e2e"
	e2eJob           = "kubelet-e2e"
)

// e2eJobYAML is the ElasticJob a user applies: CPU nodes, one to two
// replicas, host network, the bundled training worker in the trainer
// image, its checkpoints on storage every pod mounts (a host directory
// here, as both nodes are this host), so whichever pod stays resumes
// from the checkpoint the leaving rank 0 committed.
const e2eJobYAML = `apiVersion: v1
kind: Namespace
metadata: {name: ml}
---
apiVersion: hyperpodrun.io/v1alpha1
kind: ElasticTeam
metadata: {name: research}
spec:
  quotas:
    - {flavor: cpu, nominal: 2}
---
apiVersion: hyperpodrun.io/v1alpha1
kind: ElasticJob
metadata: {name: ` + e2eJob + `, namespace: ml}
spec:
  team: research
  flavor: cpu
  elasticPolicy: {minReplicas: 1, maxReplicas: 2, gracefulShutdownTimeoutInSeconds: 20}
  template:
    spec:
      hostNetwork: true
      containers:
        - name: trainer
          image: ` + e2eTrainerImage + `
          command: [/usr/local/bin/worker, --steps, "1000000", --step-time, 50ms, --ckpt-dir, /ckpt]
          volumeMounts: [{name: ckpt, mountPath: /ckpt}]
      volumes: [{name: ckpt, hostPath: {path: %q, type: Directory}}]
`

// The generated manifests on real kubelets (issue 26): two Nodes, each a
// real kubelet v1.34.2 on its own containerd, with the real DaemonSet
// controller (kube-controller-manager) and kube-scheduler. The agent's and the
// launcher's images are built by the image command `make image` runs and
// imported into the nodes' containerds; the manifests come from `gen`
// with the test's etcd. The DaemonSet controller makes the agent's pod,
// the scheduler puts it on node-a, it comes up Ready and registers node-a
// in etcd;
// node-b has no agent and is bridged by the controller. An ElasticJob
// applied with kubectl trains in real pods on both nodes (the init
// container installs hyperpodrun from the launcher image, the supervisor
// runs hyperpodrun with the bundled worker, host network), `kubectl scale
// --replicas=1` drains one pod and the job trains on at size 1, and
// `kubectl delete` leaves no pod, no running container, no worker process
// and no etcd record of the job.
func TestGeneratedManifestsOnRealKubelets(t *testing.T) {
	if testing.Short() {
		t.Skip("builds images and runs an API server, two kubelets and containerds")
	}
	start := time.Now()
	imgs := buildE2EImages(t)
	t.Logf("images built in %s", time.Since(start).Round(time.Second))
	s := kubetest.StartWith(t, kubetest.Options{Nodes: []string{"node-a", "node-b"}})
	nodes := []*kubetest.Kubelet{s.StartKubelet(t, "node-a"), s.StartKubelet(t, "node-b")}
	for _, k := range nodes {
		for _, tar := range imgs {
			if err := k.Import(t, tar); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("two kubelets Ready, images imported at %s", time.Since(start).Round(time.Second))
	cs := s.Clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The manifests, generated for this etcd and these images.
	dir := t.TempDir()
	etcdURL := s.Endpoints[0]
	gen := exec.Command("go", "run", "./operator-shim/kubernetes/gen", "-dir", dir, "-image", e2eLauncherImage,
		"-agent-image", e2eAgentImage, "-etcd-endpoints", etcdURL)
	gen.Dir = repoRoot(t)
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("gen: %v\n%s", err, out)
	}
	for _, f := range []string{filepath.Join(dir, "00-namespace.yaml"), filepath.Join(dir, "crds.yaml"), filepath.Join(dir, "controller.yaml"),
		filepath.Join(repoRoot(t), "examples", "kubernetes", "rbac.yaml")} {
		if out, err := s.Kubectl(t, "apply", "-f", f); err != nil {
			t.Fatalf("kubectl apply -f %s: %v\n%s", f, err, out)
		}
	}
	s.RootCA(t, manifests.Namespace)
	if out, err := s.Kubectl(t, "wait", "--for=condition=Established", "crd/elasticjobs.hyperpodrun.io", "crd/elasticteams.hyperpodrun.io", "--timeout=60s"); err != nil {
		t.Fatalf("CRDs: %v\n%s", err, out)
	}

	// The agent DaemonSet, adapted to this cluster: the real DaemonSet
	// controller and scheduler put its pod on node-a.
	s.StartControllerManager(t, "daemonset")
	s.StartScheduler(t)
	port := agentDaemonSet(t, s, filepath.Join(dir, "daemonset.yaml"))
	st := fleet.New(s.Etcd, "")
	waitFor(t, time.Minute, "the agent pod Ready on node-a and node-a registered in etcd", func() (bool, string) {
		ps, err := cs.CoreV1().Pods(manifests.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=hyperpod-agent"})
		if err != nil || len(ps.Items) != 1 {
			return false, fmt.Sprintf("agent pods: %v", err)
		}
		p := ps.Items[0]
		if p.Spec.NodeName != "node-a" || len(p.OwnerReferences) != 1 || p.OwnerReferences[0].Kind != "DaemonSet" {
			return false, fmt.Sprintf("agent pod on %q, owners %v", p.Spec.NodeName, p.OwnerReferences)
		}
		ready := slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue })
		ns, _, _ := st.Nodes(ctx)
		return ready && len(ns) == 1 && ns[0].Node == "node-a" && ns[0].Flavor == "cpu",
			fmt.Sprintf("pod %s ready %v %+v; fleet nodes %+v", p.Status.Phase, ready, p.Status.ContainerStatuses, ns)
	})
	if out, err := s.Kubectl(t, "logs", "-n", manifests.Namespace, "-l", "app.kubernetes.io/name=hyperpod-agent"); err != nil || !strings.Contains(out, "node-a") {
		t.Errorf("the agent's log through the kubelet: %v\n%s", err, out)
	}
	t.Logf("agent pod Ready on node-a (port %d), node-a registered by it at %s", port, time.Since(start).Round(time.Second))

	// The coordinator and the controller, as the generated ServiceAccount.
	runFleetControllers(t, s)
	job := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(job, []byte(fmt.Sprintf(e2eJobYAML, t.TempDir())), 0o644); err != nil {
		t.Fatal(err)
	}
	s.Namespace(t, "ml")
	if out, err := s.Kubectl(t, "apply", "-f", job); err != nil {
		t.Fatalf("kubectl apply the job: %v\n%s", err, out)
	}
	members := func() int64 { n, _ := st.Members(ctx, e2eJob); return n }
	waitFor(t, 3*time.Minute, "the job's pods Running on node-a and node-b, both in the rendezvous", func() (bool, string) {
		pods := runningJobPods(t, cs, e2eJob)
		return len(pods) == 2 && pods["node-a"] != "" && pods["node-b"] != "" && members() == 2, fmt.Sprintf("pods %v, %d members; %s", pods, members(), jobPodsText(t, cs, e2eJob))
	})
	if out, err := s.Kubectl(t, "wait", "--for=condition=Running", "elasticjob/"+e2eJob, "-n", "ml", "--timeout=60s"); err != nil {
		t.Fatalf("kubectl wait: %v\n%s", err, out)
	}
	before := runningJobPods(t, cs, e2eJob)
	waitFor(t, time.Minute, "the workers training at world size 2 (kubectl logs)", func() (bool, string) {
		out, _ := s.Kubectl(t, "logs", "-n", "ml", before["node-a"], "-c", "trainer")
		out2, _ := s.Kubectl(t, "logs", "-n", "ml", before["node-b"], "-c", "trainer")
		// Rank 0 prints the progress.
		return worldSize(out) == "2" || worldSize(out2) == "2", lastLines(out, 3) + "\n" + lastLines(out2, 3)
	})
	// Exactly the two ranks' workers: a worker of an earlier round may
	// still be exiting when the new round's rank 0 prints (CI once saw 3
	// for a moment), but none may stay.
	waitFor(t, 30*time.Second, "exactly 2 worker processes on this host while the job runs at size 2", func() (bool, string) {
		w := processesNamed("/usr/local/bin/worker")
		return len(w) == 2, fmt.Sprintf("worker processes %v", w)
	})
	t.Logf("training at size 2 at %s", time.Since(start).Round(time.Second))

	// kubectl scale shrinks it: one pod drains, the other trains on.
	if out, err := s.Kubectl(t, "scale", "elasticjob", e2eJob, "-n", "ml", "--replicas=1"); err != nil {
		t.Fatalf("kubectl scale: %v\n%s", err, out)
	}
	waitFor(t, 2*time.Minute, "one pod left, one rendezvous member", func() (bool, string) {
		pods := runningJobPods(t, cs, e2eJob)
		return len(pods) == 1 && members() == 1, fmt.Sprintf("pods %v, %d members; %s", pods, members(), jobPodsText(t, cs, e2eJob))
	})
	after := runningJobPods(t, cs, e2eJob)
	for n, p := range after {
		if before[n] != p {
			t.Errorf("the pod on %s changed at the shrink: %s -> %s", n, before[n], p)
		}
	}
	if txt := eventsText(t, cs, e2eJob); !strings.Contains(txt, "Drained") {
		t.Errorf("no Drained event:\n%s", txt)
	}
	waitFor(t, time.Minute, "the remaining worker resumed from the checkpoint, training at world size 1", func() (bool, string) {
		for _, p := range after {
			out, _ := s.Kubectl(t, "logs", "-n", "ml", p, "-c", "trainer")
			return worldSize(out) == "1" && strings.Contains(out, "resumed at step"), lastLines(out, 5)
		}
		return false, "no pod"
	})
	for _, p := range after {
		out, _ := s.Kubectl(t, "logs", "-n", "ml", p, "-c", "trainer")
		t.Logf("shrunk to 1 at %s; %s's log ends:\n%s", time.Since(start).Round(time.Second), p, lastLines(out, 6))
	}

	// kubectl delete leaves nothing.
	if out, err := s.Kubectl(t, "delete", "elasticjob", e2eJob, "-n", "ml", "--wait=true", "--timeout=90s"); err != nil {
		t.Fatalf("kubectl delete: %v\n%s", err, out)
	}
	waitFor(t, time.Minute, "no pod, no running job container, no worker process, no etcd record of the job", func() (bool, string) {
		ps, _ := cs.CoreV1().Pods("ml").List(ctx, metav1.ListOptions{})
		var tasks []string
		for _, k := range nodes {
			out, _ := k.Ctr("tasks", "ls")
			for _, l := range strings.Split(out, "\n")[1:] {
				if f := strings.Fields(l); len(f) == 3 && f[2] == "RUNNING" {
					tasks = append(tasks, k.Name+"/"+f[0])
				}
			}
		}
		keys := jobKeys(t, s, e2eJob)
		workers := processesNamed("/usr/local/bin/worker")
		// The agent pod's sandbox and container run on node-a.
		return len(ps.Items) == 0 && len(tasks) == 2 && len(keys) == 0 && len(workers) == 0,
			fmt.Sprintf("%d pods, running tasks %v (want the agent's 2), keys %v, worker pids %v", len(ps.Items), tasks, keys, workers)
	})
	t.Logf("deleted, nothing left at %s", time.Since(start).Round(time.Second))
}

// buildE2EImages builds the static programs and the three images as
// `docker save` tarballs: the agent's and the launcher's with the command
// `make image` and `make agent-image` run, the trainer's (busybox and the
// bundled worker) directly.
func buildE2EImages(t *testing.T) []string {
	t.Helper()
	bins, out := t.TempDir(), t.TempDir()
	root := repoRoot(t)
	static := func(pkg string) string {
		p := filepath.Join(bins, filepath.Base(pkg))
		cmd := exec.Command("go", "build", "-tags", "osusergo,netgo", "-ldflags", `-linkmode external -extldflags "-static"`, "-o", p, "./"+pkg)
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=1")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, b)
		}
		return p
	}
	agent, hpr, ctl := static("cmd/hyperpod-agent"), static("cmd/hyperpodrun"), static("cmd/hyperpod-kube-controller")
	worker := filepath.Join(bins, "worker")
	cmd := exec.Command("go", "build", "-o", worker, "./examples/worker")
	cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, b)
	}
	agentTar, launcherTar, trainerTar := filepath.Join(out, "agent.tar"), filepath.Join(out, "launcher.tar"), filepath.Join(out, "trainer.tar")
	for _, args := range [][]string{
		{"-agent", agent, "-hyperpodrun", hpr, "-o", agentTar, "-tag", e2eAgentImage},
		{"-controller", ctl, "-hyperpodrun", hpr, "-o", launcherTar, "-tag", e2eLauncherImage},
	} {
		cmd := exec.Command("go", append([]string{"run", "./operator-shim/kubernetes/image"}, args...)...)
		cmd.Dir = root
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, b)
		}
	}
	files := []ociimage.File{{Path: "bin/busybox", Source: "/bin/busybox", Mode: 0o755}, {Path: "bin/sh", Link: "busybox"},
		{Path: "tmp/", Mode: 0o1777}, {Path: "usr/local/bin/worker", Source: worker, Mode: 0o755}}
	img, err := ociimage.Build(ociimage.Spec{Files: files, Env: []string{"PATH=/usr/local/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ociimage.WriteTarball(img, e2eTrainerImage, trainerTar); err != nil {
		t.Fatal(err)
	}
	return []string{agentTar, launcherTar, trainerTar}
}

// agentDaemonSet creates the generated hyperpod-agent DaemonSet adapted to
// this cluster (the DaemonSet controller and the scheduler make and place
// its pod). The adaptations: etcd auth and TLS are off here
// (no certificate or enrollment arguments and Secrets); host network, as
// the pods have no other (loopback-only CNI), on a free port instead of
// 9400; node-a only (node-b stays without an agent, for the bridge). It
// returns the agent's port.
func agentDaemonSet(t *testing.T, s *kubetest.Server, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var d appsv1.DaemonSet
		if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
			t.Fatalf("daemonset.yaml: %v", err)
		}
		if d.Name == "hyperpod-agent" {
			ds = &d
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet hyperpod-agent in the generated daemonset.yaml")
	}
	port := testutil.FreePort(t)
	spec := &ds.Spec.Template.Spec
	spec.HostNetwork = true
	spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "node-a"}
	c := &spec.Containers[0]
	var args []string
	for _, a := range c.Args {
		switch {
		case slices.ContainsFunc([]string{"--etcd-cacert", "--etcd-cert", "--etcd-key", "--etcd-user", "--etcd-password-file", "--etcd-enroll"},
			func(p string) bool { return strings.HasPrefix(a, p+"=") }):
		case strings.HasPrefix(a, "--listen="):
			args = append(args, "--listen=$(POD_IP):"+strconv.Itoa(port))
		default:
			args = append(args, a)
		}
	}
	c.Args = args
	c.Ports[0].ContainerPort = int32(port)
	c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "etcd-tls" || m.Name == "etcd-enroll" })
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "etcd-tls" || v.Name == "etcd-enroll" })
	if _, err := s.Clientset(t).AppsV1().DaemonSets(manifests.Namespace).Create(ctxT(t, time.Minute), ds, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the DaemonSet: %v", err)
	}
	return port
}

// runFleetControllers runs the coordinator and the ElasticJob controller
// (in process) until the test ends, the controller as the generated
// ServiceAccount hyperpod-kube-controller with the generated RBAC.
func runFleetControllers(t *testing.T, s *kubetest.Server) {
	t.Helper()
	logs := &syncBuf{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("coordinator and controller log (last 8 KB):\n%s", lastBytes(logs.String(), 8192))
		}
	})
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctl, err := kube.New(kube.Config{Kube: s.Config(s.ServiceAccountToken(t, manifests.Namespace, manifests.Controller)), Etcd: s.Etcd,
		PodEndpoints: s.Endpoints, LauncherImage: e2eLauncherImage, Nodes: true, Teams: true, DrainMargin: 20 * time.Second,
		Resync: time.Second, Logger: log.With("part", "controller")})
	if err != nil {
		t.Fatal(err)
	}
	co := coordinator.New(s.Etcd, coordinator.Config{Resync: 300 * time.Millisecond, Engine: policy.Config{MinStablePeriod: time.Second},
		Logger: log.With("part", "coordinator")})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); co.Run(ctx) }()
	go func() {
		defer wg.Done()
		if err := ctl.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("controller: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// runningJobPods are a job's Running pods not being deleted: node -> pod.
func runningJobPods(t *testing.T, cs kubernetes.Interface, job string) map[string]string {
	live, _ := livePods(t, cs, job)
	out := map[string]string{}
	for n, p := range live {
		out[n] = p.Name
	}
	return out
}

// jobPodsText describes a job's pods for a failure message.
func jobPodsText(t *testing.T, cs kubernetes.Interface, job string) string {
	ps, err := cs.CoreV1().Pods("ml").List(context.Background(), metav1.ListOptions{LabelSelector: kube.JobLabel + "=" + job})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range ps.Items {
		fmt.Fprintf(&b, "%s on %s: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			fmt.Fprintf(&b, " [%s %+v]", c.Name, c.State)
		}
		b.WriteString("; ")
	}
	return b.String()
}

// jobKeys are the fleet's etcd keys that name the job (events, the
// decision history, excepted).
func jobKeys(t *testing.T, s *kubetest.Server, job string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys := fleet.NewKeys("")
	r, err := s.Etcd.Get(ctx, keys.Root(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, kv := range r.Kvs {
		k := string(kv.Key)
		if strings.HasPrefix(k, keys.EventsPrefix()) {
			continue
		}
		if slices.Contains(strings.Split(k, "/"), job) {
			out = append(out, k)
		}
	}
	return out
}

// processesNamed are the pids whose command line starts with argv0.
func processesNamed(argv0 string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && strings.HasPrefix(string(b), argv0+"\x00") {
			out = append(out, pid)
		}
	}
	return out
}

// worldSize is the world size of the worker's last progress line
// ("step=<n> world_size=<w> loss=<f>"), "" without one.
func worldSize(log string) string {
	i := strings.LastIndex(log, "world_size=")
	if i < 0 {
		return ""
	}
	f := strings.Fields(log[i+len("world_size="):])
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

func lastBytes(s string, n int) string { return s[max(0, len(s)-n):] }

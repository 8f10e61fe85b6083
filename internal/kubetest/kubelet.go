package kubetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/internal/ctrdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/ociimage"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// SandboxImage is the pod sandbox ("pause") image the kubelet's containerd
// runs for every pod. No public registry is reachable here, so StartKubelet
// builds it (busybox-static's sleep) and imports it under this name.
const SandboxImage = "registry.k8s.io/pause:3.10"

// CRINamespace is the containerd namespace the CRI plugin keeps the
// kubelet's images and containers in.
const CRINamespace = "k8s.io"

// KubeletBinary returns the kubelet's path: $KUBELET, else the cache of
// `KUBE_CMD=kubelet scripts/kube-apiserver.sh`; ok is false when it does
// not exist.
func KubeletBinary() (path string, ok bool) { return cached("kubelet", "KUBELET").Path() }

// Kubelet is a real kubelet (built from the same release as the API
// server) registered as a Node, running pods through its own private
// containerd's CRI plugin (Debian's containerd and runc), with a
// loopback-only CNI network: host-network pods only (the CRI's stream
// server and the kubelet's healthz are on loopback; its API on IP).
type Kubelet struct {
	// Name is the Node's name.
	Name string
	// CRI is the containerd's socket (the kubelet's runtime endpoint).
	CRI string
	// Dir holds everything of this node: containerd's root and state, the
	// kubelet's root dir, the pods' logs (PodLogsDir), configs.
	Dir string
	// IP is the Node's InternalIP, this host's first non-loopback IPv4
	// address (a kubelet refuses 127.0.0.1); it listens there.
	IP string
	// PodLogsDir is where the kubelet keeps the containers' logs
	// (<namespace>_<pod>_<uid>/<container>/<n>.log), in place of
	// /var/log/pods.
	PodLogsDir string

	kubelet, containerd       *exec.Cmd
	kubeletDone, ctrdDone     chan struct{}
	kubeletLog, containerdLog string
}

// StartKubelet starts a private containerd with the CRI plugin and a
// kubelet registered as Node name (one of Options.Nodes), waits until the
// Node is Ready, and when the test ends stops both, kills every container
// process they left and checks that none survives. It skips the test when
// the kubelet or containerd cannot run here (fails it under $CI).
func (s *Server) StartKubelet(t testing.TB, name string) *Kubelet {
	t.Helper()
	bin := cached("kubelet", "KUBELET").Require(t)
	for _, b := range []string{"containerd", "runc", "containerd-shim-runc-v2", "ctr", "/usr/lib/cni/loopback", "/bin/busybox"} {
		if _, err := exec.LookPath(b); err != nil {
			testutil.SkipOrFail(t, b+" is not installed (apt-get install containerd runc containernetworking-plugins busybox-static)")
		}
	}
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "a kubelet and containerd need root")
	}
	token, ok := s.NodeTokens[name]
	if !ok {
		t.Fatalf("StartKubelet(%q): start the server with kubetest.Options{Nodes: [%q]}", name, name)
	}
	// A short path: unix sockets (containerd's, the kubelet's plugin
	// sockets under its root dir) must fit in 107 bytes.
	dir, err := os.MkdirTemp("", "kl")
	if err != nil {
		t.Fatal(err)
	}
	k := &Kubelet{Name: name, Dir: dir, CRI: filepath.Join(dir, "c.sock"), PodLogsDir: filepath.Join(dir, "pods"),
		kubeletLog: filepath.Join(dir, "kubelet.log"), containerdLog: filepath.Join(dir, "containerd.log")}
	t.Cleanup(func() { k.stop(t) })
	if err := k.startContainerd(); err != nil {
		t.Fatal(err)
	}
	if err := k.importSandboxImage(t); err != nil {
		t.Fatal(err)
	}
	if err := k.startKubelet(bin, s.URL, token); err != nil {
		t.Fatal(err)
	}
	s.waitNodeReady(t, k, 2*time.Minute)
	return k
}

// containerdConfig keeps the CRI plugin, with its own root, state, sockets
// and stream port. restrict_oom_score_adj: the kubelet asks -998 for
// sandboxes, and root here may lack CAP_SYS_RESOURCE (runc then fails every
// sandbox with "can't get final child's PID from pipe: EOF").
const containerdConfig = `version = 2
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
`

// loopbackCNI is enough for the Node to be Ready and for host-network
// pods; a pod with its own network namespace gets only lo.
const loopbackCNI = `{"cniVersion":"1.0.0","name":"lo-only","plugins":[{"type":"loopback"}]}`

func (k *Kubelet) startContainerd() error {
	cni := filepath.Join(k.Dir, "cni")
	if err := os.MkdirAll(cni, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cni, "10-lo.conflist"), []byte(loopbackCNI), 0o644); err != nil {
		return err
	}
	conf := fmt.Sprintf(containerdConfig, filepath.Join(k.Dir, "root"), filepath.Join(k.Dir, "state"),
		k.CRI, k.CRI+".ttrpc", k.CRI+".debug", SandboxImage, cni)
	confPath := filepath.Join(k.Dir, "containerd.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return err
	}
	cmd, done, err := startLogged(k.containerdLog, nil, "containerd", "--config", confPath)
	if err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	k.containerd, k.ctrdDone = cmd, done
	if err := ctrdtest.WaitForSocket(k.CRI, done, 30*time.Second); err != nil {
		return fmt.Errorf("containerd: %w:\n%s", err, tailFile(k.containerdLog, 4096))
	}
	return nil
}

// startLogged starts a daemon with its output in logFile (env nil: the
// test's); done closes when it exits.
func startLogged(logFile string, env []string, name string, args ...string) (*exec.Cmd, chan struct{}, error) {
	f, err := os.Create(logFile)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(name, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setsid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); f.Close(); close(done) }()
	return cmd, done, nil
}

// importSandboxImage builds the sandbox image (one layer of busybox-static,
// entrypoint sleep) and imports it: there is no registry to pull it from.
func (k *Kubelet) importSandboxImage(t testing.TB) error {
	files := []ociimage.File{{Path: "bin/busybox", Source: "/bin/busybox", Mode: 0o755}, {Path: "bin/sleep", Link: "busybox"}}
	img, err := ociimage.Build(ociimage.Spec{Files: files, Entrypoint: []string{"/bin/sleep", "2147483647"}})
	if err != nil {
		return fmt.Errorf("build the sandbox image: %w", err)
	}
	tar := filepath.Join(k.Dir, "pause.tar")
	if err := ociimage.WriteTarball(img, SandboxImage, tar); err != nil {
		return err
	}
	return k.Import(t, tar)
}

// Import imports a `docker save` tarball (ociimage.WriteTarball, `make
// image`) into the CRI namespace, as `ctr -n k8s.io images import` on a
// node of a cluster without a registry: pods naming its reference with
// imagePullPolicy IfNotPresent (or a tag other than latest) run it.
func (k *Kubelet) Import(t testing.TB, tarball string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ctr", "-a", k.CRI, "-n", CRINamespace, "images", "import", tarball).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %w\n%s", tarball, err, out)
	}
	return nil
}

// Ctr runs ctr against this node's containerd in the CRI namespace
// (e.g. "containers", "ls", "-q").
func (k *Kubelet) Ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ctr", append([]string{"-a", k.CRI, "-n", CRINamespace}, args...)...).CombinedOutput()
	return string(out), err
}

// kubeletConfig: cgroupfs (this machine has cgroup v1, which 1.34 still
// accepts with failCgroupV1 false), no QoS cgroups (two kubelets on one
// host would share /kubepods), no swap check, its own ports,
// no read-only port, the API server reaches it for logs and exec without
// authentication (loopback only), and no eviction or image GC for a busy
// disk to trigger.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
healthzBindAddress: 127.0.0.1
healthzPort: %d
readOnlyPort: 0
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
localStorageCapacityIsolation: false
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
fileCheckFrequency: 5s
serializeImagePulls: false
resolvConf: /etc/resolv.conf
`

func (k *Kubelet) startKubelet(bin, server, token string) error {
	root := filepath.Join(k.Dir, "kubelet")
	if err := os.MkdirAll(k.PodLogsDir, 0o755); err != nil {
		return err
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: %q, user: {token: %q}}]
contexts: [{name: test, context: {cluster: test, user: %q}}]
current-context: test
`, server, k.Name, token, k.Name)
	kcPath := filepath.Join(k.Dir, "kubelet.kubeconfig")
	if err := os.WriteFile(kcPath, []byte(kc), 0o600); err != nil {
		return err
	}
	port, err := testutil.FreePortErr()
	if err != nil {
		return err
	}
	healthz, err := testutil.FreePortErr()
	if err != nil {
		return err
	}
	ip, err := hostIP()
	if err != nil {
		return err
	}
	k.IP = ip
	conf := fmt.Sprintf(kubeletConfig, ip, port, healthz, k.CRI, k.PodLogsDir)
	confPath := filepath.Join(k.Dir, "kubelet.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return err
	}
	// The kubelet installs iptables rules on the host (a KUBE-FIREWALL
	// chain dropping non-loopback traffic to 127.0.0.0/8, in INPUT and
	// OUTPUT) whenever it finds iptables, and they would outlive the test:
	// it finds stand-ins that fail, and goes on without (it needs none).
	hide := filepath.Join(k.Dir, "bin")
	if err := os.MkdirAll(hide, 0o755); err != nil {
		return err
	}
	for _, b := range []string{"iptables", "ip6tables"} {
		if err := os.WriteFile(filepath.Join(hide, b), []byte("#!/bin/sh\necho \"iptables is hidden from the test's kubelet\" >&2\nexit 2\n"), 0o755); err != nil {
			return err
		}
	}
	env := append(os.Environ(), "PATH="+hide+":"+os.Getenv("PATH"))
	cmd, done, err := startLogged(k.kubeletLog, env, bin, "--config="+confPath, "--kubeconfig="+kcPath, "--root-dir="+root,
		"--hostname-override="+k.Name, "--node-ip="+ip, "--v=1")
	if err != nil {
		return fmt.Errorf("start kubelet: %w", err)
	}
	k.kubelet, k.kubeletDone = cmd, done
	return nil
}

// hostIP is this machine's first non-loopback IPv4 address: the kubelet
// refuses a loopback node IP, and the API server reaches it (logs, exec)
// at its InternalIP.
func hostIP() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("the host's addresses: %w", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String(), nil
		}
	}
	return "", errors.New("the host has no non-loopback IPv4 address for the kubelet's node IP")
}

func (s *Server) waitNodeReady(t testing.TB, k *Kubelet, timeout time.Duration) {
	t.Helper()
	cs := s.Clientset(t)
	exited := false
	testutil.Eventually(t, timeout, "Node "+k.Name+" Ready", func() (bool, string) {
		select {
		case <-k.kubeletDone:
			exited = true
			return true, ""
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err := cs.CoreV1().Nodes().Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
			}
		}
		return false, "no Ready condition"
	})
	if exited {
		t.Fatalf("kubelet %s exited:\n%s", k.Name, tailFile(k.kubeletLog, 8192))
	}
}

// Log is the kubelet's log (its last n bytes).
func (k *Kubelet) Log(n int) string { return tailFile(k.kubeletLog, n) }

// ContainerdLog is its containerd's log (the last n bytes).
func (k *Kubelet) ContainerdLog(n int) string { return tailFile(k.containerdLog, n) }

// stop ends the kubelet, then every container process (each shim of this
// containerd and its children, the containers' init processes: a PID
// namespace dies with its init), then containerd; it unmounts what they
// left, removes Dir and fails the test if a process of theirs survives.
func (k *Kubelet) stop(t testing.TB) {
	if t.Failed() && k.kubelet != nil {
		t.Logf("kubelet %s log (last 6 KB):\n%s\ncontainerd log (last 3 KB):\n%s", k.Name, tailFile(k.kubeletLog, 8192), tailFile(k.containerdLog, 3072))
	}
	stopDaemon(k.kubelet, k.kubeletDone)
	procs := ctrdtest.KillContainers(k.Dir)
	stopDaemon(k.containerd, k.ctrdDone)
	if left := ctrdtest.Survivors(procs, 10*time.Second); len(left) > 0 {
		t.Errorf("node %s: processes still alive 10s after being killed: %v", k.Name, left)
	}
	ctrdtest.UnmountUnder(k.Dir)
	if err := os.RemoveAll(k.Dir); err != nil {
		t.Errorf("node %s: %v", k.Name, err)
	}
}

func stopDaemon(cmd *exec.Cmd, done chan struct{}) {
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

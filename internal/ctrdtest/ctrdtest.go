// Package ctrdtest starts the real parts the containerd runtime's tests
// need: a private containerd (Debian's containerd and runc, with its own
// root, state and socket), a loopback image registry (Debian's
// docker-registry), and images built from a small rootfs and pushed to it
// with go-containerregistry (no public registry is reachable).
package ctrdtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/crypto/bcrypt"

	"github.com/hyperpodrun/hyperpodrun/internal/ociimage"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// Containerd is a private containerd started for a test.
type Containerd struct {
	// Address is its gRPC socket.
	Address string
	// Root and State are its directories.
	Root, State string
	cmd         *exec.Cmd
	log         string
}

// Binaries reports why containerd cannot run here ("" when it can): the
// binaries are missing or the test does not run as root.
func Binaries() string {
	for _, b := range []string{"containerd", "runc", "containerd-shim-runc-v2"} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Sprintf("%s is not installed (apt-get install containerd runc)", b)
		}
	}
	if os.Geteuid() != 0 {
		return "containerd needs root"
	}
	return ""
}

// StartContainerd starts a private containerd under a temp dir, waits for
// its socket, and stops it (killing every shim and container it left) when
// the test ends. It skips the test with the reason when containerd cannot
// run here (fails it under $CI).
func StartContainerd(t testing.TB) *Containerd {
	t.Helper()
	if why := Binaries(); why != "" {
		testutil.SkipOrFail(t, "containerd cannot start here: "+why)
	}
	// A short path: the socket's must fit in 107 bytes.
	dir, err := os.MkdirTemp("", "ctrd")
	if err != nil {
		t.Fatal(err)
	}
	c := &Containerd{
		Address: filepath.Join(dir, "c.sock"),
		Root:    filepath.Join(dir, "root"),
		State:   filepath.Join(dir, "state"),
		log:     filepath.Join(dir, "containerd.log"),
	}
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  address = %q
`, c.Root, c.State, c.Address, c.Address+".ttrpc", c.Address+".debug")
	confPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command("containerd", "--config", confPath)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setsid: true}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	exited := make(chan struct{})
	go func() { c.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			c.cmd.Process.Kill()
			<-exited
		}
		if left := Survivors(KillContainers(dir), 10*time.Second); len(left) > 0 {
			t.Logf("containerd %s: container processes still alive 10s after being killed: %v", dir, left)
		}
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(c.log); err == nil {
				t.Logf("containerd log (last 4 KB):\n%s", tail(b, 4096))
			}
		}
		// Unmount what a killed shim left mounted before removing.
		UnmountUnder(dir)
		os.RemoveAll(dir)
	})
	if err := WaitForSocket(c.Address, exited, 30*time.Second); err != nil {
		b, _ := os.ReadFile(c.log)
		t.Fatalf("containerd: %v:\n%s", err, tail(b, 4096))
	}
	return c
}

// Kill SIGKILLs containerd (a fault test); its shims and containers go on.
func (c *Containerd) Kill() { c.cmd.Process.Kill() }

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Registry is a loopback image registry (Debian's docker-registry).
type Registry struct {
	// Host is its host:port on 127.0.0.1 (plain HTTP).
	Host string
	auth authn.Authenticator
}

// StartRegistry starts docker-registry on a free loopback port with its
// storage in a temp dir, waits until it answers, and stops it when the test
// ends. It skips the test when docker-registry is not installed (fails
// it under $CI).
func StartRegistry(t testing.TB) *Registry {
	t.Helper()
	return startRegistry(t, "", "")
}

// StartRegistryWithAuth is StartRegistry with basic auth (htpasswd,
// bcrypt): only user with password may push or pull.
func StartRegistryWithAuth(t testing.TB, user, password string) *Registry {
	t.Helper()
	return startRegistry(t, user, password)
}

func startRegistry(t testing.TB, user, password string) *Registry {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		testutil.SkipOrFail(t, "docker-registry is not installed (apt-get install docker-registry)")
	}
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := l.Addr().String()
	l.Close()
	conf := fmt.Sprintf(`version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, filepath.Join(dir, "data"), host)
	var auth authn.Authenticator = authn.Anonymous
	if user != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		pwFile := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(pwFile, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		conf += fmt.Sprintf("auth:\n  htpasswd:\n    realm: test\n    path: %s\n", pwFile)
		auth = &authn.Basic{Username: user, Password: password}
	}
	confPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", confPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start docker-registry: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); logf.Close() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + host + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || user != "" && resp.StatusCode == http.StatusUnauthorized {
				return &Registry{Host: host, auth: auth}
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "registry.log"))
			t.Fatalf("docker-registry on %s did not answer in 20s: %v\n%s", host, err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// File is one file of an image layer (see package ociimage).
type File = ociimage.File

// Image describes an image to build: one layer of files, plus config.
type Image struct {
	Files      []File
	Env        []string
	Entrypoint []string
	Cmd        []string
	// Pad adds a layer of this many incompressible bytes (pull timing).
	Pad int64
}

// BusyboxFiles is a rootfs of Debian's busybox-static: /bin/busybox and
// the applets the tests use as links to it, plus /tmp.
func BusyboxFiles() ([]File, error) {
	src := "/bin/busybox"
	if _, err := os.Stat(src); err != nil {
		return nil, fmt.Errorf("busybox-static is not installed (apt-get install busybox-static): %w", err)
	}
	files := []File{{Path: "bin/busybox", Source: src, Mode: 0o755}, {Path: "tmp/", Mode: 0o1777}}
	for _, a := range []string{"sh", "ls", "cat", "sleep", "echo", "env", "ps", "kill", "mkdir", "true", "id", "readlink", "stat"} {
		files = append(files, File{Path: "bin/" + a, Link: "busybox"})
	}
	return files, nil
}

// Push builds img and pushes it to the registry as repo:tag, returning the
// reference to pull ("127.0.0.1:port/repo:tag").
func (r *Registry) Push(ctx context.Context, repo, tag string, img Image) (string, error) {
	built, err := ociimage.Build(ociimage.Spec{Files: img.Files, Env: append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, img.Env...),
		Entrypoint: img.Entrypoint, Cmd: img.Cmd, Architecture: "amd64"})
	if err != nil {
		return "", err
	}
	if img.Pad > 0 {
		pad, err := padLayer(img.Pad)
		if err != nil {
			return "", err
		}
		if built, err = mutate.AppendLayers(built, pad); err != nil {
			return "", err
		}
	}
	ref := r.Host + "/" + repo + ":" + tag
	auth := r.auth
	if auth == nil {
		auth = authn.Anonymous
	}
	if _, err := ociimage.Push(ctx, built, ref, ociimage.PushOptions{Auth: auth, Insecure: true}); err != nil {
		return "", err
	}
	return ref, nil
}

// padLayer is a layer holding one file of n random bytes.
func padLayer(n int64) (v1.Layer, error) {
	data := make([]byte, n)
	// Incompressible but cheap: a xorshift stream.
	x := uint64(88172645463325252)
	for i := 0; i+8 <= len(data); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		for j := 0; j < 8; j++ {
			data[i+j] = byte(x >> (8 * j))
		}
	}
	return ociimage.Layer([]File{{Path: "pad/blob", Data: data}})
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/agent/node/containers"
	"github.com/hyperpodrun/hyperpodrun/internal/ctrdtest"
)

// buildStatic builds ./cmd/<program> static into dir, as `make image` does.
func buildStatic(t *testing.T, dir, program string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "go"
	}
	out := filepath.Join(dir, program)
	cmd := exec.Command(goBin, "build", "-tags", "osusergo,netgo",
		"-ldflags", `-linkmode external -extldflags "-static"`, "-o", out, "./cmd/"+program)
	cmd.Dir = filepath.Join("..", "..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, b)
	}
	return out
}

// The image as a cluster uses it, on real parts: built from freshly built
// static binaries, pushed to a registry (Debian's docker-registry) and
// pulled by containerd (Debian's, with runc), its init-container command
// `hyperpod-kube-controller install DIR` copies both programs into a host
// directory as the image's user 65532 (the controller's Deployment) and as
// another user (a job pod's), and they run on the host; both programs run
// in the container; the `docker save` tarball imports into containerd
// (`ctr images import`) and runs without a registry. No container or task
// is left.
func TestImageInContainerd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two static binaries and runs containers")
	}
	ctrd := ctrdtest.StartContainerd(t)
	reg := ctrdtest.StartRegistry(t)
	bins := t.TempDir()
	controller := buildStatic(t, bins, "hyperpod-kube-controller")
	hyperpodrun := buildStatic(t, bins, "hyperpodrun")
	// The deadline starts after the builds: a cold build cache (new tags,
	// a new Go) alone can take minutes on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tarPath := filepath.Join(t.TempDir(), "image.tar")
	const imported = "ghcr.io/hyperpodrun/hyperpod-kube-controller:imported-by-test"
	pushRef := reg.Host + "/hyperpodrun/hyperpod-kube-controller:test"
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-controller", controller, "-hyperpodrun", hyperpodrun, "-push", pushRef, "-o", tarPath, "-tag", imported, "-version", "test"},
		&stdout, &stderr); code != 0 {
		t.Fatalf("image: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	pinned := ""
	for _, l := range strings.Split(stdout.String(), "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(l), "= "); ok {
			pinned = s
		}
	}
	if !strings.HasPrefix(pinned, reg.Host+"/hyperpodrun/hyperpod-kube-controller@sha256:") {
		t.Fatalf("the output names no pinned reference:\n%s", stdout.String())
	}

	rt, err := containers.Connect(ctx, containers.Config{Address: ctrd.Address, CDIDirs: []string{t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	n := 0
	// runIn runs args in a container of image and returns its exit code
	// and output; the container is removed.
	runIn := func(image string, uid *uint32, mounts []containers.Mount, args ...string) (int, string) {
		t.Helper()
		n++
		s := containers.Spec{Job: "image-test", Node: fmt.Sprint(n), Image: image, Args: args, Mounts: mounts,
			LogPath: filepath.Join(t.TempDir(), "out.log")}
		if uid != nil {
			s.UID, s.GID = uid, uid
		}
		task, err := rt.Start(ctx, s)
		if err != nil {
			t.Fatalf("start %q in %s: %v", args, image, err)
		}
		ex, err := task.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Remove(ctx); err != nil {
			t.Fatal(err)
		}
		out, _ := os.ReadFile(s.LogPath)
		return int(ex.Code), string(out)
	}
	wantBytes := map[string][]byte{}
	for name, p := range map[string]string{"hyperpod-kube-controller": controller, "hyperpodrun": hyperpodrun} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		wantBytes[name] = b
	}
	// install checks what the init container copied into dir, owned by
	// uid, and runs it on the host.
	install := func(image string, uid *uint32, wantOwner uint32, dirMode os.FileMode) {
		t.Helper()
		tools := t.TempDir()
		if err := os.Chmod(tools, dirMode); err != nil {
			t.Fatal(err)
		}
		if dirMode == 0o755 {
			// Writable for the image's user only, as it runs as 65532.
			if err := os.Chown(tools, 65532, 65532); err != nil {
				t.Fatal(err)
			}
		}
		code, out := runIn(image, uid, []containers.Mount{{Source: tools, Target: "/tools"}}, "hyperpod-kube-controller", "install", "/tools")
		if code != 0 {
			t.Fatalf("install into /tools as uid %d: exit %d\n%s", wantOwner, code, out)
		}
		for name, want := range wantBytes {
			p := filepath.Join(tools, name)
			fi, err := os.Stat(p)
			if err != nil {
				t.Errorf("install left no %s: %v", name, err)
				continue
			}
			if fi.Mode().Perm()&0o111 != 0o111 {
				t.Errorf("%s is mode %v, want executable by everyone", name, fi.Mode())
			}
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != wantOwner {
				t.Errorf("%s is owned by uid %d, want %d (the container's user)", name, st.Uid, wantOwner)
			}
			if got, _ := os.ReadFile(p); !bytes.Equal(got, want) {
				t.Errorf("%s differs from the program built (%d bytes, want %d)", name, len(got), len(want))
			}
			out, err := exec.CommandContext(ctx, p, "--help").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "USAGE") {
				t.Errorf("the installed %s --help: %v\n%s", name, err, out)
			}
		}
		if left, _ := filepath.Glob(filepath.Join(tools, "*.tmp")); len(left) > 0 {
			t.Errorf("install left %v", left)
		}
	}

	// The Deployment: the image's own user, 65532, from the registry.
	install(pinned, nil, 65532, 0o755)
	// A job pod's init container runs as the job's user into its emptyDir.
	other := uint32(4321)
	install(pushRef, &other, other, 0o777)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"hyperpod-kube-controller", "--help"}, "the ElasticJob controller"},
		{[]string{"hyperpodrun", "--help"}, "torchrun-compatible elastic launcher"},
		// The entrypoint's path, as the Deployment runs it (args only).
		{[]string{BinDir + "/hyperpod-kube-controller", "run", "--help"}, "--launcher-image"},
	} {
		if code, out := runIn(pinned, nil, nil, tc.args...); code != 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%q in the image: exit %d, want 0 and %q in:\n%s", tc.args, code, tc.want, out)
		}
	}

	// The tarball, imported without a registry (the tag is on ghcr.io,
	// which this machine cannot reach: a pull would fail).
	imp := exec.CommandContext(ctx, "ctr", "-a", ctrd.Address, "-n", rt.Namespace(), "images", "import", tarPath)
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", imp, err, out)
	}
	install(imported, nil, 65532, 0o755)

	ids, err := rt.List(ctx, "")
	if err != nil || len(ids) != 0 {
		t.Errorf("containers left: %v %v", ids, err)
	}
	tasks, err := exec.CommandContext(ctx, "ctr", "-a", ctrd.Address, "-n", rt.Namespace(), "tasks", "ls", "-q").CombinedOutput()
	if err != nil || strings.TrimSpace(string(tasks)) != "" {
		t.Errorf("tasks left: %q %v", tasks, err)
	}
}

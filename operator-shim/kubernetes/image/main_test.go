package main

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/hyperpodrun/hyperpodrun/internal/ctrdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// cPrograms compiles a tiny C program twice with gcc (the C compiler cgo
// uses): linked dynamically, and static.
func cPrograms(t *testing.T) (dynamic, static string) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		testutil.SkipOrFail(t, "gcc is not installed (apt-get install gcc libc6-dev)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "p.c")
	if err := os.WriteFile(src, []byte("int main(void) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dynamic, static = filepath.Join(dir, "dynamic"), filepath.Join(dir, "static")
	for _, args := range [][]string{{"-o", dynamic, src}, {"-static", "-o", static, src}} {
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %v: %v\n%s", args, err, out)
		}
	}
	return dynamic, static
}

func TestCheckStatic(t *testing.T) {
	dynamic, static := cPrograms(t)
	if arch, err := CheckStatic(static, "hyperpodrun"); err != nil || arch == "" {
		t.Errorf("a static program: %q %v, want accepted", arch, err)
	}
	text := filepath.Join(t.TempDir(), "hyperpodrun")
	os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755)
	for _, tc := range []struct{ path, want string }{
		{dynamic, "dynamically linked (it needs /"},
		{dynamic, `-extldflags "-static"`},
		{filepath.Join(t.TempDir(), "missing"), "no hyperpodrun there: build it static first (make image"},
		{text, "not an ELF executable"},
	} {
		_, err := CheckStatic(tc.path, "hyperpodrun")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.path, err, tc.want)
		}
	}
}

// Runs of the command: a dynamic binary, a missing one, bad flags and a
// bad $SOURCE_DATE_EPOCH are refused with non-zero exits naming the fix.
func TestRunRefuses(t *testing.T) {
	dynamic, static := cPrograms(t)
	out := filepath.Join(t.TempDir(), "img.tar")
	for _, tc := range []struct {
		args []string
		env  string
		code int
		want string
	}{
		{[]string{"-controller", dynamic, "-hyperpodrun", static, "-o", out}, "", 1, "is dynamically linked"},
		{[]string{"-controller", static, "-hyperpodrun", dynamic, "-o", out}, "", 1, dynamic + " is dynamically linked"},
		{[]string{"-controller", static, "-hyperpodrun", "/nonexistent/hyperpodrun", "-o", out}, "", 1, "build it static first"},
		{[]string{"-controller", static, "-hyperpodrun", static, "-o", out}, "yesterday", 1, "$SOURCE_DATE_EPOCH"},
		{[]string{"-controller", static, "-hyperpodrun", static, "-o", out, "extra"}, "", 2, "unexpected arguments"},
		{[]string{"-no-such-flag"}, "", 2, "flag provided but not defined"},
		{[]string{"-controller", static, "-hyperpodrun", static, "-push", "Bad Ref"}, "", 1, "host/repository:tag"},
	} {
		t.Setenv("SOURCE_DATE_EPOCH", tc.env)
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d saying %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a refused build left a tarball")
	}
}

// The tarball's image: both programs in /usr/local/bin, on PATH, the
// controller as entrypoint, user 65532, a writable /tmp, OCI labels; the
// same inputs give the same digest.
func TestImageContents(t *testing.T) {
	_, static := cPrograms(t)
	dir := t.TempDir()
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	var digests []v1.Hash
	for i := range 2 {
		out := filepath.Join(dir, "img.tar")
		var stdout, stderr bytes.Buffer
		if code := run([]string{"-controller", static, "-hyperpodrun", static, "-o", out, "-version", "v0.3.1", "-revision", "abc123"}, &stdout, &stderr); code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		if !strings.Contains(stdout.String(), "docker load -i "+out) {
			t.Errorf("stdout %q does not say how to load it", stdout.String())
		}
		tag, _ := name.NewTag("ghcr.io/hyperpodrun/hyperpod-kube-controller:latest")
		img, err := tarball.ImageFromPath(out, &tag)
		if err != nil {
			t.Fatalf("the tarball is not tagged %s: %v", tag, err)
		}
		d, _ := img.Digest()
		digests = append(digests, d)
		if i == 1 {
			break
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		c := cf.Config
		if c.User != "65532:65532" || !reflect.DeepEqual(c.Entrypoint, []string{"/usr/local/bin/hyperpod-kube-controller"}) ||
			!reflect.DeepEqual(c.Env, []string{"PATH=/usr/local/bin:/usr/bin:/bin"}) {
			t.Errorf("config: user %q entrypoint %q env %q", c.User, c.Entrypoint, c.Env)
		}
		for k, v := range map[string]string{
			"org.opencontainers.image.source":   Source,
			"org.opencontainers.image.version":  "v0.3.1",
			"org.opencontainers.image.revision": "abc123",
			"org.opencontainers.image.created":  "2023-11-14T22:13:20Z",
		} {
			if c.Labels[k] != v {
				t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
			}
		}
		want, _ := os.ReadFile(static)
		files := layerFiles(t, img)
		for _, p := range []string{"usr/local/bin/hyperpod-kube-controller", "usr/local/bin/hyperpodrun"} {
			h, ok := files[p]
			if !ok || h.Mode != 0o755 || h.Uid != 0 || !bytes.Equal(h.data, want) {
				t.Errorf("%s: present %v mode %o uid %d, want the program, root-owned, 0755", p, ok, h.Mode, h.Uid)
			}
		}
		if h := files["tmp/"]; h.Mode != 0o1777 || h.Typeflag != tar.TypeDir {
			t.Errorf("/tmp mode %o, want 1777", h.Mode)
		}
		if h := files["home/nonroot/"]; h.Uid != 65532 {
			t.Errorf("/home/nonroot owner %d, want 65532", h.Uid)
		}
		if !strings.Contains(string(files["etc/passwd"].data), ":65532:65532:") {
			t.Errorf("/etc/passwd %q lacks user 65532", files["etc/passwd"].data)
		}
	}
	if digests[0] != digests[1] {
		t.Errorf("two builds of the same inputs: %s and %s", digests[0], digests[1])
	}
}

type layerFile struct {
	tar.Header
	data []byte
}

func layerFiles(t *testing.T, img v1.Image) map[string]layerFile {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	m := map[string]layerFile{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return m
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		m[h.Name] = layerFile{Header: *h, data: b}
	}
}

// -push takes the credentials `docker login` stores ($DOCKER_CONFIG's
// config.json); without them a registry with auth refuses, and the error
// says to log in.
func TestPushUsesDockerLogin(t *testing.T) {
	_, static := cPrograms(t)
	reg := ctrdtest.StartRegistryWithAuth(t, "builder", "s3cret")
	ref := reg.Host + "/hyperpodrun/hyperpod-kube-controller:v0.1"
	args := []string{"-controller", static, "-hyperpodrun", static, "-push", ref}

	t.Setenv("DOCKER_CONFIG", t.TempDir())
	var stdout, stderr bytes.Buffer
	if code := run(args, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "docker login "+reg.Host) {
		t.Errorf("without credentials: exit %d, stderr %q; want 1 saying docker login %s", code, stderr.String(), reg.Host)
	}

	cfg := t.TempDir()
	auth := base64.StdEncoding.EncodeToString([]byte("builder:s3cret"))
	if err := os.WriteFile(filepath.Join(cfg, "config.json"), []byte(`{"auths":{"`+reg.Host+`":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", cfg)
	stdout.Reset()
	stderr.Reset()
	if code := run(args, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "pushed "+ref) {
		t.Fatalf("with docker login's credentials: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
}

func TestPushHint(t *testing.T) {
	for _, tc := range []struct{ err, want string }{
		{"PUT https://r.example.com/v2/x/blobs: UNAUTHORIZED: authentication required", "docker login r.example.com"},
		{"DENIED: requested access to the resource is denied", "docker login r.example.com"},
		{`Get "https://10.1.2.3:5000/v2/": http: server gave HTTP response to HTTPS client`, "add -insecure"},
		{"dial tcp: connection refused", ""},
	} {
		if got := pushHint(errors.New(tc.err), "r.example.com/x:v1"); tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("%q: hint %q, want %q", tc.err, got, tc.want)
		}
	}
}

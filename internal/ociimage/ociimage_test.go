package ociimage_test

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/hyperpodrun/hyperpodrun/internal/ctrdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/ociimage"
)

// tarEntry is what a layer holds at one path.
type tarEntry struct {
	typ      byte
	mode     int64
	uid, gid int
	data     string
	link     string
	mtime    time.Time
}

// entries reads the image's only layer, in order.
func entries(t *testing.T, img v1.Image) ([]string, map[string]tarEntry) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d %v, want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var order []string
	m := map[string]tarEntry{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if _, dup := m[h.Name]; dup {
			t.Errorf("%s is in the layer twice", h.Name)
		}
		order = append(order, h.Name)
		m[h.Name] = tarEntry{typ: h.Typeflag, mode: h.Mode, uid: h.Uid, gid: h.Gid, data: string(b), link: h.Linkname, mtime: h.ModTime}
	}
	return order, m
}

func sampleSpec(t *testing.T) ociimage.Spec {
	src := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(src, []byte("#!/bin/sh\necho hi\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return ociimage.Spec{
		Files: []ociimage.File{
			{Path: "usr/local/bin/prog", Source: src, Mode: 0o755},
			{Path: "usr/local/bin/alias", Link: "prog"},
			{Path: "tmp/", Mode: 0o1777},
			{Path: "etc/passwd", Data: []byte("nonroot:x:65532:65532::/home/nonroot:/sbin/nologin\n")},
			{Path: "home/nonroot/", Mode: 0o700, UID: 65532, GID: 65532},
		},
		Env:        []string{"A=1"},
		Entrypoint: []string{"prog"},
		Cmd:        []string{"--help"},
		User:       "65532:65532",
		WorkingDir: "/home/nonroot",
		Labels:     map[string]string{"org.opencontainers.image.source": "https://example.com/src"},
	}
}

func TestBuildLayerContents(t *testing.T) {
	img, err := ociimage.Build(sampleSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	order, m := entries(t, img)
	want := map[string]tarEntry{
		"etc/":                {typ: tar.TypeDir, mode: 0o755},
		"etc/passwd":          {typ: tar.TypeReg, mode: 0o644, data: "nonroot:x:65532:65532::/home/nonroot:/sbin/nologin\n"},
		"home/":               {typ: tar.TypeDir, mode: 0o755},
		"home/nonroot/":       {typ: tar.TypeDir, mode: 0o700, uid: 65532, gid: 65532},
		"tmp/":                {typ: tar.TypeDir, mode: 0o1777},
		"usr/":                {typ: tar.TypeDir, mode: 0o755},
		"usr/local/":          {typ: tar.TypeDir, mode: 0o755},
		"usr/local/bin/":      {typ: tar.TypeDir, mode: 0o755},
		"usr/local/bin/alias": {typ: tar.TypeSymlink, mode: 0o777, link: "prog"},
		"usr/local/bin/prog":  {typ: tar.TypeReg, mode: 0o755, data: "#!/bin/sh\necho hi\n"},
	}
	for p, w := range want {
		w.mtime = time.Unix(0, 0)
		g, ok := m[p]
		if !ok {
			t.Errorf("the layer lacks %s", p)
			continue
		}
		if !g.mtime.Equal(w.mtime) {
			t.Errorf("%s: mtime %v, want the epoch (reproducible)", p, g.mtime)
		}
		g.mtime = w.mtime
		if g != w {
			t.Errorf("%s: %+v, want %+v", p, g, w)
		}
	}
	if len(m) != len(want) {
		t.Errorf("the layer holds %v, want only %d entries", order, len(want))
	}
	// A directory comes before what it holds (extractors need it).
	seen := map[string]bool{}
	for _, p := range order {
		if d := filepath.Dir(strings.TrimSuffix(p, "/")); d != "." && !seen[d+"/"] {
			t.Errorf("%s comes before its directory %s/ (order %v)", p, d, order)
		}
		seen[p] = true
	}
}

func TestBuildConfig(t *testing.T) {
	img, err := ociimage.Build(sampleSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !reflect.DeepEqual(c.Env, []string{ociimage.DefaultPath, "A=1"}) {
		t.Errorf("Env %q: want the default PATH, then the spec's", c.Env)
	}
	if !reflect.DeepEqual(c.Entrypoint, []string{"prog"}) || !reflect.DeepEqual(c.Cmd, []string{"--help"}) {
		t.Errorf("Entrypoint %q Cmd %q", c.Entrypoint, c.Cmd)
	}
	if c.User != "65532:65532" || c.WorkingDir != "/home/nonroot" {
		t.Errorf("User %q WorkingDir %q", c.User, c.WorkingDir)
	}
	if c.Labels["org.opencontainers.image.source"] != "https://example.com/src" || len(c.Labels) != 1 {
		t.Errorf("Labels %v", c.Labels)
	}
	if cf.OS != "linux" || cf.Architecture == "" || !cf.Created.Time.Equal(time.Unix(0, 0)) {
		t.Errorf("os %q arch %q created %v", cf.OS, cf.Architecture, cf.Created)
	}
	// A PATH of the spec's own replaces the default.
	s := sampleSpec(t)
	s.Env = []string{"PATH=/opt/bin"}
	img, _ = ociimage.Build(s)
	cf, _ = img.ConfigFile()
	if !reflect.DeepEqual(cf.Config.Env, []string{"PATH=/opt/bin"}) {
		t.Errorf("Env %q, want only the spec's PATH", cf.Config.Env)
	}
}

func digest(t *testing.T, s ociimage.Spec) string {
	t.Helper()
	img, err := ociimage.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func TestBuildIsReproducible(t *testing.T) {
	s := sampleSpec(t)
	first := digest(t, s)
	// Another build, and the same files listed in another order, give the
	// same image; the source file's own mtime does not matter.
	if err := os.Chtimes(s.Files[0].Source, time.Now(), time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if d := digest(t, s); d != first {
		t.Errorf("a second build is %s, want %s", d, first)
	}
	rev := s
	rev.Files = append([]ociimage.File(nil), s.Files...)
	for i, j := 0, len(rev.Files)-1; i < j; i, j = i+1, j-1 {
		rev.Files[i], rev.Files[j] = rev.Files[j], rev.Files[i]
	}
	if d := digest(t, rev); d != first {
		t.Errorf("the files in reverse order give %s, want %s", d, first)
	}
	// Any change of input changes it.
	for name, change := range map[string]func(*ociimage.Spec){
		"content": func(s *ociimage.Spec) { s.Files[3].Data = []byte("x") },
		"mode":    func(s *ociimage.Spec) { s.Files[2].Mode = 0o755 },
		"created": func(s *ociimage.Spec) { s.Created = time.Unix(1700000000, 0) },
		"label":   func(s *ociimage.Spec) { s.Labels = map[string]string{"v": "2"} },
		"user":    func(s *ociimage.Spec) { s.User = "0" },
	} {
		c := sampleSpec(t)
		c.Files[0].Source = s.Files[0].Source
		change(&c)
		if d := digest(t, c); d == first {
			t.Errorf("changing the %s kept the digest %s", name, d)
		}
	}
}

func TestBuildRefusesBadFiles(t *testing.T) {
	for _, tc := range []struct {
		files []ociimage.File
		want  string
	}{
		{[]ociimage.File{{Path: "a", Data: []byte("1")}, {Path: "a", Data: []byte("2")}}, "listed twice"},
		{[]ociimage.File{{Path: "a", Data: []byte("1")}, {Path: "a/b", Data: []byte("2")}}, "not a directory"},
		{[]ociimage.File{{Path: "../etc/passwd", Data: []byte("1")}}, "inside the image"},
		{[]ociimage.File{{Path: "/", Mode: 0o755}}, "inside the image"},
		{[]ociimage.File{{Path: "bin/x"}}, "give Source, Data"},
		{[]ociimage.File{{Path: "bin/x", Source: "/nonexistent/x"}}, "/nonexistent/x"},
	} {
		_, err := ociimage.Build(ociimage.Spec{Files: tc.files})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one saying %q", tc.files, err, tc.want)
		}
	}
}

// WriteTarball's file is a `docker save` archive: manifest.json names the
// tag, and reading it back gives the same image.
func TestWriteTarball(t *testing.T) {
	img, err := ociimage.Build(sampleSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "img.tar")
	const ref = "registry.example.com/team/prog:v1"
	if err := ociimage.WriteTarball(img, ref, p); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(ref)
	back, err := tarball.ImageFromPath(p, &tag)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if got, _ := back.Digest(); got != want {
		t.Errorf("read back %s, want %s", got, want)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(p) })
	if err != nil || len(m) != 1 || !reflect.DeepEqual(m[0].RepoTags, []string{ref}) {
		t.Errorf("manifest.json: %+v %v, want RepoTags [%s]", m, err, ref)
	}
	if err := ociimage.WriteTarball(img, "Not A Ref", filepath.Join(t.TempDir(), "x.tar")); err == nil || !strings.Contains(err.Error(), "host/repository:tag") {
		t.Errorf("a bad reference: %v", err)
	}
}

// Push to a real registry (Debian's docker-registry on loopback, plain
// HTTP, basic auth): the pulled image is the pushed one; a wrong password
// is refused.
func TestPushToARealRegistry(t *testing.T) {
	reg := ctrdtest.StartRegistryWithAuth(t, "builder", "s3cret")
	img, err := ociimage.Build(sampleSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ref := reg.Host + "/team/prog:v1"
	pinned, err := ociimage.Push(ctx, img, ref, ociimage.PushOptions{Auth: &authn.Basic{Username: "builder", Password: "s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if pinned != reg.Host+"/team/prog@"+want.String() {
		t.Errorf("Push returned %q, want the reference pinned to %s", pinned, want)
	}
	for _, r := range []string{ref, pinned} {
		pr, err := name.ParseReference(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := remote.Image(pr, remote.WithContext(ctx), remote.WithAuth(&authn.Basic{Username: "builder", Password: "s3cret"}))
		if err != nil {
			t.Fatalf("pull %s: %v", r, err)
		}
		if d, _ := got.Digest(); d != want {
			t.Errorf("pulled %s as %s, want %s", r, d, want)
		}
		cf, err := got.ConfigFile()
		if err != nil || cf.Config.User != "65532:65532" {
			t.Errorf("pulled config: %+v %v", cf, err)
		}
	}
	_, err = ociimage.Push(ctx, img, reg.Host+"/team/prog:v2", ociimage.PushOptions{Auth: &authn.Basic{Username: "builder", Password: "wrong"}})
	if err == nil || !strings.Contains(err.Error(), "UNAUTHORIZED") && !strings.Contains(err.Error(), "401") {
		t.Errorf("a wrong password: %v, want refused", err)
	}
	if _, err := ociimage.Push(ctx, img, "no tag here!", ociimage.PushOptions{}); err == nil || !strings.Contains(err.Error(), "host/repository:tag") {
		t.Errorf("a bad reference: %v", err)
	}
}

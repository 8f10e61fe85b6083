// Package ociimage builds container images from files on the host, without
// a Docker daemon or a base image: one layer of files plus an image config,
// pushed to a registry or written as a tarball that `docker load` and
// `ctr images import` read (go-containerregistry underneath).
//
// Builds are reproducible: every file's mtime is Spec.Created (the Unix
// epoch by default), owners are numeric, entries are sorted by path, so the
// same inputs give the same image digest on any machine.
package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultPath is the PATH an image gets when Spec.Env sets none.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// File is one entry of an image layer.
type File struct {
	// Path inside the image, relative ("bin/busybox"); a trailing slash
	// makes it a directory ("tmp/").
	Path string
	// Source is a host file to copy; else Data is the content.
	Source string
	Data   []byte
	// Mode is the permission bits (and setuid/setgid/sticky: 0o1777);
	// 0 means 0644 for a file, 0755 for a directory.
	Mode int64
	// Link makes Path a symbolic link to Link.
	Link string
	// UID and GID own the entry (default root).
	UID, GID int
}

// Spec describes an image: one layer of Files, and its config.
type Spec struct {
	Files []File
	// Env is the environment ("K=V"); DefaultPath is added when no entry
	// sets PATH.
	Env        []string
	Entrypoint []string
	Cmd        []string
	// User runs the entrypoint ("65532:65532"; "" is root).
	User       string
	WorkingDir string
	// Labels are the config's labels (org.opencontainers.image.*).
	Labels map[string]string
	// OS and Architecture default to linux and the running GOARCH.
	OS, Architecture string
	// Created is the config's creation time and every file's mtime; zero
	// is the Unix epoch, so a build is reproducible.
	Created time.Time
}

// Build makes the image of spec: a layer of its files over an empty base.
func Build(spec Spec) (v1.Image, error) {
	created := spec.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()
	layer, err := layerAt(spec.Files, created)
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: created}, CreatedBy: "hyperpodrun ociimage", Comment: fmt.Sprintf("%d files", len(spec.Files))}})
	if err != nil {
		return nil, fmt.Errorf("append the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = spec.OS, spec.Architecture
	if cf.OS == "" {
		cf.OS = "linux"
	}
	if cf.Architecture == "" {
		cf.Architecture = runtime.GOARCH
	}
	cf.Created = v1.Time{Time: created}
	env := spec.Env
	hasPath := false
	for _, e := range env {
		if strings.HasPrefix(e, "PATH=") {
			hasPath = true
		}
	}
	if !hasPath {
		env = append([]string{DefaultPath}, env...)
	}
	cf.Config.Env = env
	cf.Config.Entrypoint, cf.Config.Cmd = spec.Entrypoint, spec.Cmd
	cf.Config.User, cf.Config.WorkingDir = spec.User, spec.WorkingDir
	if len(spec.Labels) > 0 {
		cf.Config.Labels = map[string]string{}
		for k, v := range spec.Labels {
			cf.Config.Labels[k] = v
		}
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set the image config: %w", err)
	}
	return img, nil
}

// Layer tars files into one layer (mtimes at the Unix epoch).
func Layer(files []File) (v1.Layer, error) { return layerAt(files, time.Unix(0, 0).UTC()) }

// entry is one tar header and, for a regular file, where its data is.
type entry struct {
	h    *tar.Header
	file *File
}

// layerAt tars files into one uncompressed layer: sorted by path, parent
// directories made (0755) where files do not name them, mtimes mtime.
func layerAt(files []File, mtime time.Time) (v1.Layer, error) {
	entries := map[string]*entry{}
	explicit := map[string]bool{}
	for i := range files {
		f := &files[i]
		p := path.Clean(strings.TrimPrefix(f.Path, "/"))
		if p == "." || p == ".." || strings.HasPrefix(p, "../") {
			return nil, fmt.Errorf("file %q: the path must name something inside the image", f.Path)
		}
		if explicit[p] {
			return nil, fmt.Errorf("file %q: listed twice", f.Path)
		}
		explicit[p] = true
		h := &tar.Header{Name: p, Mode: f.Mode, Uid: f.UID, Gid: f.GID, ModTime: mtime}
		switch {
		case strings.HasSuffix(f.Path, "/"):
			h.Typeflag, h.Name = tar.TypeDir, p+"/"
			if h.Mode == 0 {
				h.Mode = 0o755
			}
			entries[p] = &entry{h: h}
		case f.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.Link, 0o777
			entries[p] = &entry{h: h}
		default:
			if f.Source == "" && f.Data == nil {
				return nil, fmt.Errorf("file %q: give Source, Data, Link, or a trailing slash for a directory", f.Path)
			}
			h.Typeflag = tar.TypeReg
			if h.Mode == 0 {
				h.Mode = 0o644
			}
			entries[p] = &entry{h: h, file: f}
		}
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = &entry{h: &tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: mtime}}
			}
		}
	}
	// A file listed under a path that another lists as a file or link.
	for p, e := range entries {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if entries[d].h.Typeflag != tar.TypeDir {
				return nil, fmt.Errorf("file %q lies under %q, which is not a directory", e.h.Name, d)
			}
		}
	}
	names := make([]string, 0, len(entries))
	for p := range entries {
		names = append(names, p)
	}
	// Sorted by path components, so a directory precedes what it holds.
	sort.Slice(names, func(i, j int) bool {
		return strings.ReplaceAll(names[i], "/", "\x00") < strings.ReplaceAll(names[j], "/", "\x00")
	})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range names {
		e := entries[p]
		if e.file == nil {
			if err := tw.WriteHeader(e.h); err != nil {
				return nil, fmt.Errorf("tar %s: %w", p, err)
			}
			continue
		}
		data := e.file.Data
		if e.file.Source != "" {
			b, err := os.ReadFile(e.file.Source)
			if err != nil {
				return nil, fmt.Errorf("file %q: %w", e.file.Path, err)
			}
			data = b
		}
		e.h.Size = int64(len(data))
		if err := tw.WriteHeader(e.h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", p, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}

// PushOptions says how to reach the registry.
type PushOptions struct {
	// Auth authenticates to the registry; nil looks the registry up in
	// the Docker config (~/.docker/config.json, $DOCKER_CONFIG: what
	// `docker login` writes), anonymous when it has none.
	Auth authn.Authenticator
	// Insecure allows plain HTTP to any registry; loopback, localhost and
	// private (RFC 1918) addresses always may.
	Insecure bool
}

// Push uploads img to the registry as ref ("host/repo:tag") and returns
// the reference pinned to the pushed digest ("host/repo@sha256:...").
func Push(ctx context.Context, img v1.Image, ref string, o PushOptions) (string, error) {
	var nopts []name.Option
	if o.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	tag, err := name.NewTag(ref, nopts...)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w (want host/repository:tag)", ref, err)
	}
	ropts := []remote.Option{remote.WithContext(ctx)}
	if o.Auth != nil {
		ropts = append(ropts, remote.WithAuth(o.Auth))
	} else {
		ropts = append(ropts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	if err := remote.Write(tag, img, ropts...); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return tag.Context().Digest(d.String()).String(), nil
}

// WriteTarball writes img as a `docker save` tarball tagged ref, which
// `docker load -i` and `ctr images import` read.
func WriteTarball(img v1.Image, ref, file string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w (want host/repository:tag)", ref, err)
	}
	tmp := file + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", file, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		os.Remove(tmp)
		return errors.Join(fmt.Errorf("write %s", file), err)
	}
	return nil
}

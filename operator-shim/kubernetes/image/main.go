// Command image builds the image of the ElasticJob controller, which is
// also the job pods' launcher image (docs/kubernetes.md, "Install"): a
// static hyperpod-kube-controller and a static hyperpodrun in
// /usr/local/bin, nothing else but /tmp and a passwd entry for the
// non-root user 65532 it runs as. The job pods' init container runs
// `hyperpod-kube-controller install /.hyperpodrun` from it, which copies
// both programs into the pod, so they must run in any image: a binary
// that needs a dynamic loader is refused.
//
// `make image` builds the two binaries and runs it:
//
//	go run ./operator-shim/kubernetes/image -controller bin/hyperpod-kube-controller-static \
//	  -hyperpodrun bin/hyperpodrun-static [-push registry.example.com/hyperpodrun/hyperpod-kube-controller:v0.1] [-o image.tar]
//
// Without -push it writes a tarball for `docker load -i` or
// `ctr images import`. The build is reproducible: the same binaries and
// flags (and $SOURCE_DATE_EPOCH) give the same digest.
package main

import (
	"context"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/ociimage"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/manifests"
)

// What the image holds and how it runs.
const (
	// BinDir holds both programs; it is first on the image's PATH, so the
	// init container's command `hyperpod-kube-controller install` finds it.
	BinDir = "/usr/local/bin"
	// User is the non-root user the controller's Deployment runs as.
	User = "65532:65532"
	// Source is the org.opencontainers.image.source label.
	Source = "https://github.com/hyperpodrun/hyperpodrun"
	// DefaultTarball is where the image goes without -push or -o.
	DefaultTarball = "bin/hyperpod-kube-controller-image.tar"
	// DefaultAgentTarball is where the agent's image (-agent) goes
	// without -push or -o.
	DefaultAgentTarball = "bin/hyperpod-agent-image.tar"
)

// StaticBuild is how `make image` builds each program static (cgo stays on:
// package devices links NVML's loader; glibc's static libc is linked in).
const StaticBuild = `CGO_ENABLED=1 go build -tags osusergo,netgo -ldflags '-linkmode external -extldflags "-static"'`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// options are the command's flags.
type options struct {
	controller, hyperpodrun string
	agent                   string
	push, out, tag          string
	version, revision       string
	insecure                bool
}

func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("image", flag.ContinueOnError)
	fl.SetOutput(stderr)
	var o options
	fl.StringVar(&o.controller, "controller", "bin/hyperpod-kube-controller-static", "a static hyperpod-kube-controller")
	fl.StringVar(&o.hyperpodrun, "hyperpodrun", "bin/hyperpodrun-static", "a static hyperpodrun (make build writes bin/hyperpodrun-static)")
	fl.StringVar(&o.agent, "agent", "", "build the node agent's image instead (the hyperpod-agent DaemonSet's): this static hyperpod-agent and -hyperpodrun, run as root (make agent-image)")
	fl.StringVar(&o.push, "push", "", "push the image as this reference (registry/repository:tag); credentials from `docker login`")
	fl.StringVar(&o.out, "o", "", "write the image as a tarball for `docker load -i` / `ctr images import` (default "+DefaultTarball+" without -push)")
	fl.StringVar(&o.tag, "tag", "", "the tarball's image reference (default -push's, else "+manifests.Image+")")
	fl.StringVar(&o.version, "version", "", "org.opencontainers.image.version (make image: git describe; default: the controller's Go module version, else dev)")
	fl.StringVar(&o.revision, "revision", "", "org.opencontainers.image.revision (make image: the git commit; default: the controller's VCS stamp)")
	fl.BoolVar(&o.insecure, "insecure", false, "push over plain HTTP (loopback and private addresses always may)")
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fl.NArg() > 0 {
		fmt.Fprintf(stderr, "image: unexpected arguments %q (everything is a flag; see -help)\n", fl.Args())
		return 2
	}
	tarball, tag, build, use := DefaultTarball, manifests.Image, Spec, "the controller Deployment's image and --launcher-image (docs/kubernetes.md)"
	main := o.controller
	if o.agent != "" {
		tarball, tag, build, use = DefaultAgentTarball, manifests.AgentImage, AgentSpec, "the hyperpod-agent DaemonSet's image (gen -agent-image; docs/kubernetes.md)"
		main = o.agent
	}
	if o.push == "" && o.out == "" {
		o.out = tarball
	}
	if o.tag == "" {
		o.tag = tag
		if o.push != "" {
			o.tag = o.push
		}
	}
	spec, err := build(main, o.hyperpodrun, o.version, o.revision, os.Getenv("SOURCE_DATE_EPOCH"))
	if err != nil {
		fmt.Fprintf(stderr, "image: %v\n", err)
		return 1
	}
	img, err := ociimage.Build(spec)
	if err != nil {
		fmt.Fprintf(stderr, "image: %v\n", err)
		return 1
	}
	digest, err := img.Digest()
	if err != nil {
		fmt.Fprintf(stderr, "image: %v\n", err)
		return 1
	}
	if o.out != "" {
		if err := ociimage.WriteTarball(img, o.tag, o.out); err != nil {
			fmt.Fprintf(stderr, "image: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "wrote %s: %s (%s, %s)\nload it with: docker load -i %s   or   ctr -n k8s.io images import %s\n",
			o.out, o.tag, digest, spec.Labels["org.opencontainers.image.version"], o.out, o.out)
	}
	if o.push != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		pinned, err := ociimage.Push(ctx, img, o.push, ociimage.PushOptions{Insecure: o.insecure})
		if err != nil {
			fmt.Fprintf(stderr, "image: %v%s\n", err, pushHint(err, o.push))
			return 1
		}
		fmt.Fprintf(stdout, "pushed %s\n  = %s\nuse it as %s\n", o.push, pinned, use)
	}
	return 0
}

// pushHint names the likely fix of a failed push.
func pushHint(err error, ref string) string {
	reg := ref
	if i := strings.IndexByte(ref, '/'); i > 0 {
		reg = ref[:i]
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "UNAUTHORIZED") || strings.Contains(msg, "DENIED") || strings.Contains(msg, "401") || strings.Contains(msg, "403"):
		return fmt.Sprintf(" (log in first: docker login %s; the credentials in ~/.docker/config.json or $DOCKER_CONFIG are used)", reg)
	case strings.Contains(msg, "http: server gave HTTP response to HTTPS client"):
		return " (the registry speaks plain HTTP: add -insecure)"
	}
	return ""
}

// Spec is the image of the two programs: both checked static and of one
// architecture, labelled with version and revision (defaults from the
// controller's Go build info), created at sourceDateEpoch (Unix seconds;
// "" is the controller's VCS time, else the epoch).
func Spec(controller, hyperpodrun, version, revision, sourceDateEpoch string) (ociimage.Spec, error) {
	rel := strings.TrimPrefix(BinDir, "/") + "/"
	return programSpec(program{
		path: controller, name: "hyperpod-kube-controller", user: User,
		description: "hyperpodrun's ElasticJob controller, and the job pods' launcher: hyperpod-kube-controller and a static hyperpodrun",
		files: []ociimage.File{
			{Path: "etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
			{Path: "etc/group", Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
			{Path: "home/nonroot/", Mode: 0o700, UID: 65532, GID: 65532},
		},
		// `install` copies the hyperpodrun next to its own executable.
		hyperpodrun: []string{rel + "hyperpodrun"},
	}, hyperpodrun, version, revision, sourceDateEpoch)
}

// AgentSpec is the node agent's image (the hyperpod-agent DaemonSet's,
// AgentImage): a static hyperpod-agent, its entrypoint, run as root (it
// reads the host's devices and talks to containerd), and a static
// hyperpodrun as /usr/local/bin/hyperpodrun and hyperpodrun-static (the
// containerd DaemonSet's init container copies the latter for the
// containers whose image has none). Checked and labelled as Spec.
func AgentSpec(agent, hyperpodrun, version, revision, sourceDateEpoch string) (ociimage.Spec, error) {
	rel := strings.TrimPrefix(BinDir, "/") + "/"
	return programSpec(program{
		path: agent, name: "hyperpod-agent",
		description: "hyperpodrun's node agent (hyperpod-agent) with a static hyperpodrun",
		files: []ociimage.File{
			{Path: "etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\n")},
			{Path: "etc/group", Data: []byte("root:x:0:\n")},
		},
		hyperpodrun: []string{rel + "hyperpodrun", rel + "hyperpodrun-static"},
	}, hyperpodrun, version, revision, sourceDateEpoch)
}

// program is the main program of an image and what else the image holds.
type program struct {
	path, name, description, user string
	files                         []ociimage.File
	// hyperpodrun are the paths the static hyperpodrun is put at.
	hyperpodrun []string
}

// programSpec is p's image with a static hyperpodrun: both checked static
// and of one architecture, labelled with version and revision (defaults
// from p's Go build info), created at sourceDateEpoch (Unix seconds; ""
// is p's VCS time, else the epoch).
func programSpec(p program, hyperpodrun, version, revision, sourceDateEpoch string) (ociimage.Spec, error) {
	arch, err := CheckStatic(p.path, p.name)
	if err != nil {
		return ociimage.Spec{}, err
	}
	harch, err := CheckStatic(hyperpodrun, "hyperpodrun")
	if err != nil {
		return ociimage.Spec{}, err
	}
	if arch != harch {
		return ociimage.Spec{}, fmt.Errorf("%s is for %s but %s is for %s: build both for one architecture (GOARCH)", p.path, arch, hyperpodrun, harch)
	}
	info := buildInfo(p.path)
	if version == "" {
		version = info.version
	}
	if revision == "" {
		revision = info.revision
	}
	created := info.time
	if sourceDateEpoch != "" {
		sec, err := strconv.ParseInt(sourceDateEpoch, 10, 64)
		if err != nil || sec < 0 {
			return ociimage.Spec{}, fmt.Errorf("$SOURCE_DATE_EPOCH %q: want Unix seconds (git log -1 --format=%%ct)", sourceDateEpoch)
		}
		created = time.Unix(sec, 0).UTC()
	}
	labels := map[string]string{
		"org.opencontainers.image.title":       p.name,
		"org.opencontainers.image.description": p.description,
		"org.opencontainers.image.source":      Source,
		"org.opencontainers.image.version":     version,
	}
	if revision != "" {
		labels["org.opencontainers.image.revision"] = revision
	}
	if !created.IsZero() {
		labels["org.opencontainers.image.created"] = created.Format(time.RFC3339)
	}
	rel := strings.TrimPrefix(BinDir, "/") + "/"
	files := []ociimage.File{{Path: rel + p.name, Source: p.path, Mode: 0o755}}
	for _, h := range p.hyperpodrun {
		files = append(files, ociimage.File{Path: h, Source: hyperpodrun, Mode: 0o755})
	}
	files = append(files, ociimage.File{Path: "tmp/", Mode: 0o1777})
	files = append(files, p.files...)
	return ociimage.Spec{
		Files:        files,
		Env:          []string{"PATH=" + BinDir + ":/usr/bin:/bin"},
		Entrypoint:   []string{BinDir + "/" + p.name},
		User:         p.user,
		WorkingDir:   "/",
		Labels:       labels,
		Architecture: arch,
		Created:      created,
	}, nil
}

// CheckStatic returns the GOARCH of the ELF executable at path, or an
// error naming the fix when it is missing, not an ELF executable, or needs
// a dynamic loader (a PT_INTERP program header): such a binary would not
// start in the job's image, which may have no or another libc.
func CheckStatic(path, program string) (string, error) {
	f, err := elf.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%s: no %s there: build it static first (make image does: %s -o %s ./cmd/%s)", path, program, StaticBuild, path, program)
	}
	if err != nil {
		return "", fmt.Errorf("%s is not an ELF executable (%v): give a static Linux build of %s", path, err, program)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", fmt.Errorf("%s is an ELF %s, not an executable: give a static Linux build of %s", path, f.Type, program)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		interp := "a dynamic loader"
		if b, err := io.ReadAll(io.LimitReader(p.Open(), 256)); err == nil {
			interp = strings.TrimRight(string(b), "\x00")
		}
		return "", fmt.Errorf("%s is dynamically linked (it needs %s), so it would not run in the job pods' images: build it static: %s -o %s ./cmd/%s (make image does)",
			path, interp, StaticBuild, path, program)
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	}
	return "", fmt.Errorf("%s is for %s: build %s for amd64 or arm64", path, f.Machine, program)
}

// stamp is what a Go binary says about its own build.
type stamp struct {
	version, revision string
	time              time.Time
}

// buildInfo reads the Go module version and VCS stamp of a binary (built
// with -buildvcs); version "dev" when it has none.
func buildInfo(path string) stamp {
	s := stamp{version: "dev"}
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return s
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		s.version = v
	}
	dirty := false
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			s.revision = kv.Value
		case "vcs.time":
			s.time, _ = time.Parse(time.RFC3339, kv.Value)
		case "vcs.modified":
			dirty = kv.Value == "true"
		}
	}
	if s.version == "dev" && s.revision != "" {
		s.version = s.revision[:min(12, len(s.revision))]
		if dirty {
			s.version += "-dirty"
		}
	}
	return s
}

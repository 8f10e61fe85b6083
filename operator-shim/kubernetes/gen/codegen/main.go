// Command codegen runs the Kubernetes code generators of the hyperpodrun.io
// API at the versions the Makefile pins (`make generate` runs it, then the
// manifests generator):
//
//   - controller-gen's object generator writes the deep copies
//     (apis/v1alpha1/zz_generated.deepcopy.go),
//   - controller-gen's crd generator writes the CRDs from the types, their
//     doc comments and +kubebuilder markers (manifests/crd/*.yaml),
//   - client-gen writes the typed clientset (generated/clientset/).
//
// Run it from the repository root:
//
//	go run ./operator-shim/kubernetes/gen/codegen \
//		-controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 \
//		-client-gen k8s.io/code-generator/cmd/client-gen@v0.37.2
//
// Each generator runs through `go run module/cmd@version` (from the Go module
// proxy; nothing to install). The generators write into a temporary
// directory, whose files then replace the committed ones, so a file that is
// no longer generated goes too. -check writes nothing: it exits 1 and lists
// the committed files that differ from the generators' output.
//
// It imports nothing of the API package, so it runs even while the API does
// not compile (a new type without its deep copy yet).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Module paths of the generated code.
const (
	module  = "github.com/hyperpodrun/hyperpodrun"
	apis    = "operator-shim/kubernetes/apis/v1alpha1"
	crdDir  = "operator-shim/kubernetes/manifests/crd"
	typedCS = "operator-shim/kubernetes/generated/clientset"
)

// Outputs are what the generators own, relative to the repository root:
// files, or directories whose every file is generated.
var Outputs = []string{
	apis + "/zz_generated.deepcopy.go",
	crdDir,
	typedCS,
}

// Tools are the generators, each as module/cmd@version.
type Tools struct {
	ControllerGen string
	ClientGen     string
}

// pinnedRE is a Go command path at an exact semantic version.
var pinnedRE = regexp.MustCompile(`^[a-z0-9.-]+(/[A-Za-z0-9._~-]+)+@v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

// Pinned says whether spec names a command at an exact version
// (path@vX.Y.Z), not a moving one (@latest, a branch, none).
func Pinned(spec string) bool { return pinnedRE.MatchString(spec) }

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("codegen", flag.ContinueOnError)
	fl.SetOutput(stderr)
	var t Tools
	fl.StringVar(&t.ControllerGen, "controller-gen", "", "controller-gen as module/cmd@version (the Makefile's CONTROLLER_GEN)")
	fl.StringVar(&t.ClientGen, "client-gen", "", "client-gen as module/cmd@version (the Makefile's CLIENT_GEN)")
	root := fl.String("root", ".", "the repository root")
	check := fl.Bool("check", false, "write nothing; exit 1 when a committed generated file is stale")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	for _, s := range []string{t.ControllerGen, t.ClientGen} {
		if !Pinned(s) {
			fmt.Fprintf(stderr, "codegen: %q is not a command at an exact version (want module/cmd@vX.Y.Z; run make generate)\n", s)
			return 2
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	changes, err := Check(ctx, *root, t, !*check)
	if err != nil {
		fmt.Fprintf(stderr, "codegen: %v\n", err)
		return 1
	}
	for _, c := range changes {
		if *check {
			fmt.Fprintf(stdout, "stale: %s\n", c)
		} else {
			fmt.Fprintf(stdout, "wrote: %s\n", c)
		}
	}
	if *check && len(changes) > 0 {
		fmt.Fprintln(stderr, "codegen: generated files are stale: run make generate")
		return 1
	}
	return 0
}

// Check runs the generators into a temporary directory and returns how the
// committed outputs under root differ from theirs; with install it then
// replaces the committed outputs by the fresh ones.
func Check(ctx context.Context, root string, t Tools, install bool) ([]Change, error) {
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return nil, fmt.Errorf("%s is not the repository root: %w", root, err)
	}
	out, err := os.MkdirTemp("", "hyperpodrun-codegen-")
	if err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	defer os.RemoveAll(out)
	if err := Generate(ctx, root, out, t); err != nil {
		return nil, err
	}
	committed, err := Snapshot(root)
	if err != nil {
		return nil, err
	}
	fresh, err := Snapshot(out)
	if err != nil {
		return nil, err
	}
	changes := Diff(committed, fresh)
	if install && len(changes) > 0 {
		if err := Install(out, root); err != nil {
			return nil, err
		}
	}
	return changes, nil
}

// Generate runs the generators on the API package under root and writes
// their output under out, at the same relative paths as Outputs.
func Generate(ctx context.Context, root, out string, t Tools) error {
	out, err := filepath.Abs(out)
	if err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	steps := [][]string{
		{t.ControllerGen,
			"object", "paths=./" + apis, "output:object:dir=" + filepath.Join(out, apis),
			"crd:crdVersions=v1", "output:crd:dir=" + filepath.Join(out, crdDir)},
		{t.ClientGen,
			"--go-header-file", os.DevNull, // client-gen adds "Code generated by client-gen. DO NOT EDIT."
			"--clientset-name", "versioned",
			"--fake-clientset=false",
			"--input-base", module + "/operator-shim/kubernetes",
			"--input", "apis/v1alpha1",
			"--output-dir", filepath.Join(out, typedCS),
			"--output-pkg", module + "/" + typedCS},
	}
	for _, s := range steps {
		cmd := exec.CommandContext(ctx, "go", append([]string{"run", s[0]}, s[1:]...)...)
		cmd.Dir = root
		var b bytes.Buffer
		cmd.Stdout, cmd.Stderr = &b, &b
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go run %s: %w\n%s", s[0], err, strings.TrimSpace(b.String()))
		}
	}
	return nil
}

// Snapshot reads the files of Outputs under dir, by slash-separated path
// relative to dir. A missing output is no files.
func Snapshot(dir string) (map[string][]byte, error) {
	files := map[string][]byte{}
	for _, o := range Outputs {
		err := filepath.WalkDir(filepath.Join(dir, o), func(p string, d fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			files[filepath.ToSlash(rel)] = b
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", o, err)
		}
	}
	return files, nil
}

// Change is one committed file that is not what the generators write.
type Change struct {
	Path string
	// Kind is "missing" (generated, not committed), "extra" (committed,
	// no longer generated) or "differs".
	Kind string
}

func (c Change) String() string { return c.Path + " (" + c.Kind + ")" }

// Diff compares the committed generated files with the fresh ones, sorted
// by path.
func Diff(committed, fresh map[string][]byte) []Change {
	var out []Change
	for p, b := range fresh {
		old, ok := committed[p]
		switch {
		case !ok:
			out = append(out, Change{p, "missing"})
		case !bytes.Equal(old, b):
			out = append(out, Change{p, "differs"})
		}
	}
	for p := range committed {
		if _, ok := fresh[p]; !ok {
			out = append(out, Change{p, "extra"})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Install replaces each of Outputs under root by its copy under out.
func Install(out, root string) error {
	fresh, err := Snapshot(out)
	if err != nil {
		return err
	}
	for _, o := range Outputs {
		if err := os.RemoveAll(filepath.Join(root, o)); err != nil {
			return fmt.Errorf("remove the old %s: %w", o, err)
		}
	}
	for p, b := range fresh {
		dst := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	return nil
}

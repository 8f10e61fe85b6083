package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

var root = filepath.Join("..", "..", "..", "..")

// pins reads the generators' pinned versions from the Makefile, as `make
// generate` passes them.
func pins(t *testing.T) Tools {
	t.Helper()
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	get := func(name string) string {
		m := regexp.MustCompile(`(?m)^` + name + `\s*:?=\s*(\S+)\s*$`).FindSubmatch(mk)
		if m == nil {
			t.Fatalf("the Makefile does not set %s", name)
		}
		return string(m[1])
	}
	return Tools{ControllerGen: get("CONTROLLER_GEN"), ClientGen: get("CLIENT_GEN")}
}

// The committed deep copies, CRDs and typed clientset are what the pinned
// generators write from today's API types: change types.go, then run make
// generate. (The example manifests built from the CRDs are checked by the
// manifests package's TestCommittedManifestsAreGenerated.)
func TestGeneratedFilesAreCurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs controller-gen and client-gen (built once from the Go module proxy)")
	}
	tools := pins(t)
	for _, s := range []string{tools.ControllerGen, tools.ClientGen} {
		if !Pinned(s) {
			t.Fatalf("the Makefile's %q is not pinned to a version", s)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	changes, err := Check(ctx, root, tools, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range changes {
		t.Errorf("%s: stale, run make generate", c)
	}
	committed, err := Snapshot(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"operator-shim/kubernetes/apis/v1alpha1/zz_generated.deepcopy.go",
		"operator-shim/kubernetes/manifests/crd/hyperpodrun.io_elasticjobs.yaml",
		"operator-shim/kubernetes/manifests/crd/hyperpodrun.io_elasticteams.yaml",
		"operator-shim/kubernetes/generated/clientset/versioned/typed/apis/v1alpha1/elasticjob.go",
	} {
		if _, ok := committed[want]; !ok {
			t.Errorf("%s is not generated", want)
		}
	}
	for p, b := range committed {
		if strings.HasSuffix(p, ".go") && !regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`).Match(b) {
			t.Errorf("%s lacks the standard generated-code header", p)
		}
	}
}

// make generate replaces the committed files and leaves no file that is
// no longer generated; -check writes nothing and fails on a stale file.
func TestCheckAndInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs controller-gen and client-gen")
	}
	tools := pins(t)
	// A copy of the module's API package and go.mod/go.sum, with one stale
	// file, one missing and one left over from a removed type.
	tree := t.TempDir()
	for _, p := range []string{"go.mod", "go.sum", apis + "/types.go", apis + "/doc.go", apis + "/register.go", crdDir + "/hyperpodrun.io_elasticteams.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(p, ".yaml") {
			b = bytes.Replace(b, []byte("maxItems: 64"), []byte("maxItems: 65"), 1)
		}
		writeFile(t, filepath.Join(tree, p), b)
	}
	writeFile(t, filepath.Join(tree, typedCS, "versioned/typed/apis/v1alpha1/oldkind.go"), []byte("package v1alpha1\n"))

	var stdout, stderr bytes.Buffer
	base := []string{"-root", tree, "-controller-gen", tools.ControllerGen, "-client-gen", tools.ClientGen}
	if code := run(append(base, "-check"), &stdout, &stderr); code != 1 {
		t.Fatalf("-check on a stale tree: exit %d, want 1\n%s%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{
		"stale: " + crdDir + "/hyperpodrun.io_elasticteams.yaml (differs)",
		"stale: " + crdDir + "/hyperpodrun.io_elasticjobs.yaml (missing)",
		"stale: " + apis + "/zz_generated.deepcopy.go (missing)",
		"stale: " + typedCS + "/versioned/typed/apis/v1alpha1/oldkind.go (extra)",
	} {
		if !strings.Contains(stdout.String(), want+"\n") {
			t.Errorf("-check does not report %q:\n%s", want, stdout.String())
		}
	}
	if _, err := os.Stat(filepath.Join(tree, apis, "zz_generated.deepcopy.go")); err == nil {
		t.Error("-check wrote files")
	}

	stdout.Reset()
	if code := run(base, &stdout, &stderr); code != 0 {
		t.Fatalf("generate: exit %d\n%s", code, stderr.String())
	}
	got, err := Snapshot(tree)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Snapshot(root)
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(want, got); len(d) != 0 {
		t.Errorf("after generate the tree differs from the committed files: %v", d)
	}
	if code := run(append(base, "-check"), &stdout, &stderr); code != 0 {
		t.Errorf("-check right after generate: exit %d\n%s", code, stderr.String())
	}
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestDiff(t *testing.T) {
	b := func(s string) []byte { return []byte(s) }
	for _, tc := range []struct {
		rule             string
		committed, fresh map[string][]byte
		want             []Change
	}{
		{"same files: nothing to do", map[string][]byte{"a": b("1")}, map[string][]byte{"a": b("1")}, nil},
		{"a changed file differs", map[string][]byte{"a": b("1")}, map[string][]byte{"a": b("2")}, []Change{{"a", "differs"}}},
		{"a new generated file is missing", map[string][]byte{}, map[string][]byte{"a": b("1")}, []Change{{"a", "missing"}}},
		{"a file no longer generated is extra", map[string][]byte{"a": b("1")}, map[string][]byte{}, []Change{{"a", "extra"}}},
		{"changes sorted by path", map[string][]byte{"c": b("1"), "b": b("1")}, map[string][]byte{"a": b("1"), "b": b("2")},
			[]Change{{"a", "missing"}, {"b", "differs"}, {"c", "extra"}}},
	} {
		if got := Diff(tc.committed, tc.fresh); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.rule, got, tc.want)
		}
	}
}

func TestPinned(t *testing.T) {
	for _, tc := range []struct {
		rule string
		spec string
		want bool
	}{
		{"an exact version is pinned", "sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0", true},
		{"a pre-release is pinned", "k8s.io/code-generator/cmd/client-gen@v0.37.0-rc.1", true},
		{"latest moves", "k8s.io/code-generator/cmd/client-gen@latest", false},
		{"no version moves", "k8s.io/code-generator/cmd/client-gen", false},
		{"a branch moves", "k8s.io/code-generator/cmd/client-gen@master", false},
		{"empty is not a tool", "", false},
		{"a flag is not a tool", "-x@v1.0.0", false},
	} {
		if got := Pinned(tc.spec); got != tc.want {
			t.Errorf("%s: Pinned(%q) = %v", tc.rule, tc.spec, got)
		}
	}
}

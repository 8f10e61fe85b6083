// Package archgraph draws the project's packages and their imports in
// layers (ARCHITECTURE.md's picture) and checks that no import runs from a
// lower layer to a higher one. The layers are a table here; `make
// architecture` rewrites the picture from `go list`, and a test fails when
// the committed picture is stale, when a package is in no layer, or when an
// import goes up a layer.
package archgraph

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"sort"
	"strings"
)

// Module is the project's module path.
const Module = "github.com/hyperpodrun/hyperpodrun"

// Layer is one band of the picture: its packages may import packages of
// their own layer and of the layers below, never above.
type Layer struct {
	Name string
	// Prefixes are package paths relative to the module; a prefix ending
	// in "/" takes every package under it.
	Prefixes []string
}

// Layers, lowest first.
var Layers = []Layer{
	{Name: "foundations: types, devices, processes, wire protocols, etcd plumbing", Prefixes: []string{
		"api", "devices", "devices/local", "launcher", "c10dstore", "internal/etcdconn", "internal/jsonscan",
		"internal/syncbuf", "internal/telemetry", "internal/ociimage", "internal/etcdembed", "internal/secretlease",
		"internal/tcpproxy", "internal/fsutil", "internal/tracestore", "internal/idlegc", "internal/quietlease", "checkpoint/control", "internal/archgraph", "operator-shim/kubernetes/apis/", "operator-shim/kubernetes/generated/",
	}},
	{Name: "records and decisions: the etcd layout owner and the pure engine", Prefixes: []string{
		"internal/fleet", "operator-shim/policy",
	}},
	{Name: "protocols over etcd", Prefixes: []string{
		"rendezvous", "checkpoint", "internal/etcdauth", "operator-shim/sim", "operator-shim/kubernetes/manifests",
		"operator-shim/kubernetes/podsup",
	}},
	{Name: "the programs' logic", Prefixes: []string{
		"agent", "agent/", "operator-shim", "operator-shim/coordinator", "operator-shim/kubernetes",
	}},
	{Name: "test support", Prefixes: []string{
		"internal/etcdtest", "internal/etcdtest/authfleet", "internal/testutil", "internal/testcluster", "internal/ctrdtest", "internal/kubetest", "internal/jaegertest",
	}},
	{Name: "commands, examples, benchmarks", Prefixes: []string{
		"cmd/", "examples/", "bench/", "internal/etcdconn/etcdflags", "operator-shim/kubernetes/gen", "operator-shim/kubernetes/gen/", "operator-shim/kubernetes/image",
		"internal/archgraph/",
	}},
}

// LayerOf returns the index of rel's layer (a package path relative to the
// module), or -1. The longest matching prefix wins.
func LayerOf(rel string) int {
	best, bestLen := -1, -1
	for i, l := range Layers {
		for _, p := range l.Prefixes {
			match := rel == p || strings.HasSuffix(p, "/") && strings.HasPrefix(rel, p)
			if match && len(p) > bestLen {
				best, bestLen = i, len(p)
			}
		}
	}
	return best
}

// Graph is each package's imports of the module's own packages (paths
// relative to the module), test files left out.
type Graph map[string][]string

// Load runs `go list` in dir (the module's root) and returns its graph.
func Load(dir string) (Graph, error) {
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, stderr.String())
	}
	g := Graph{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("decode go list: %w", err)
		}
		rel := relative(p.ImportPath)
		var own []string
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, Module+"/") {
				own = append(own, relative(imp))
			}
		}
		g[rel] = own
	}
	return g, nil
}

func relative(path string) string {
	if path == Module {
		return "."
	}
	return strings.TrimPrefix(path, Module+"/")
}

// Check returns every package in no layer and every import that goes up
// a layer, as sentences that say the fix.
func Check(g Graph) []string {
	var bad []string
	for _, pkg := range sorted(g) {
		from := LayerOf(pkg)
		if from < 0 {
			bad = append(bad, fmt.Sprintf("package %s is in no layer: add it to archgraph.Layers", pkg))
			continue
		}
		for _, imp := range g[pkg] {
			if to := LayerOf(imp); to > from {
				bad = append(bad, fmt.Sprintf("%s (layer %d, %s) imports %s (layer %d, %s): an import may not go up a layer; move the shared code down",
					pkg, from, Layers[from].Name, imp, to, Layers[to].Name))
			}
		}
	}
	return bad
}

// Mermaid draws g as a Mermaid flowchart, one subgraph per layer, highest
// first; packages with no code of their own to import (examples without
// imports of ours) are still shown.
func Mermaid(g Graph) string {
	var b strings.Builder
	b.WriteString("```mermaid\nflowchart TB\n")
	id := func(p string) string { return strings.NewReplacer("/", "_", "-", "_", ".", "root").Replace(p) }
	for i := len(Layers) - 1; i >= 0; i-- {
		fmt.Fprintf(&b, "  subgraph L%d[\"%d. %s\"]\n", i, i, Layers[i].Name)
		for _, pkg := range sorted(g) {
			if LayerOf(pkg) == i {
				fmt.Fprintf(&b, "    %s[\"%s\"]\n", id(pkg), pkg)
			}
		}
		b.WriteString("  end\n")
	}
	for _, pkg := range sorted(g) {
		imps := append([]string(nil), g[pkg]...)
		sort.Strings(imps)
		for _, imp := range imps {
			fmt.Fprintf(&b, "  %s --> %s\n", id(pkg), id(imp))
		}
	}
	b.WriteString("```\n")
	return b.String()
}

func sorted(g Graph) []string {
	out := make([]string, 0, len(g))
	for p := range g {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Begin and End mark the generated picture in ARCHITECTURE.md.
const (
	Begin = "<!-- archgraph: begin (make architecture rewrites this block) -->\n"
	End   = "<!-- archgraph: end -->\n"
)

// Splice replaces the block between Begin and End in doc by block.
func Splice(doc, block string) (string, error) {
	i := strings.Index(doc, Begin)
	j := strings.Index(doc, End)
	if i < 0 || j < i {
		return "", fmt.Errorf("no %q ... %q block", strings.TrimSpace(Begin), strings.TrimSpace(End))
	}
	return doc[:i+len(Begin)] + block + doc[j:], nil
}

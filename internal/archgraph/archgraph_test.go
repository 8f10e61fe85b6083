package archgraph

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLayerOfTakesTheLongestPrefix(t *testing.T) {
	for _, tc := range []struct {
		pkg  string
		want int
	}{
		{"api", 0},
		{"internal/fleet", 1},
		{"operator-shim/kubernetes/manifests", 2},
		{"operator-shim/kubernetes", 3},
		{"agent/node/jobrunner", 3},
		{"operator-shim/kubernetes/gen", 5},
		{"cmd/hyperpodrun", 5},
		{"nowhere", -1},
	} {
		if got := LayerOf(tc.pkg); got != tc.want {
			t.Errorf("LayerOf(%q) = %d, want %d", tc.pkg, got, tc.want)
		}
	}
}

func TestCheckRefusesAnImportUpALayer(t *testing.T) {
	bad := Check(Graph{"internal/fleet": {"rendezvous"}, "rendezvous": {"internal/fleet"}, "stray": nil})
	if len(bad) != 2 || !strings.Contains(bad[0], "internal/fleet (layer 1") || !strings.Contains(bad[1], "stray is in no layer") {
		t.Fatalf("Check = %q", bad)
	}
}

// The module's real graph: every package in a layer, no import up a
// layer, and ARCHITECTURE.md's picture current (make architecture).
func TestArchitectureIsLayeredAndItsPictureCurrent(t *testing.T) {
	root := filepath.Join("..", "..")
	g, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range Check(g) {
		t.Error(b)
	}
	doc, err := os.ReadFile(filepath.Join(root, "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := Splice(string(doc), Mermaid(g))
	if err != nil {
		t.Fatal(err)
	}
	if want != string(doc) {
		t.Error("ARCHITECTURE.md's package picture is stale: run make architecture")
	}
}

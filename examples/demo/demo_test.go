package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// TestDemoScenario runs the demo end to end and asserts what it shows: the
// elastic job grows to the whole fleet, shrinks to 2 nodes when prod takes
// its quota back, grows back to 4 when prod finishes, and loses no step.
func TestDemoScenario(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end")
	}
	bin := t.TempDir()
	for _, b := range [][2]string{{"hyperpodrun", "../../cmd/hyperpodrun"}, {"worker", "../worker"}} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, b[0]), b[1]).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b[0], err, out)
		}
	}
	wd, _ := os.Getwd()
	os.Chdir(filepath.Join(wd, "..", ".."))
	defer os.Chdir(wd)
	var out bytes.Buffer
	res, err := scenario(options{hyperpodrun: filepath.Join(bin, "hyperpodrun"), worker: filepath.Join(bin, "worker"), auth: true, out: &out})
	defer func() {
		if t.Failed() {
			t.Log(out.String())
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	// With etcd auth on, team prod's attempt to resize research's job was
	// refused by etcd, and the job went on.
	if len(res.refused) != 1 || !fleet.IsPermissionDenied(res.refused[0]) {
		t.Errorf("team prod resizing research's job: %v; want etcd's permission denied", res.refused)
	}
	if len(res.sizes) < 3 || res.sizes[0] != 4 || res.sizes[len(res.sizes)-1] != 4 {
		t.Errorf("world sizes over time %v: want 4 first and last", res.sizes)
	}
	shrunk := false
	for _, w := range res.sizes {
		shrunk = shrunk || w == 2
	}
	if !shrunk {
		t.Errorf("world sizes %v never went down to 2 for prod's reclaim", res.sizes)
	}
	// Every resize went through the sync signal: no step lost, and none
	// repeated (a kill-and-restart from an older checkpoint repeats steps).
	if res.lost != 0 || res.repeated != 0 || res.steps < 50 {
		t.Errorf("%d steps, %d lost, %d repeated: want none lost or repeated", res.steps, res.lost, res.repeated)
	}
	kinds := ""
	for _, e := range res.history {
		kinds += fmt.Sprintf("%s(%d->%d for %v) ", e.Kind, e.FromSize, e.ToSize, e.For)
		if e.Kind == policy.KindShrunk && (len(e.For) != 1 || e.For[0] != "prod" || e.ForTeam != "prod") {
			t.Errorf("shrink not explained as for job prod of team prod: %+v", e)
		}
	}
	want := []policy.ReasonKind{policy.KindAdmitted, policy.KindShrunk, policy.KindGrown}
	i := 0
	for _, e := range res.history {
		if i < len(want) && e.Kind == want[i] {
			i++
		}
	}
	if i != len(want) {
		t.Errorf("history %s: want admitted, shrunk, grown in that order", kinds)
	}
}

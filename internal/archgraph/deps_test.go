package archgraph

import (
	"bytes"
	"context"
	"os/exec"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"
)

// Heavy dependencies, by import path prefix: NVML's bindings and gopsutil
// belong to device discovery (the node daemon's); the coordinator daemon
// brings leader election and OpenTelemetry.
const (
	goNVML      = "github.com/NVIDIA/go-nvml/"
	gopsutil    = "github.com/shirou/gopsutil/"
	coordinator = Module + "/operator-shim/coordinator"
)

// TestCommandsLinkOnlyWhatTheyNeed: elasticctl, hyperpod-coordinator and
// hyperpod-kube-controller link no device discovery (go-nvml, gopsutil),
// and elasticctl not the coordinator daemon (issue 23). hyperpodrun's own
// guard is cmd/hyperpodrun's TestNoDeviceDiscoveryLinked. A failure names
// the packages that import what is refused.
func TestCommandsLinkOnlyWhatTheyNeed(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	for cmd, refused := range map[string][]string{
		"elasticctl":               {goNVML, gopsutil, coordinator},
		"hyperpod-coordinator":     {goNVML, gopsutil},
		"hyperpod-kube-controller": {goNVML, gopsutil},
	} {
		t.Run(cmd, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			list := exec.CommandContext(ctx, goBin, "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, Module+"/cmd/"+cmd)
			var stderr bytes.Buffer
			list.Stderr = &stderr
			out, err := list.Output()
			if err != nil {
				t.Fatalf("go list -deps ./cmd/%s: %v\n%s", cmd, err, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(lines) < 20 {
				t.Fatalf("go list -deps listed only %d packages:\n%s", len(lines), out)
			}
			if bad := refusedImports(lines, refused); len(bad) > 0 {
				t.Errorf("%s links what it must not:\n  %s", cmd, strings.Join(bad, "\n  "))
			}
		})
	}
}

// refusedImports reads go list -deps lines ("<package> <import>...") and
// returns "<package> imports <import>" for every import of a refused
// package (one equal to, or under, a refused path) by a package that is
// not itself refused (its importer is named instead), sorted.
func refusedImports(lines []string, refused []string) []string {
	isRefused := func(p string) bool {
		for _, r := range refused {
			if p == strings.TrimSuffix(r, "/") || strings.HasPrefix(p, strings.TrimSuffix(r, "/")+"/") {
				return true
			}
		}
		return false
	}
	var bad []string
	for _, line := range lines {
		fields := strings.Fields(line)
		if len(fields) == 0 || isRefused(fields[0]) {
			continue
		}
		for _, imp := range fields[1:] {
			if isRefused(imp) {
				bad = append(bad, fields[0]+" imports "+imp)
			}
		}
	}
	sort.Strings(bad)
	return bad
}

func TestRefusedImports(t *testing.T) {
	refused := []string{goNVML, coordinator}
	for _, tc := range []struct {
		rule  string
		lines []string
		want  []string
	}{
		{"nothing refused: nothing named", []string{"a b c", "b", "c"}, nil},
		{"a refused package is named by its importer",
			[]string{"cmd/x devices", "devices github.com/NVIDIA/go-nvml/pkg/nvml", "github.com/NVIDIA/go-nvml/pkg/nvml github.com/NVIDIA/go-nvml/pkg/dl"},
			[]string{"devices imports github.com/NVIDIA/go-nvml/pkg/nvml"}},
		{"an exact path is refused, and what is under it",
			[]string{"cmd/x " + coordinator + " " + coordinator + "/sub"},
			[]string{"cmd/x imports " + coordinator, "cmd/x imports " + coordinator + "/sub"}},
		{"a path that only starts alike is not refused", []string{"cmd/x " + coordinator + "shim"}, nil},
		{"empty lines are skipped", []string{"", "  "}, nil},
	} {
		if got := refusedImports(tc.lines, refused); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: refusedImports = %q, want %q", tc.rule, got, tc.want)
		}
	}
}

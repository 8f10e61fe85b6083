package main

import (
	"bytes"
	"context"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"
)

// hyperpodrun links no device discovery: not NVML (go-nvml), not gopsutil,
// not containerd's client, not package devices (which holds them). It reads
// what --nproc-per-node gpu/auto needs from the driver's files
// (devices/local), and the node inventory it may meet in etcd is api's
// record. A failure names the packages that import the heavy ones.
func TestNoDeviceDiscoveryLinked(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	list := exec.CommandContext(ctx, goBin, "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, ".")
	var stderr bytes.Buffer
	list.Stderr = &stderr
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/hyperpodrun: %v\n%s", err, stderr.String())
	}
	heavy := func(p string) bool {
		for _, prefix := range []string{"github.com/NVIDIA/go-nvml/", "github.com/shirou/gopsutil/", "github.com/containerd/"} {
			if strings.HasPrefix(p, prefix) {
				return true
			}
		}
		return p == "github.com/hyperpodrun/hyperpodrun/devices"
	}
	var bad []string
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		seen++
		if heavy(fields[0]) {
			continue // named by its importer
		}
		for _, imp := range fields[1:] {
			if heavy(imp) {
				bad = append(bad, fields[0]+" imports "+imp)
			}
		}
	}
	if seen < 20 {
		t.Fatalf("go list -deps listed only %d packages:\n%s", seen, out)
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		t.Errorf("hyperpodrun links device discovery:\n  %s", strings.Join(bad, "\n  "))
	}
}

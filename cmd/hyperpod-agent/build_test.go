package main

import (
	"bytes"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// plainGoEnv is the environment of a plain `go build`: no tags from the
// caller. GOFLAGS is set (not only removed), so that a GOFLAGS in the user's
// go env file, with tags in it, is overridden too; -buildvcs=false only
// spares the build a VCS stamp.
func plainGoEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOFLAGS=") {
			env = append(env, kv)
		}
	}
	return append(env, "GOFLAGS=-buildvcs=false")
}

// goTool is the go command, or the test is skipped.
func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build with: %v", err)
	}
	return p
}

// A plain `go build ./cmd/hyperpod-agent` (no tags, no GOFLAGS) makes a
// binary that starts: it is not linked to bind every symbol at start, so
// go-nvml's symbols, left to lazy binding, do not kill it with "undefined
// symbol: nvml..." before main, and `devices` (NVML discovery on) and
// `--help` run (issue 23).
func TestPlainBuildStarts(t *testing.T) {
	goBin := goTool(t)
	bin := filepath.Join(t.TempDir(), "hyperpod-agent")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, goBin, "build", "-o", bin, ".")
	build.Env = plainGoEnv()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/hyperpod-agent with no tags: %v\n%s", err, out)
	}

	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("read the built binary: %v", err)
	}
	flags, err := f.DynValue(elf.DT_FLAGS)
	if err != nil {
		f.Close()
		t.Fatalf("read the binary's dynamic section: %v", err)
	}
	flags1, err := f.DynValue(elf.DT_FLAGS_1)
	f.Close()
	if err != nil {
		t.Fatalf("read the binary's dynamic section: %v", err)
	}
	for _, v := range flags {
		if elf.DynFlag(v)&elf.DF_BIND_NOW != 0 {
			t.Errorf("the plain build is linked BIND_NOW (DT_FLAGS %#x): something imports Go's plugin package", v)
		}
	}
	for _, v := range flags1 {
		if elf.DynFlag1(v)&elf.DF_1_NOW != 0 {
			t.Errorf("the plain build is linked -z now (DT_FLAGS_1 %#x): something imports Go's plugin package", v)
		}
	}

	for _, args := range [][]string{{"--help"}, {"devices", "--disable-neuron"}} {
		rctx, rcancel := context.WithTimeout(ctx, time.Minute)
		cmd := exec.CommandContext(rctx, bin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		rcancel()
		if err != nil {
			t.Errorf("hyperpod-agent %s (plain build): %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
			continue
		}
		want := map[string]string{"--help": "COMMANDS:", "devices": "Node "}[args[0]]
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("hyperpod-agent %s (plain build) printed no %q:\n%s%s", strings.Join(args, " "), want, stdout.String(), stderr.String())
		}
	}
}

// No command imports Go's plugin package (which makes the linker bind every
// symbol at start): `go list -deps ./cmd/...` with no tags has no "plugin",
// and a failure names the packages that import it.
func TestNoCommandImportsGoPlugin(t *testing.T) {
	goBin := goTool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	list := exec.CommandContext(ctx, goBin, "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "../...")
	list.Env = plainGoEnv()
	var stderr bytes.Buffer
	list.Stderr = &stderr
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/...: %v\n%s", err, stderr.String())
	}
	var importers []string
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		seen++
		for _, imp := range fields[1:] {
			if imp == "plugin" {
				importers = append(importers, fields[0])
			}
		}
	}
	if seen < 50 {
		t.Fatalf("go list -deps ./cmd/... listed only %d packages:\n%s", seen, out)
	}
	if len(importers) > 0 {
		sort.Strings(importers)
		t.Errorf("Go's plugin package is imported by %s: a plain build would bind every symbol at start and die on go-nvml's", strings.Join(importers, ", "))
	}
}

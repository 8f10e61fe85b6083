package main

import (
	"context"
	"debug/elf"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/agent/node/containers"
)

// Runtimes of --runtime.
const (
	runtimeAuto       = "auto"
	runtimeContainerd = "containerd"
	runtimeProcess    = "process"
)

// pickRuntime connects to containerd as --runtime says: "containerd" must
// answer, "process" never tries, and "auto" (the default) uses containerd
// when its socket answers. nil means the process runtime only.
func pickRuntime(ctx context.Context, c *cli.Context, log *slog.Logger) (*containers.Runtime, error) {
	mode := c.String("runtime")
	cfg := containers.Config{
		Address: c.String("containerd-address"), Namespace: c.String("containerd-namespace"),
		Snapshotter: c.String("containerd-snapshotter"), PlainHTTP: c.StringSlice("insecure-registry"),
		DockerConfig: c.String("registry-config"), CDIDirs: c.StringSlice("cdi-spec-dir"),
		DevRoot: c.String("dev-root"), Logger: log,
		AllowMountSources: c.StringSlice("allow-mount-source"),
	}
	if c.IsSet("container-nofile") {
		// Asked for: a node that allows less says so (the default is
		// clipped quietly).
		cfg.NoFile = c.Uint64("container-nofile")
	}
	// The mount allow-list is the node admin's word: a directory no job
	// may ever mount is a mistake, refused before anything runs.
	for _, d := range cfg.AllowMountSources {
		if err := containers.CheckAllowMountSource(d); err != nil {
			return nil, usagef("%v", err)
		}
	}
	if c.IsSet("container-nofile") && cfg.NoFile == 0 {
		return nil, usagef("--container-nofile 0: give the containers' RLIMIT_NOFILE, e.g. %d", containers.DefaultNoFile)
	}
	switch mode {
	case runtimeProcess:
		log.Info("runtime: process (--runtime process): jobs run as host processes; a job naming run.image fails on this node")
		return nil, nil
	case runtimeContainerd, runtimeAuto:
	default:
		return nil, usagef("--runtime %q: choose containerd, process or auto", mode)
	}
	rt, err := containers.Connect(ctx, cfg)
	if err != nil {
		if mode == runtimeContainerd {
			return nil, fmt.Errorf("--runtime containerd: %w (is containerd running? --containerd-address names its socket)", err)
		}
		log.Info("runtime: process (containerd does not answer, so jobs naming run.image fail on this node)", "containerd", cfg.Address, "why", err)
		return nil, nil
	}
	log.Info("runtime: containerd: jobs naming run.image run in containers, the others as host processes", "containerd", rt.Address(), "namespace", rt.Namespace(),
		"allow_mount_sources", cfg.AllowMountSources)
	return rt, nil
}

// staticHyperpodrun finds the hyperpodrun to mount into containers:
// --container-hyperpodrun, else hyperpodrun-static beside this binary or
// on PATH, else --hyperpodrun when it is statically linked. "" when none.
func staticHyperpodrun(flag, hyperpodrun string) (string, error) {
	if flag != "" {
		if !isStatic(flag) {
			return "", fmt.Errorf("--container-hyperpodrun %s: not a statically linked executable; it must run in any image (make build makes bin/hyperpodrun-static)", flag)
		}
		return filepath.Abs(flag)
	}
	var cands []string
	if self, err := os.Executable(); err == nil {
		cands = append(cands, filepath.Join(filepath.Dir(self), "hyperpodrun-static"))
	}
	if p, err := exec.LookPath("hyperpodrun-static"); err == nil {
		cands = append(cands, p)
	}
	if p, err := exec.LookPath(hyperpodrun); err == nil {
		cands = append(cands, p)
	}
	for _, p := range cands {
		if isStatic(p) {
			return filepath.Abs(p)
		}
	}
	return "", nil
}

// isStatic reports whether path is an ELF executable without an
// interpreter (statically linked).
func isStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return f.Type == elf.ET_EXEC || f.Type == elf.ET_DYN
}

package containers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	ctrcontainers "github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/hyperpodrun/hyperpodrun/api"
)

// What every job container gets, whatever its spec says (issue 22,
// docs/containers.md "Confinement"): no capability at all (bounding,
// effective, permitted, inheritable and ambient sets empty), no new
// privileges (setuid binaries and file capabilities do nothing),
// containerd's default seccomp profile, RLIMIT_NOFILE = Config.NoFile, the
// job's uid:gid (or, without one, an image user that is not root), and host
// mounts only from Config.AllowMountSources.

// DefaultNoFile is the containers' RLIMIT_NOFILE (soft and hard) unless
// Config.NoFile says otherwise: Linux's default fs.nr_open, enough for
// data loaders with many workers and NCCL's sockets.
const DefaultNoFile = 1 << 20

// ErrRefused marks a container this node refuses to run as its spec asks
// (a host mount outside the node's allow-list, an image that would run as
// root): the job's problem record says why and what fixes it.
var ErrRefused = errors.New("refused by this node")

// DangerousMountSource says why a job may never bind-mount the host path
// source, whatever a node allows ("" when nothing is known against it):
// api.DangerousMountSource, which elasticctl and the coordinator apply at
// submit, plus containerd's socket wherever this node has it.
func DangerousMountSource(source string) string {
	if why := api.DangerousMountSource(source); why != "" {
		return why
	}
	p := filepath.Clean(source)
	switch {
	case within(p, DefaultAddress):
		return "containerd's socket (control of every container on the node)"
	case within(DefaultAddress, p):
		return "a directory holding " + DefaultAddress + " (containerd's socket: control of every container on the node)"
	}
	return ""
}

// within reports whether the clean absolute path p is dir or under it.
func within(p, dir string) bool { return api.Within(p, dir) }

// CheckMount decides whether a job may bind-mount the host path source
// (at target) on this node and returns the path to mount: source with its
// symbolic links resolved (resolve is filepath.EvalSymlinks), so that what
// is mounted is what was checked. A source is allowed when it is absolute,
// has no "..", is not a DangerousMountSource nor within or holding a
// protected path (the agent's own directories), lies (after filepath.Clean)
// within an allowed directory, and still lies within that directory once
// both are resolved (a symbolic link inside an allowed directory cannot
// lead out of it). The error, wrapping ErrRefused, names the mount, the
// allow-list and the fix.
func CheckMount(source, target string, allow, protected []string, resolve func(string) (string, error)) (string, error) {
	refuse := func(why string) (string, error) {
		list := "nothing (no --allow-mount-source)"
		if len(allow) > 0 {
			list = strings.Join(allow, ", ")
		}
		return "", fmt.Errorf("%w: run.mounts source %q (target %q): %s; this node allows host mounts only within %s: the node's admin adds the directory with hyperpod-agent --allow-mount-source, or the job mounts another source",
			ErrRefused, clip(source), clip(target), why, list)
	}
	if why := DangerousMountSource(source); why != "" {
		return refuse("never mounted: " + why)
	}
	p := filepath.Clean(source)
	if len(allow) == 0 {
		return refuse("this node allows no host mounts")
	}
	for _, d := range protected {
		if d = filepath.Clean(d); d != "" && (within(p, d) || within(d, p)) {
			return refuse("never mounted: the node agent's own directory " + d + " (other jobs' files)")
		}
	}
	var under string
	for _, a := range allow {
		if a = filepath.Clean(a); filepath.IsAbs(a) && within(p, a) {
			under = a
			break
		}
	}
	if under == "" {
		return refuse("not within an allowed directory")
	}
	real, err := resolve(p)
	if err != nil {
		return refuse(fmt.Sprintf("cannot be resolved on this node: %v", err))
	}
	realUnder, err := resolve(under)
	if err != nil {
		return refuse(fmt.Sprintf("the allowed directory %s cannot be resolved on this node: %v", under, err))
	}
	if !within(real, realUnder) {
		return refuse(fmt.Sprintf("it leads to %s through a symbolic link, outside the allowed %s", clip(real), under))
	}
	if why := DangerousMountSource(real); why != "" {
		return refuse(fmt.Sprintf("it leads to %s, never mounted: %s", clip(real), why))
	}
	for _, d := range protected {
		if d = filepath.Clean(d); d != "" && (within(real, d) || within(d, real)) {
			return refuse("it leads to the node agent's own directory " + d + " (other jobs' files)")
		}
	}
	return real, nil
}

// clip shortens what a job's spec says before it goes into a message.
func clip(s string) string {
	const max = 200
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}

// CheckAllowMountSource refuses an --allow-mount-source entry that would
// let jobs mount what no job may: a relative path, or one that is (or
// resolves to) a DangerousMountSource.
func CheckAllowMountSource(dir string) error {
	if why := DangerousMountSource(dir); why != "" {
		return fmt.Errorf("--allow-mount-source %s: %s: jobs may never mount it", dir, why)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("--allow-mount-source %s: %w", dir, err)
	}
	if why := DangerousMountSource(real); why != "" {
		return fmt.Errorf("--allow-mount-source %s leads to %s: %s: jobs may never mount it", dir, real, why)
	}
	return nil
}

// maxNoFile is the most RLIMIT_NOFILE runc can give a container here (0
// when unknown): the node's fs.nr_open, and, where this process lacks
// CAP_SYS_RESOURCE (a sandbox's "root"), its own hard limit, since no
// process here can raise one above it.
func maxNoFile() uint64 {
	var max uint64
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		max, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	if !hasCap(unix.CAP_SYS_RESOURCE) {
		var l unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &l); err == nil && (max == 0 || l.Max < max) {
			max = l.Max
		}
	}
	return max
}

// hasCap reports whether this process has capability c in its effective
// set.
func hasCap(c int) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			set, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && set&(1<<uint(c)) != 0
		}
	}
	return false
}

// withConfinement takes every capability away, sets no_new_privileges and
// RLIMIT_NOFILE, and applies containerd's default seccomp profile (which
// is made for the capabilities left: none).
func withConfinement(nofile uint64) oci.SpecOpts {
	return func(ctx context.Context, cl oci.Client, c *ctrcontainers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		s.Process.Capabilities = &specs.LinuxCapabilities{
			Bounding: []string{}, Effective: []string{}, Permitted: []string{}, Inheritable: []string{}, Ambient: []string{},
		}
		s.Process.NoNewPrivileges = true
		limits := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile}}
		for _, l := range s.Process.Rlimits {
			if l.Type != "RLIMIT_NOFILE" {
				limits = append(limits, l)
			}
		}
		s.Process.Rlimits = limits
		return seccomp.WithDefaultProfile()(ctx, cl, c, s)
	}
}

// refuseRoot fails the spec when its process would run as root: no job
// identity was given (Spec.UID) and the image's user is root or unset.
func refuseRoot(image string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *ctrcontainers.Container, s *oci.Spec) error {
		if s.Process != nil && s.Process.User.UID != 0 {
			return nil
		}
		return fmt.Errorf("%w: the image %s runs as root and this node has no identity for the job: give the agent --job-uid-range or --job-user (or --allow-root-jobs to run such images as root on purpose), or build the image with a non-root USER", ErrRefused, clip(image))
	}
}

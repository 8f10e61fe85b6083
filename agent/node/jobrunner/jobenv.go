package jobrunner

import (
	"fmt"
	"os/user"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// A job never runs as the agent: its environment is built from its spec
// and the torchrun contract only (nothing of the agent's environment, in
// particular no path to the agent's etcd credentials), and it runs as a
// configured unprivileged user.

// DefaultPath is the PATH every job gets (a job may not set its own: see
// refusedEnv).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// refusedEnv says why a job may not set name in run.env ("" when it may):
// these change what code runs in every process of the job, or speak for
// hyperpodrun itself. An agent flag (--allow-job-env) lifts the refusal
// name by name.
func refusedEnv(name string) string {
	switch {
	case strings.HasPrefix(name, "LD_"):
		return "the dynamic loader's settings run code of the job's choosing inside every process"
	case name == "PATH":
		return "the agent sets PATH; run a program by its absolute path instead"
	case strings.HasPrefix(name, "HYPERPODRUN_"), strings.HasPrefix(name, "TORCHELASTIC_"), strings.HasPrefix(name, "PET_"):
		return "hyperpodrun sets these for its workers"
	case name == "PYTHONSTARTUP", name == "PYTHONHOME", name == "BASH_ENV", name == "ENV":
		return "it runs or loads code before the job's own"
	}
	return ""
}

// EnvOptions are the agent's settings for jobs' environments.
type EnvOptions struct {
	// Allow lists run.env names a refused name is allowed for anyway.
	Allow []string
	// Home is the job user's home ("" leaves HOME unset).
	Home string
	// Lang is LANG for the job (default C.UTF-8).
	Lang string
}

// jobEnv builds a job's hyperpodrun environment: a fixed PATH, HOME and
// LANG, the spec's run.env (refused names rejected with an error that names
// the variable and the fix), then the agent's own settings for the run
// (extra: node id, TMPDIR, ...), which a spec cannot override. The
// agent's environment is not consulted at all.
func jobEnv(spec fleet.JobSpec, o EnvOptions, extra map[string]string) ([]string, error) {
	env := map[string]string{"PATH": DefaultPath, "LANG": "C.UTF-8"}
	if o.Lang != "" {
		env["LANG"] = o.Lang
	}
	if o.Home != "" {
		env["HOME"] = o.Home
	}
	names := make([]string, 0, len(spec.Run.Env))
	for k := range spec.Run.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if why := refusedEnv(k); why != "" && !slices.Contains(o.Allow, k) {
			return nil, fmt.Errorf("job %q: run.env %s is refused: %s; remove it from the job, or start hyperpod-agent with --allow-job-env %s", spec.Name, k, why, k)
		}
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(spec.Run.Env[k], "\x00") {
			return nil, fmt.Errorf("job %q: run.env %q is not a valid environment variable", spec.Name, k)
		}
		env[k] = spec.Run.Env[k]
	}
	for k, v := range extra {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out, nil
}

// JobUser is who jobs run as.
type JobUser struct {
	UID, GID uint32
	Home     string
	// Set is false when no user was configured: jobs run as the agent.
	Set bool
}

// ParseJobUser reads --job-user: a user name, a uid, or uid:gid.
func ParseJobUser(s string) (JobUser, error) {
	if s == "" {
		return JobUser{}, nil
	}
	name, group, hasGroup := strings.Cut(s, ":")
	var u JobUser
	if id, err := strconv.ParseUint(name, 10, 32); err == nil {
		u.UID, u.GID = uint32(id), uint32(id)
		if pw, err := user.LookupId(name); err == nil {
			u.Home = pw.HomeDir
			if g, err := strconv.ParseUint(pw.Gid, 10, 32); err == nil {
				u.GID = uint32(g)
			}
		}
	} else {
		pw, err := user.Lookup(name)
		if err != nil {
			return JobUser{}, fmt.Errorf("--job-user %q: %w: give a user of this host, a uid, or uid:gid", s, err)
		}
		uid, _ := strconv.ParseUint(pw.Uid, 10, 32)
		gid, _ := strconv.ParseUint(pw.Gid, 10, 32)
		u.UID, u.GID, u.Home = uint32(uid), uint32(gid), pw.HomeDir
	}
	if hasGroup {
		g, err := strconv.ParseUint(group, 10, 32)
		if err != nil {
			return JobUser{}, fmt.Errorf("--job-user %q: the group must be a numeric gid", s)
		}
		u.GID = uint32(g)
	}
	if u.UID == 0 {
		return JobUser{}, fmt.Errorf("--job-user %q is root: jobs run as an unprivileged user; to run them as root say --allow-root-jobs instead", s)
	}
	u.Set = true
	return u, nil
}

// refuseRoot says why a job may not start when the agent runs as agentUID
// with user u ("" when it may): an agent running as root runs jobs as a
// configured user, or as root only when told so.
func refuseRoot(agentUID int, u JobUser, allowRoot bool) string {
	if agentUID != 0 || u.Set || allowRoot {
		return ""
	}
	return "hyperpod-agent runs as root and would run the job as root: start it with --job-user <unprivileged user> (or --allow-root-jobs to run jobs as root on purpose)"
}

package elastic

import (
	"context"
	"fmt"
	"os"

	"github.com/hyperpodrun/hyperpodrun/checkpoint"
)

// Run starts the job on this node the way the options say: --standalone and
// the static backend run RunStatic; the etcd backend runs the elastic agent;
// c10d runs it on an etcd hosted by the node owning the endpoint's address.
func Run(ctx context.Context, o Options) error {
	logDir, err := RunLogDir(o.BaseLogDir, o.Spec.RunID)
	if err != nil {
		return err
	}
	o.Spec.LogDir = logDir
	// The Python helper (hyperpodrun_elastic, and HyperPod's
	// hyperpod_elastic_agent import path) is importable without an install.
	// It lives in a run directory of its own, removed at exit, not in the
	// user's log directory, and comes after the user's PYTHONPATH: a user
	// module of the same name wins.
	runDir, err := os.MkdirTemp("", "hyperpodrun-run-")
	if err != nil {
		return &ExitError{1, fmt.Errorf("create the run directory: %w", err)}
	}
	defer os.RemoveAll(runDir)
	pyRoot, err := checkpoint.ExtractPython(runDir)
	if err != nil {
		return &ExitError{1, err}
	}
	env := map[string]string{}
	for k, v := range o.Spec.Env {
		env[k] = v
	}
	env["PYTHONPATH"] = appendPath(os.Getenv("PYTHONPATH"), pyRoot)
	// HyperPod's import path reads HYPERPOD_SIGNAL_COORDINATION as HyperPod
	// does ("disabled" when unset). HyperPod's agent passes its own value
	// on; hyperpodrun always announces planned changes, so it passes
	// "distributed" unless the launcher's environment chose otherwise.
	if _, set := os.LookupEnv("HYPERPOD_SIGNAL_COORDINATION"); !set {
		env["HYPERPOD_SIGNAL_COORDINATION"] = "distributed"
	}
	o.Spec.Env = env
	if o.Spec.ShutdownTimeout == 0 {
		o.Spec.ShutdownTimeout = o.ShutdownTimeout
	}
	switch o.RdzvBackend {
	case "standalone":
		port, err := FreePort(o.MasterAddr)
		if err != nil {
			return err
		}
		o.MasterPort = port
		return RunStatic(ctx, o)
	case "static":
		if o.RdzvEndpoint != "" {
			host, port, err := splitHostPort(o.RdzvEndpoint, o.MasterPort)
			if err != nil {
				return &ExitError{2, fmt.Errorf("--rdzv-endpoint: %w", err)}
			}
			o.MasterAddr, o.MasterPort = host, port
		}
		return RunStatic(ctx, o)
	case "c10d":
		return runC10d(ctx, o)
	default:
		return RunElastic(ctx, o)
	}
}

// appendPath is the search path list with dir appended (list alone when
// empty, dir alone when list is).
func appendPath(list, dir string) string {
	if list == "" {
		return dir
	}
	return list + string(os.PathListSeparator) + dir
}

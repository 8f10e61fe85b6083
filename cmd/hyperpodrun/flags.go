package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/agent"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/launcher"
)

type usageError struct{ err error }

func (u *usageError) Error() string { return u.err.Error() }

var errHelpShown = errors.New("help shown")

// flagNames gives a torchrun flag both spellings and its PET_ variable.
func flagNames(name string) (string, []string, []string) {
	under := strings.ReplaceAll(name, "-", "_")
	var aliases []string
	if under != name {
		aliases = []string{under}
	}
	return name, aliases, []string{"PET_" + strings.ToUpper(under)}
}

func str(name, def, usage string) *cli.StringFlag {
	n, a, e := flagNames(name)
	return &cli.StringFlag{Name: n, Aliases: a, EnvVars: e, Value: def, Usage: usage}
}

func boolean(name, usage string, short ...string) *cli.BoolFlag {
	n, a, e := flagNames(name)
	return &cli.BoolFlag{Name: n, Aliases: append(a, short...), EnvVars: e, Usage: usage}
}

func integer(name string, def int, usage string) *cli.IntFlag {
	n, a, e := flagNames(name)
	return &cli.IntFlag{Name: n, Aliases: a, EnvVars: e, Value: def, Usage: usage}
}

func float(name string, def float64, usage string) *cli.Float64Flag {
	n, a, e := flagNames(name)
	return &cli.Float64Flag{Name: n, Aliases: a, EnvVars: e, Value: def, Usage: usage}
}

// flags are torchrun's (torch.distributed.run) with its defaults, then the
// HyperPod-style extras.
func flags() []cli.Flag {
	f := []cli.Flag{
		str("nnodes", "1:1", "number of nodes, or MIN:MAX for an elastic job"),
		str("nproc-per-node", "1", "workers per node: a number, gpu, cpu or auto"),
		str("rdzv-backend", "static", "rendezvous backend: static or etcd (etcd v3; etcd-v2 is accepted as an alias)"),
		str("rdzv-endpoint", "", "rendezvous endpoint(s): host:port[,host:port...]"),
		str("rdzv-id", "none", "user-defined job id"),
		str("rdzv-conf", "", "rendezvous settings key=value,... (lease_ttl, last_call_timeout, join_timeout, prefix, cacert, cert, key, user, password)"),
		boolean("standalone", "single-node job with a local rendezvous (no etcd needed)"),
		integer("max-restarts", 0, "maximum number of worker-group restarts before failing"),
		float("monitor-interval", 0.1, "seconds between worker checks (accepted; hyperpodrun is event-driven)"),
		str("start-method", "spawn", "accepted for compatibility: spawn, fork or forkserver"),
		str("role", "default", "user-defined role of the workers"),
		boolean("module", "run the script as a Python module (python -m)", "m"),
		boolean("no-python", "run the script directly instead of through Python"),
		boolean("run-path", "run the script with runpy.run_path"),
		str("log-dir", "", "base directory for log files"),
		str("redirects", "0", "redirect std streams to log files only: 0 none, 1 out, 2 err, 3 both, or per rank 0:1,1:2"),
		str("tee", "0", "tee std streams to log files and the console (same syntax as --redirects)"),
		str("local-ranks-filter", "", "show only these local ranks on the console, e.g. 0,2"),
		integer("node-rank", 0, "rank of this node (static rendezvous)"),
		str("master-addr", "127.0.0.1", "address of the master node (static rendezvous)"),
		integer("master-port", 29500, "port of the master node (static rendezvous)"),
		str("local-addr", "", "address of this node, used as MASTER_ADDR when it is rank 0"),
		boolean("pin-devices", "give each local rank its own device: CUDA_VISIBLE_DEVICES (GPUs) or NEURON_RT_VISIBLE_CORES (Neuron), with --nproc-per-node gpu or auto"),
		// HyperPod-style extras.
		str("shutdown-signal", "SIGTERM", "signal sent to workers when hyperpodrun stops them"),
		float("shutdown-timeout", 30, "seconds between the shutdown signal and SIGKILL"),
		float("graceful-timeout", 30, "seconds workers get to checkpoint and exit on a planned change"),
		str("elastic-signal", "SIGUSR1", "signal announcing a planned change to workers"),
		str("pre-train-script", "", "script run once on this node before training starts"),
		str("pre-train-args", "", "arguments of --pre-train-script"),
		str("post-train-script", "", "script run on this node after training succeeds"),
		str("post-train-args", "", "arguments of --post-train-script"),
	}
	// Short options torchrun spells with one letter.
	for _, fl := range f {
		if sf, ok := fl.(*cli.StringFlag); ok && (sf.Name == "redirects" || sf.Name == "tee") {
			sf.Aliases = append(sf.Aliases, sf.Name[:1])
		}
	}
	return f
}

// parseArgs turns the command line (and PET_* variables) into agent options.
func parseArgs(args []string) (agent.Options, error) {
	var opts agent.Options
	var perr error
	app := &cli.App{
		Name:            "hyperpodrun",
		Usage:           "torchrun-compatible elastic launcher on etcd v3",
		UsageText:       "hyperpodrun [options] training_script [training_script_args...]",
		Flags:           flags(),
		HideHelpCommand: true,
		Writer:          os.Stdout,
		ErrWriter:       io.Discard,
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			// Go's flag package says "flag provided but not defined: -x".
			if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
				return &usageError{fmt.Errorf("unknown option --%s (torchrun options take both spellings, e.g. --nproc-per-node or --nproc_per_node; put the training script's own options after the script)", strings.TrimPrefix(name, "-"))}
			}
			return &usageError{err}
		},
		ExitErrHandler: func(*cli.Context, error) {},
		Action: func(c *cli.Context) error {
			opts, perr = optionsFrom(c)
			return perr
		},
	}
	ran := false
	app.Before = func(*cli.Context) error { ran = true; return nil }
	if err := app.Run(args); err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			return opts, err
		}
		if !ran {
			return opts, &usageError{err}
		}
		return opts, err
	}
	if !ran || (opts.Spec.Entrypoint == "" && perr == nil) {
		return opts, errHelpShown
	}
	return opts, nil
}

func optionsFrom(c *cli.Context) (agent.Options, error) {
	var o agent.Options
	bad := func(format string, a ...any) (agent.Options, error) {
		return o, &usageError{fmt.Errorf(format, a...)}
	}
	if c.NArg() == 0 {
		if c.NumFlags() == 0 {
			cli.ShowAppHelp(c)
			return o, nil
		}
		return bad("missing the training script: hyperpodrun [options] training_script [args...]")
	}
	var err error
	if o.MinNodes, o.MaxNodes, err = agent.ParseNNodes(c.String("nnodes")); err != nil {
		return bad("%v", err)
	}
	nproc, devKind, err := parseNProc(c.String("nproc-per-node"))
	if err != nil {
		return bad("%v", err)
	}
	redirects, err := launcher.ParseStd("redirects", c.String("redirects"))
	if err != nil {
		return bad("%v", err)
	}
	tee, err := launcher.ParseStd("tee", c.String("tee"))
	if err != nil {
		return bad("%v", err)
	}
	filter, err := launcher.ParseRankFilter(c.String("local-ranks-filter"))
	if err != nil {
		return bad("%v", err)
	}
	switch sm := c.String("start-method"); sm {
	case "spawn", "fork", "forkserver":
	default:
		return bad("--start-method %q: choose spawn, fork or forkserver", sm)
	}
	if c.Int("max-restarts") < 0 {
		return bad("--max-restarts must be >= 0")
	}
	if c.Int("master-port") < 0 || c.Int("master-port") > 65535 {
		return bad("--master-port %d is not a TCP port (0-65535)", c.Int("master-port"))
	}
	if c.Bool("module") && c.Bool("no-python") {
		return bad("--module and --no-python cannot be used together")
	}
	sdSig, err := launcher.ParseSignal(c.String("shutdown-signal"))
	if err != nil {
		return bad("--shutdown-signal: %v", err)
	}
	elSig, err := launcher.ParseSignal(c.String("elastic-signal"))
	if err != nil {
		return bad("--elastic-signal: %v", err)
	}
	dur := func(name string) (time.Duration, error) {
		v := c.Float64(name)
		if v < 0 {
			return 0, &usageError{fmt.Errorf("--%s must be >= 0 seconds", name)}
		}
		return time.Duration(v * float64(time.Second)), nil
	}
	if o.ShutdownTimeout, err = dur("shutdown-timeout"); err != nil {
		return o, err
	}
	if o.GracefulTimeout, err = dur("graceful-timeout"); err != nil {
		return o, err
	}
	if o.MonitorInterval, err = dur("monitor-interval"); err != nil {
		return o, err
	}

	o.RdzvBackend = c.String("rdzv-backend")
	o.RdzvEndpoint = c.String("rdzv-endpoint")
	o.RdzvID = c.String("rdzv-id")
	o.RdzvConf = c.String("rdzv-conf")
	o.Standalone = c.Bool("standalone")
	o.MaxRestarts = c.Int("max-restarts")
	o.NodeRank = c.Int("node-rank")
	o.MasterAddr = c.String("master-addr")
	o.MasterPort = c.Int("master-port")
	o.LocalAddr = c.String("local-addr")
	o.BaseLogDir = c.String("log-dir")
	o.ShutdownSignal, o.ElasticSignal = sdSig, elSig
	if s := c.String("pre-train-script"); s != "" {
		o.PreTrain = append([]string{s}, strings.Fields(c.String("pre-train-args"))...)
	}
	if s := c.String("post-train-script"); s != "" {
		o.PostTrain = append([]string{s}, strings.Fields(c.String("post-train-args"))...)
	}
	switch o.RdzvBackend {
	case "static", "etcd", "etcd-v2", "etcd-v3":
	case "c10d":
		return bad("--rdzv-backend c10d is torch's TCPStore rendezvous; hyperpodrun rendezvouses on etcd v3: use --rdzv-backend etcd --rdzv-endpoint HOST:2379, or --standalone for one node")
	default:
		return bad("--rdzv-backend %q: choose static or etcd", o.RdzvBackend)
	}
	if o.Standalone {
		// torchrun --standalone: one node, a local rendezvous, a random id.
		o.RdzvBackend = "standalone"
		o.MinNodes, o.MaxNodes, o.NodeRank = 1, 1, 0
		o.RdzvID = agent.RandomID()
		o.MasterAddr = "127.0.0.1"
	}

	args := c.Args().Slice()
	o.Spec = launcher.Spec{
		Entrypoint:   args[0],
		Args:         args[1:],
		Module:       c.Bool("module"),
		NoPython:     c.Bool("no-python"),
		RunPath:      c.Bool("run-path"),
		PythonExec:   os.Getenv("PYTHON_EXEC"),
		NProcPerNode: nproc,
		Role:         c.String("role"),
		RunID:        o.RdzvID,
		MaxRestarts:  o.MaxRestarts,
		Redirects:    redirects,
		Tee:          tee,
		RanksFilter:  filter,
	}
	if c.Bool("pin-devices") {
		if devKind == "" || devKind == devices.ProcCPU {
			return bad("--pin-devices needs --nproc-per-node gpu or auto on a node with GPUs or Neuron devices (got %q)", c.String("nproc-per-node"))
		}
		o.Spec.RankEnv = func(lr int) map[string]string { return devices.PinEnv(devKind, lr, nproc) }
	}
	return o, nil
}

// parseNProc resolves --nproc-per-node: a number, or gpu, cpu, auto through
// device discovery (GPUs, else Neuron cores, else 1 for auto).
func parseNProc(v string) (int, string, error) {
	if n, err := strconv.Atoi(v); err == nil {
		if n < 1 {
			return 0, "", fmt.Errorf("--nproc-per-node %q: want a number >= 1, or gpu, cpu or auto", v)
		}
		return n, "", nil
	}
	switch v {
	case "gpu", "cpu", "auto":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return devices.LocalProcs(ctx, v)
	}
	return 0, "", fmt.Errorf("--nproc-per-node %q: want a number >= 1, or gpu, cpu or auto", v)
}

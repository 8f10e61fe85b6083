package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/agent/elastic"
	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/devices/local"
	"github.com/hyperpodrun/hyperpodrun/launcher"
)

type usageError struct{ err error }

// maxTimeout bounds every timeout flag: beyond a day is a typo.
const maxTimeout = 24 * time.Hour

// checkRdzvID refuses a rendezvous id that could escape its etcd prefix or
// the log directory: on a rendezvous backend it is a DNS-1123 label, as
// job names are; on the static backend it is at least one path segment.
func checkRdzvID(id, backend string, standalone bool) error {
	switch {
	case standalone:
		return nil // replaced by a random id
	case backend == "static":
		if id == "" || id == "." || id == ".." || strings.ContainsAny(id, "/\x00") {
			return &usageError{fmt.Errorf("--rdzv-id %q: must be a plain name (it names the log directory); e.g. --rdzv-id my-job", id)}
		}
		return nil
	case id == "" || id == "none":
		return nil // the elastic agent asks for one, naming the flag
	}
	if err := api.ValidateName("--rdzv-id", id); err != nil {
		return &usageError{err}
	}
	return nil
}

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
		str("rdzv-backend", "static", "rendezvous backend: static, etcd (etcd v3; etcd-v2 is an alias), c10d (the node owning --rdzv-endpoint's address hosts an embedded etcd there) or hyperpod"),
		str("rdzv-endpoint", "", "rendezvous endpoint(s): host:port[,host:port...], or @FILE to read them from FILE"),
		str("rdzv-id", "none", "user-defined job id"),
		str("rdzv-conf", "", "rendezvous settings key=value,... or @FILE to read them from FILE (lease_ttl, last_call_timeout, join_timeout, prefix, cacert, cert, key, user, password_file (0600; password= shows in /proc/<pid>/cmdline))"),
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
		boolean("no-agent-store", "workers host their own TCPStore on rank 0 (torchrun's way) instead of the rank-0 node's hyperpodrun serving it before they start"),
		func() cli.Flag {
			f := boolean("inprocess-resize", "planned resizes (and lost members) keep the surviving workers' processes: they call hyperpodrun_elastic.reconfigure() and re-form the process group on the next round's assignment instead of restarting (falls back to a restart when they do not)")
			f.EnvVars = append(f.EnvVars, "HYPERPODRUN_INPROCESS_RESIZE")
			return f
		}(),
		float("inprocess-prewarm-timeout", 60, "with --inprocess-resize, a node joining a job that trains starts its workers before it registers (they import torch and wait for their first assignment), so the others stop only once they are ready; seconds it waits for them before registering anyway (0: no prewarm)"),
		boolean("pin-devices", "give each local rank its own device: CUDA_VISIBLE_DEVICES (GPUs) or NEURON_RT_VISIBLE_CORES (Neuron), with --nproc-per-node gpu or auto"),
		// torch 2.x.
		str("logs-specs", "", "torchrun.logs_specs entry point: only torch's default (DefaultLogsSpecs) is available"),
		boolean("virtual-local-rank", "LOCAL_RANK=0 for every worker, each seeing only its own device"),
		str("numa-binding", "", "bind each worker's CPUs by NUMA topology: node, socket, exclusive or core-complex"),
		str("signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "signals hyperpodrun forwards to the workers before stopping"),
		str("event-log-handler", "null", "where torch's agent events go: null or console (hyperpodrun's log)"),
		str("duplicate-stdout-filters", "", "teed stdout lines containing any of these comma-separated strings are also written to filtered_stdout.log"),
		str("duplicate-stderr-filters", "", "teed stderr lines containing any of these comma-separated strings are also written to filtered_stderr.log"),
		str("log-line-prefix-template", "", "prefix of teed console lines, e.g. [${role_name}${rank}]: (also TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)"),
		// HyperPod-style extras.
		str("shutdown-signal", "SIGTERM", "signal sent to workers when hyperpodrun stops them"),
		float("shutdown-timeout", 30, "seconds between the shutdown signal and SIGKILL"),
		float("graceful-timeout", 30, "seconds workers get to checkpoint and exit on a planned change"),
		float("hang-timeout", elastic.DefaultHangTimeout.Seconds(), "seconds a worker may go without a heartbeat (hyperpodrun_elastic sends one from every elastic_event_detected() call) before it is taken for hung: its Python stacks are dumped into the log directory and the node's workers fail (restarted from the last checkpoint, counted); the clock starts at a worker's first heartbeat (before it, --hang-startup-timeout); 0 disables"),
		float("hang-startup-timeout", elastic.DefaultHangStartupTimeout.Seconds(), "seconds after a restarted round's start a worker may go without its first heartbeat before it is taken for hung as with --hang-timeout (stuck in init_process_group or stopped before its first step); watched only when this node's worker of the same local rank sent heartbeats in an earlier round, so a loop that never calls the helper and a job's first start-up are never taken for hung; the default, as --hang-timeout's, allows minutes to start, import and load a checkpoint; 0 disables"),
		str("elastic-signal", "SIGUSR1", "signal announcing a planned change to workers"),
		str("pre-train-script", "", "script run once on this node before training starts"),
		str("pre-train-args", "", "arguments of --pre-train-script"),
		str("post-train-script", "", "script run on this node after training succeeds"),
		str("post-train-args", "", "arguments of --post-train-script"),
		// SageMaker HyperPod's agent (hyperpodrun --server-*): accepted, each
		// with a notice of what hyperpodrun does instead.
		str("server-host", "", "HyperPod agent: accepted; hyperpodrun runs no agent server (etcd drives it)"),
		str("server-port", "", "HyperPod agent: accepted; hyperpodrun runs no agent server (etcd drives it)"),
		str("server-log-level", "", "HyperPod agent: sets hyperpodrun's log level (debug, info, warning, error)"),
		str("server-shutdown-timeout", "", "HyperPod agent: accepted; hyperpodrun runs no agent server"),
		boolean("inprocess-restart", "HyperPod agent: accepted; workers are restarted as processes"),
		str("inprocess-timeout", "", "HyperPod agent: accepted; see --graceful-timeout"),
	}
	// Short options torchrun spells with one letter.
	for _, fl := range f {
		if sf, ok := fl.(*cli.StringFlag); ok && (sf.Name == "redirects" || sf.Name == "tee") {
			sf.Aliases = append(sf.Aliases, sf.Name[:1])
		}
		if sf, ok := fl.(*cli.StringFlag); ok && sf.Name == "log-line-prefix-template" {
			sf.EnvVars = append(sf.EnvVars, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
		}
	}
	return f
}

// cmdline is what the command line decides: the agent's options and what
// main does around them.
type cmdline struct {
	opts elastic.Options
	// notices are one-line messages about accepted flags that hyperpodrun
	// serves differently, logged once the logger exists.
	notices []string
	// signals are --signals-to-handle: forwarded to the workers.
	signals []os.Signal
	// level is --server-log-level, when given.
	level *slog.Level
	// python says which interpreter was chosen and why ("" with PYTHON_EXEC
	// or --no-python).
	python string
}

// parseArgs turns the command line (and PET_* variables) into agent options.
// A flag given twice takes its last value, as torchrun's argparse does.
func parseArgs(args []string) (cmdline, error) {
	var opts cmdline
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
	if err := app.Run(canonicalSpellings(args, app.Flags)); err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			return opts, err
		}
		if !ran {
			return opts, &usageError{err}
		}
		return opts, err
	}
	if !ran || (opts.opts.Spec.Entrypoint == "" && perr == nil) {
		return opts, errHelpShown
	}
	return opts, nil
}

// canonicalSpellings rewrites hyperpodrun's own options (those before the
// training script) to their dashed spelling: urfave/cli refuses two
// spellings of one flag ("--nproc_per_node 2 --nproc-per-node 4"), where
// torchrun's argparse takes the last, as it does for one spelling given
// twice. The script's own arguments are never touched.
func canonicalSpellings(args []string, fl []cli.Flag) []string {
	names := map[string]string{} // any spelling -> canonical name
	takesValue := map[string]bool{}
	for _, f := range fl {
		all := f.Names()
		for _, n := range all {
			names[n] = all[0]
		}
		if _, isBool := f.(*cli.BoolFlag); !isBool {
			takesValue[all[0]] = true
		}
	}
	out := append([]string(nil), args...)
	for i := 1; i < len(out); i++ {
		a := out[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			break // the training script starts here
		}
		body := strings.TrimLeft(a, "-")
		dashes := a[:len(a)-len(body)]
		name, value, hasValue := strings.Cut(body, "=")
		canon, ok := names[name]
		if !ok {
			continue
		}
		if len(canon) > 1 {
			dashes = "--"
		}
		if hasValue {
			out[i] = dashes + canon + "=" + value
		} else {
			out[i] = dashes + canon
			if takesValue[canon] {
				i++ // skip the value, which may start with "-"
			}
		}
	}
	return out
}

func optionsFrom(c *cli.Context) (cmdline, error) {
	var cl cmdline
	o := &cl.opts
	bad := func(format string, a ...any) (cmdline, error) {
		return cl, &usageError{fmt.Errorf(format, a...)}
	}
	if c.NArg() == 0 {
		if c.NumFlags() == 0 {
			cli.ShowAppHelp(c)
			return cl, nil
		}
		return bad("missing the training script: hyperpodrun [options] training_script [args...]")
	}
	var err error
	if o.MinNodes, o.MaxNodes, err = elastic.ParseNNodes(c.String("nnodes")); err != nil {
		return bad("%v", err)
	}
	nproc, devKind, err := parseNProc(c.String("nproc-per-node"))
	if err != nil {
		return bad("%v", err)
	}
	std, err := stdFlags(c)
	if err != nil {
		return cl, err
	}
	if err := checkWorkerFlags(c); err != nil {
		return cl, err
	}
	if o.ShutdownSignal, o.ElasticSignal, err = signalFlags(c); err != nil {
		return cl, err
	}
	if err := timeoutFlags(c, o); err != nil {
		return cl, err
	}
	if err := rdzvFlags(c, o); err != nil {
		return cl, err
	}
	o.NoAgentStore = c.Bool("no-agent-store")
	o.InProcessResize = c.Bool("inprocess-resize")
	o.MaxRestarts = c.Int("max-restarts")
	o.NodeRank = c.Int("node-rank")
	o.MasterAddr = c.String("master-addr")
	o.MasterPort = c.Int("master-port")
	o.LocalAddr = c.String("local-addr")
	o.BaseLogDir = c.String("log-dir")
	if s := c.String("pre-train-script"); s != "" {
		o.PreTrain = append([]string{s}, strings.Fields(c.String("pre-train-args"))...)
	}
	if s := c.String("post-train-script"); s != "" {
		o.PostTrain = append([]string{s}, strings.Fields(c.String("post-train-args"))...)
	}
	if err := rdzvBackend(&cl); err != nil {
		return cl, err
	}
	if err := specFrom(c, o, nproc, devKind, std); err != nil {
		return cl, err
	}
	if err := torch2Flags(c, &cl, devKind); err != nil {
		return cl, err
	}
	if err := hyperpodFlags(c, &cl); err != nil {
		return cl, err
	}
	if !o.Spec.NoPython && o.Spec.PythonExec == "" {
		py, why := launcher.FindPython()
		o.Spec.PythonExec = py
		cl.python = py + ": " + why
	}
	return cl, nil
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
	case procXPU:
		if n := countXPUs(); n > 0 {
			return n, procXPU, nil
		}
		return 0, "", fmt.Errorf("--nproc-per-node xpu: no Intel GPU (XPU) found on this node (no render node of vendor 0x8086 under %s); give a number or gpu, cpu or auto", drmRoot)
	case "gpu", "cpu", "auto":
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return local.LocalProcs(ctx, v)
	}
	return 0, "", fmt.Errorf("--nproc-per-node %q: want a number >= 1, or gpu, cpu, xpu or auto", v)
}

// valueOrFile returns a flag's value, or the first line of the file named
// after an "@" (the node agent hands a container its rendezvous endpoint
// and settings in files, not on the command line).
func valueOrFile(flag, v string) (string, error) {
	path, ok := strings.CutPrefix(v, "@")
	if !ok {
		return v, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", &usageError{fmt.Errorf("--%s @%s: %w", flag, path, err)}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line), nil
}

// badf is a usage error.
func badf(format string, a ...any) error {
	return &usageError{fmt.Errorf(format, a...)}
}

// stdStreams are --redirects, --tee and --local-ranks-filter.
type stdStreams struct {
	redirects, tee launcher.StdSpec
	filter         map[int]bool
}

func stdFlags(c *cli.Context) (stdStreams, error) {
	var st stdStreams
	var err error
	if st.redirects, err = launcher.ParseStd("redirects", c.String("redirects")); err != nil {
		return st, badf("%v", err)
	}
	if st.tee, err = launcher.ParseStd("tee", c.String("tee")); err != nil {
		return st, badf("%v", err)
	}
	if st.filter, err = launcher.ParseRankFilter(c.String("local-ranks-filter")); err != nil {
		return st, badf("%v", err)
	}
	return st, nil
}

// checkWorkerFlags checks the flags about how workers start.
func checkWorkerFlags(c *cli.Context) error {
	switch sm := c.String("start-method"); sm {
	case "spawn", "fork", "forkserver":
	default:
		return badf("--start-method %q: choose spawn, fork or forkserver", sm)
	}
	if c.Int("max-restarts") < 0 {
		return badf("--max-restarts must be >= 0")
	}
	if c.Int("master-port") < 0 || c.Int("master-port") > 65535 {
		return badf("--master-port %d is not a TCP port (0-65535)", c.Int("master-port"))
	}
	if c.Bool("module") && c.Bool("no-python") {
		return badf("--module and --no-python cannot be used together")
	}
	return nil
}

// signalFlags are --shutdown-signal and --elastic-signal.
func signalFlags(c *cli.Context) (shutdown, elastic syscall.Signal, err error) {
	if shutdown, err = launcher.ParseSignal(c.String("shutdown-signal")); err != nil {
		return 0, 0, badf("--shutdown-signal: %v", err)
	}
	if elastic, err = launcher.ParseSignal(c.String("elastic-signal")); err != nil {
		return 0, 0, badf("--elastic-signal: %v", err)
	}
	if elastic == syscall.SIGKILL || elastic == syscall.SIGSTOP {
		return 0, 0, badf("--elastic-signal %s: workers cannot catch it to checkpoint; use SIGUSR1 (the default) or another signal they can handle", launcher.SignalName(elastic))
	}
	return shutdown, elastic, nil
}

// timeoutFlags are the timeouts in seconds, each at most maxTimeout.
func timeoutFlags(c *cli.Context, o *elastic.Options) error {
	for _, t := range []struct {
		name string
		to   *time.Duration
	}{
		{"shutdown-timeout", &o.ShutdownTimeout}, {"graceful-timeout", &o.GracefulTimeout},
		{"monitor-interval", &o.MonitorInterval}, {"inprocess-prewarm-timeout", &o.PrewarmTimeout},
		{"hang-timeout", &o.HangTimeout}, {"hang-startup-timeout", &o.HangStartupTimeout},
	} {
		v := c.Float64(t.name)
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > maxTimeout.Seconds() {
			return badf("--%s %v: must be a number of seconds between 0 and %.0f", t.name, v, maxTimeout.Seconds())
		}
		*t.to = time.Duration(v * float64(time.Second))
	}
	return nil
}

// rdzvFlags are the rendezvous flags as given (endpoint and conf may be
// @file).
func rdzvFlags(c *cli.Context, o *elastic.Options) error {
	var err error
	o.RdzvBackend = c.String("rdzv-backend")
	if o.RdzvEndpoint, err = valueOrFile("rdzv-endpoint", c.String("rdzv-endpoint")); err != nil {
		return err
	}
	o.RdzvID = c.String("rdzv-id")
	if err := checkRdzvID(o.RdzvID, o.RdzvBackend, c.Bool("standalone")); err != nil {
		return err
	}
	if o.RdzvConf, err = valueOrFile("rdzv-conf", c.String("rdzv-conf")); err != nil {
		return err
	}
	o.Standalone = c.Bool("standalone")
	return nil
}

// rdzvBackend settles the rendezvous: the backend (hyperpod rendezvouses
// as c10d), --rdzv-conf's keys, and --standalone's local rendezvous.
func rdzvBackend(cl *cmdline) error {
	o := &cl.opts
	switch o.RdzvBackend {
	case "static", "etcd", "etcd-v2", "etcd-v3", "c10d":
	case "hyperpod":
		// HyperPod's operator-driven rendezvous: hyperpodrun has no operator
		// to talk to; with an endpoint it rendezvouses the way c10d does.
		if o.RdzvEndpoint == "" && !o.Standalone {
			return badf("--rdzv-backend hyperpod: hyperpodrun has no HyperPod operator to rendezvous through; give --rdzv-endpoint HOST:PORT (an etcd, or the address of the node that hosts the rendezvous, as with c10d) or use --standalone")
		}
		o.RdzvBackend = "c10d"
		cl.notices = append(cl.notices, "--rdzv-backend hyperpod: rendezvousing as c10d on "+o.RdzvEndpoint+" (the node owning that address hosts an embedded etcd; others join it)")
	default:
		return badf("--rdzv-backend %q: choose static, etcd, c10d or hyperpod", o.RdzvBackend)
	}
	conf, confNotes, err := splitRdzvConf(o.RdzvConf, o.RdzvBackend == "c10d")
	if err != nil {
		return badf("%v", err)
	}
	o.RdzvConf = conf
	cl.notices = append(cl.notices, confNotes...)
	if la, ok := confValue(o.RdzvConf, "local_addr"); ok {
		if o.LocalAddr == "" {
			o.LocalAddr = la
		}
		o.RdzvConf = dropConf(o.RdzvConf, "local_addr")
	}
	if o.Standalone {
		// torchrun --standalone: one node, a local rendezvous, a random id.
		o.RdzvBackend = "standalone"
		o.MinNodes, o.MaxNodes, o.NodeRank = 1, 1, 0
		o.RdzvID = elastic.RandomID()
		o.MasterAddr = "localhost" // torchrun's MASTER_ADDR under --standalone
	}
	return nil
}

// specFrom is what the workers run.
func specFrom(c *cli.Context, o *elastic.Options, nproc int, devKind string, std stdStreams) error {
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
		Redirects:    std.redirects,
		Tee:          std.tee,
		RanksFilter:  std.filter,
	}
	if c.Bool("pin-devices") {
		if devKind == "" || devKind == local.ProcCPU {
			return badf("--pin-devices needs --nproc-per-node gpu or auto on a node with GPUs or Neuron devices (got %q)", c.String("nproc-per-node"))
		}
		o.Spec.RankEnv = func(lr int) map[string]string { return local.PinEnv(devKind, lr, nproc) }
	}
	return nil
}

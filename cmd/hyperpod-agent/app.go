package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/urfave/cli/v2"
	"go.opentelemetry.io/otel/attribute"

	"github.com/hyperpodrun/hyperpodrun/agent/node/containers"
	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn/etcdflags"
	"github.com/hyperpodrun/hyperpodrun/internal/telemetry"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// drainTimeout bounds the graceful exit after SIGTERM.
const drainTimeout = 30 * time.Second

// usageError marks errors that are the caller's (bad flags): exit 2.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func onUsageError(_ *cli.Context, err error, _ bool) error { return usageError{err} }

// run executes the CLI and returns the exit status. sig delivers SIGTERM and
// SIGINT: the first drains, a second stops at once.
func run(args []string, stdout, stderr io.Writer, sig <-chan os.Signal) int {
	unknown := ""
	app := newApp(stdout, stderr, sig)
	app.CommandNotFound = func(_ *cli.Context, cmd string) { unknown = cmd }
	err := app.Run(args)
	switch {
	case unknown != "":
		fmt.Fprintf(stderr, "hyperpod-agent: unknown command %q (commands: run, devices)\n", unknown)
		return exitUsage
	case err == nil:
		return exitOK
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "hyperpod-agent: %v\nRun 'hyperpod-agent --help' for usage.\n", err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "hyperpod-agent: %v\n", err)
		return exitFailure
	}
}

func newApp(stdout, stderr io.Writer, sig <-chan os.Signal) *cli.App {
	discoveryFlags := []cli.Flag{
		&cli.StringFlag{Name: "node-name", EnvVars: []string{"NODE_NAME"}, Usage: "node name in etcd (default: the hostname; under Kubernetes pass spec.nodeName)"},
		&cli.StringFlag{Name: "neuron-sysfs-root", Value: devices.DefaultNeuronSysfsRoot, Usage: "the Neuron driver's sysfs directory"},
		&cli.StringFlag{Name: "dev-root", Value: "/dev", Usage: "where device nodes (/dev/neuron<N>, /dev/nvidia<N>) live"},
		&cli.BoolFlag{Name: "disable-nvml", Usage: "skip NVIDIA GPU discovery"},
		&cli.BoolFlag{Name: "disable-neuron", Usage: "skip AWS Neuron discovery"},
	}
	return &cli.App{
		Name:           "hyperpod-agent",
		Usage:          "report this node's accelerators to hyperpodrun's etcd and run the work placed on it",
		Writer:         stdout,
		ErrWriter:      stderr,
		OnUsageError:   onUsageError,
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: []*cli.Command{
			{
				Name:         "run",
				Usage:        "register the node in etcd and keep its inventory current until SIGTERM",
				OnUsageError: onUsageError,
				Flags: append([]cli.Flag{
					&cli.DurationFlag{Name: "etcd-dial-timeout", Value: 5 * time.Second, Usage: "etcd connection timeout"},
					&cli.BoolFlag{Name: "embedded-etcd", Usage: "start an in-process etcd (local try-outs; ignores --etcd-endpoints)"},
					&cli.StringFlag{Name: "listen", Value: nodeagent.DefaultListen, Usage: "address of /healthz, /metrics and /inventory (empty: none)"},
					&cli.DurationFlag{Name: "lease-ttl", Value: nodeagent.DefaultLeaseTTL, Usage: "how long a dead agent's node stays in etcd (>= 1s)"},
					&cli.DurationFlag{Name: "refresh-interval", Value: nodeagent.DefaultRefreshInterval, Usage: "how often health is rediscovered (>= 100ms)"},
					&cli.BoolFlag{Name: "run-jobs", Value: true, Usage: "start and stop the hyperpodrun of every job the coordinator places on this node"},
					&cli.StringFlag{Name: "hyperpodrun", Value: "hyperpodrun", Usage: "hyperpodrun binary the jobs run with"},
					&cli.StringFlag{Name: "job-run-dir", Usage: "where each run of a job gets its own directory, the job's alone (TMPDIR, HOME with --job-uid-range, its etcd password file; for containers, the files they mount); root's and writable by no one else, else the agent refuses to start; in a pod, a hostPath mounted at the same path, since containerd resolves mounts on the host (default: /run/hyperpod-agent as root, else $TMPDIR/hyperpod-agent-<uid>)"},
					&cli.StringFlag{Name: "job-log-dir", Usage: "base of the jobs' log directories: a job's is <job-log-dir>/<node>/<job>/, its own, mode 0700 (its hyperpodrun's --log-dir; default: hyperpodrun's temporary dirs)"},
					&cli.StringFlag{Name: "job-uid-range", EnvVars: []string{"HYPERPOD_JOB_UID_RANGE"}, Usage: "FIRST-LAST, e.g. 200000-299999: run each job as its own uid (= gid, no supplementary groups), the one the coordinator gave it from the same range (hyperpod-coordinator --job-uid-range), so jobs cannot read, write or signal each other; uids no user of the host has; wins over --job-user"},
					&cli.StringFlag{Name: "job-user", EnvVars: []string{"HYPERPOD_JOB_USER"}, Usage: "run jobs as this unprivileged user (name, uid or uid:gid); an agent running as root needs it or --allow-root-jobs"},
					&cli.BoolFlag{Name: "allow-root-jobs", Usage: "let an agent running as root run jobs as root (laptops, CI); a fleet gives --job-user"},
					&cli.StringSliceFlag{Name: "allow-job-env", Usage: "run.env names to allow although refused (LD_*, PATH, HYPERPODRUN_*, ...), e.g. --allow-job-env LD_LIBRARY_PATH"},
					&cli.StringFlag{Name: "runtime", Value: runtimeAuto, EnvVars: []string{"HYPERPOD_RUNTIME"}, Usage: "where jobs naming run.image run: containerd, process (they fail) or auto (containerd when its socket answers); jobs without an image always run as host processes"},
					&cli.StringFlag{Name: "containerd-address", Value: containers.DefaultAddress, Usage: "containerd's socket"},
					&cli.StringFlag{Name: "containerd-namespace", Value: containers.DefaultNamespace, Usage: "containerd namespace of the jobs' containers"},
					&cli.StringFlag{Name: "containerd-snapshotter", Usage: "containerd snapshotter (default: containerd's)"},
					&cli.StringFlag{Name: "container-hyperpodrun", Usage: "static hyperpodrun mounted into containers whose job names no run.command (default: hyperpodrun-static beside this binary or on PATH)"},
					&cli.StringSliceFlag{Name: "allow-mount-source", Usage: "a host directory whose contents container jobs may bind-mount (run.mounts); repeat for several; none by default: no host mounts. Never /, /etc, /proc, /sys, /dev, /run, /var/run, /boot, /root, containerd's or docker's state, nor a directory holding one"},
					&cli.Uint64Flag{Name: "container-nofile", Value: containers.DefaultNoFile, Usage: "RLIMIT_NOFILE (soft and hard) of the jobs' containers, at most the node's fs.nr_open"},
					&cli.StringSliceFlag{Name: "cdi-spec-dir", Value: cli.NewStringSlice("/etc/cdi", "/var/run/cdi"), Usage: "where CDI specs live (the NVIDIA container toolkit writes them)"},
					&cli.StringFlag{Name: "registry-config", Usage: "docker-style config.json with registry credentials (auths)"},
					&cli.StringSliceFlag{Name: "insecure-registry", Usage: "registries (host:port) pulled over plain HTTP; loopback always is"},
					&cli.StringFlag{Name: "job-etcd-cert", Usage: "client certificate the jobs' hyperpodrun present to etcd (with --job-etcd-key); the agent's own --etcd-cert never reaches a job"},
					&cli.StringFlag{Name: "job-etcd-key", Usage: "client key for --job-etcd-cert"},
					&cli.StringFlag{Name: "job-otlp-endpoint", Usage: "OTLP endpoint the jobs' hyperpodrun (and workers) export traces to, e.g. http://collector:4318; set in each job's environment as OTEL_EXPORTER_OTLP_ENDPOINT with OTEL_SERVICE_NAME=hyperpodrun and OTEL_RESOURCE_ATTRIBUTES naming node, job and team (the agent's own OTEL_* variables never reach a job); empty: jobs export nothing"},
					&cli.StringFlag{Name: "job-otlp-protocol", Usage: "OTLP protocol of --job-otlp-endpoint: http/protobuf (default) or grpc"},
					&cli.StringFlag{Name: "job-otlp-headers-file", Usage: "file of OTLP headers for the jobs' exports (OTEL_EXPORTER_OTLP_HEADERS format: key=value, comma- or newline-separated, values URL-encoded; e.g. authorization=Bearer%20<token>): copied into each run's own directory, readable by the job's uid alone, never on a command line or in an environment"},
					&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
					&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json"},
				}, append(append(etcdflags.Set{}.Flags(), enrollFlags()...), discoveryFlags...)...),
				Action: func(c *cli.Context) error { return runAgent(c, sig) },
			},
			{
				Name:         "devices",
				Usage:        "print this node's inventory (like nvidia-smi -L / neuron-ls)",
				OnUsageError: onUsageError,
				Flags: append([]cli.Flag{
					&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table or json"},
				}, discoveryFlags...),
				Action: printDevices,
			},
		},
	}
}

func newLogger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", c.String("log-level"))
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.String("log-format") {
	case "text":
		return slog.New(slog.NewTextHandler(c.App.ErrWriter, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(c.App.ErrWriter, opts)), nil
	default:
		return nil, usagef("--log-format %q: want text or json", c.String("log-format"))
	}
}

func discoveryOptions(c *cli.Context) (devices.Options, error) {
	opts := devices.Options{
		NodeName:        c.String("node-name"),
		NeuronSysfsRoot: c.String("neuron-sysfs-root"),
		DevRoot:         c.String("dev-root"),
		DisableNVML:     c.Bool("disable-nvml"),
		DisableNeuron:   c.Bool("disable-neuron"),
	}
	if opts.NodeName != "" {
		if err := devices.ValidateNodeName(opts.NodeName); err != nil {
			return opts, usagef("--node-name: %v", err)
		}
	}
	if c.NArg() > 0 {
		return opts, usagef("unexpected arguments %q", c.Args().Slice())
	}
	return opts, nil
}

func printDevices(c *cli.Context) error {
	out := c.String("output")
	if out != "table" && out != "json" {
		return usagef("--output %q: want table or json", out)
	}
	opts, err := discoveryOptions(c)
	if err != nil {
		return err
	}
	inv, derr := devices.Discover(c.Context, opts)
	if inv == nil {
		return derr
	}
	if out == "json" {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		if err := enc.Encode(inv); err != nil {
			return err
		}
	} else if err := inv.WriteTable(c.App.Writer); err != nil {
		return err
	}
	if derr != nil {
		return fmt.Errorf("inventory is incomplete: %w", derr)
	}
	return nil
}

func runAgent(c *cli.Context, sig <-chan os.Signal) error {
	f, err := parseRunFlags(c)
	if err != nil {
		return err
	}
	log, opts := f.log, f.discovery
	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	jobs, err := prepareJobs(ctx, c, f)
	if err != nil {
		return err
	}
	if jobs.ctrd != nil {
		defer jobs.ctrd.Close()
	}
	etcdCli, endpoints, closeEtcd, err := connectEtcd(ctx, c, f.conn, log)
	if err != nil {
		return err
	}
	defer closeEtcd()

	var health *devices.HealthMonitor
	if !opts.DisableNVML {
		health = devices.WatchHealth(ctx, opts, log)
		defer health.Close()
		opts.Health = health
	}
	nodeName, err := resolveNodeName(ctx, &opts)
	if err != nil {
		return err
	}
	if etcdCli, err = enrollAsNode(ctx, c, etcdCli, f.conn, f.prefix, nodeName, log); err != nil {
		return err
	}
	defer etcdCli.Close()
	// The agent's own spans (OTEL_* of its environment, which no job
	// inherits), under the coordinator's decisions.
	if telemetry.Enabled() {
		tp, shutdown, err := telemetry.Setup(ctx, "hyperpod-agent", attribute.String(telemetry.NodeAttr, nodeName))
		if err != nil {
			return usagef("tracing: %v", err)
		}
		defer func() {
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			shutdown(sctx)
		}()
		f.tracer = tp
	}
	cfg := nodeagent.Config{
		NodeName:        nodeName,
		Prefix:          f.prefix,
		LeaseTTL:        f.ttl,
		RefreshInterval: f.refresh,
		Discover:        nodeagent.DiscoverWith(opts),
		Listen:          c.String("listen"),
		Logger:          log,
	}
	if health != nil {
		cfg.HealthEvents = health.Changed()
	}
	if c.Bool("run-jobs") {
		cfg.Workloads = newJobRunner(c, f, jobs, endpoints)
	}
	agent, err := nodeagent.New(etcdCli, cfg)
	if err != nil {
		return usageError{err}
	}
	return serveUntilSignals(ctx, cancel, agent, sig, log, nodeName, f.ttl)
}

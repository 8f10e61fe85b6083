package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/hyperpodrun/hyperpodrun/agent/node/containers"
	"github.com/hyperpodrun/hyperpodrun/agent/node/jobrunner"
	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn/etcdflags"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
)

// runFlags are run's settings, all checked before anything starts.
type runFlags struct {
	log          *slog.Logger
	discovery    devices.Options
	ttl, refresh time.Duration
	conn         etcdconn.Options
	prefix       string
	jobUser      jobrunner.JobUser
	uidRange     jobrunner.UIDRange
	// jobTracing is where the jobs export traces (--job-otlp-*); tracer
	// traces the agent's own actions (nil: OTEL_* asks for nothing).
	jobTracing jobrunner.JobTracing
	tracer     trace.TracerProvider
}

// parseRunFlags reads and checks run's flags; its errors are usage errors.
func parseRunFlags(c *cli.Context) (runFlags, error) {
	var f runFlags
	var err error
	if f.log, err = newLogger(c); err != nil {
		return f, err
	}
	if f.discovery, err = discoveryOptions(c); err != nil {
		return f, err
	}
	f.ttl, f.refresh = c.Duration("lease-ttl"), c.Duration("refresh-interval")
	if f.ttl < time.Second {
		return f, usagef("--lease-ttl %s: must be at least 1s", f.ttl)
	}
	if f.refresh < 100*time.Millisecond {
		return f, usagef("--refresh-interval %s: must be at least 100ms", f.refresh)
	}
	f.conn, f.prefix, err = etcdflags.Set{NoEndpoints: c.Bool("embedded-etcd"), RequiredHint: "(or --embedded-etcd for a local try-out)"}.Parse(c)
	if err != nil {
		return f, usageError{err}
	}
	f.conn.DialTimeout = c.Duration("etcd-dial-timeout")
	if l := c.String("listen"); l != "" {
		if _, err := net.ResolveTCPAddr("tcp", l); err != nil {
			return f, usagef("--listen %s: %v", l, err)
		}
	}
	if f.jobUser, err = jobrunner.ParseJobUser(c.String("job-user")); err != nil {
		return f, usagef("%v", err)
	}
	if f.uidRange, err = jobrunner.ParseUIDRange(c.String("job-uid-range")); err != nil {
		return f, usagef("%v", err)
	}
	if (c.String("job-etcd-cert") == "") != (c.String("job-etcd-key") == "") {
		return f, usagef("--job-etcd-cert and --job-etcd-key go together")
	}
	f.jobTracing = jobrunner.JobTracing{Endpoint: c.String("job-otlp-endpoint"), Protocol: c.String("job-otlp-protocol"), HeadersFile: c.String("job-otlp-headers-file")}
	if err := f.jobTracing.Check(); err != nil {
		return f, usagef("%v", err)
	}
	return f, nil
}

// jobHost is where the jobs run: containerd (nil: host processes only),
// the static hyperpodrun mounted into containers, the runs' base directory.
type jobHost struct {
	ctrd           *containers.Runtime
	ctrHyperpodrun string
	runDir         string
}

// prepareJobs sets up what running jobs needs, and refuses (before
// anything runs) an agent that would run jobs as root or a run directory
// others could write. The caller closes ctrd.
func prepareJobs(ctx context.Context, c *cli.Context, f runFlags) (jobHost, error) {
	var h jobHost
	var err error
	if c.Bool("run-jobs") {
		if h.ctrd, err = pickRuntime(ctx, c, f.log); err != nil {
			return h, err
		}
		if h.ctrd != nil {
			if h.ctrHyperpodrun, err = staticHyperpodrun(c.String("container-hyperpodrun"), c.String("hyperpodrun")); err != nil {
				return h, usagef("%v", err)
			}
			if h.ctrHyperpodrun == "" {
				f.log.Warn("no static hyperpodrun to mount into containers: jobs naming run.image need run.command (their image's own hyperpodrun); give --container-hyperpodrun")
			}
		}
	}
	if c.Bool("run-jobs") && h.ctrd == nil && os.Geteuid() == 0 && !f.jobUser.Set && !f.uidRange.Set() && !c.Bool("allow-root-jobs") {
		return h, usagef("hyperpod-agent runs as root and would run every job as root: give --job-user <unprivileged user> (e.g. --job-user nobody) or --job-uid-range FIRST-LAST (each job its own uid), or --allow-root-jobs to run them as root on purpose")
	}
	h.runDir = c.String("job-run-dir")
	if h.runDir == "" {
		h.runDir = jobrunner.DefaultRunDir()
	}
	if c.Bool("run-jobs") {
		// Refused before anything runs: every job's password file and
		// TMPDIR go below it.
		d, err := jobrunner.EnsureBaseDir(h.runDir)
		if err != nil {
			return h, usagef("--job-run-dir: %v", err)
		}
		d.Close()
	}
	return h, nil
}

// connectEtcd starts the embedded etcd (--embedded-etcd) or connects to
// the given one. It returns the client, the endpoints the jobs get, and
// what closes both.
func connectEtcd(ctx context.Context, c *cli.Context, conn etcdconn.Options, log *slog.Logger) (*clientv3.Client, []string, func(), error) {
	if c.Bool("embedded-etcd") {
		srv, err := etcdembed.Start(ctx, etcdembed.Options{})
		if err != nil {
			return nil, nil, nil, err
		}
		log.Info("embedded etcd started", "endpoints", srv.Endpoints)
		cli, err := srv.Client()
		if err != nil {
			srv.Close()
			return nil, nil, nil, err
		}
		return cli, srv.Endpoints, func() { cli.Close(); srv.Close() }, nil
	}
	cli, err := etcdconn.Connect(ctx, conn)
	if err != nil {
		return nil, nil, nil, err
	}
	if simple, err := etcdconn.SimpleTokens(ctx, cli); err == nil && simple {
		log.Warn(etcdconn.SimpleTokenWarning)
	}
	return cli, conn.Endpoints, func() { cli.Close() }, nil
}

// resolveNodeName is --node-name, else the hostname (set into opts).
func resolveNodeName(ctx context.Context, opts *devices.Options) (string, error) {
	if opts.NodeName != "" {
		return opts.NodeName, nil
	}
	h, err := devices.SystemHost{}.HostInfo(ctx)
	if err != nil || h.Hostname == "" {
		return "", usagef("--node-name is required: cannot read the hostname (%v)", err)
	}
	if err := devices.ValidateNodeName(h.Hostname); err != nil {
		return "", usagef("--node-name is required: hostname: %v", err)
	}
	opts.NodeName = h.Hostname
	return h.Hostname, nil
}

// newJobRunner runs the jobs placed on this node. Jobs get the CA to
// trust, and a client certificate only if one is given for them: never
// the agent's own credentials.
func newJobRunner(c *cli.Context, f runFlags, h jobHost, endpoints []string) *jobrunner.Runner {
	var conf []string
	for _, fl := range []struct{ flag, key string }{{"etcd-cacert", "cacert"}, {"job-etcd-cert", "cert"}, {"job-etcd-key", "key"}} {
		if v := c.String(fl.flag); v != "" {
			conf = append(conf, fl.key+"="+v)
		}
	}
	return jobrunner.New(jobrunner.Config{Hyperpodrun: c.String("hyperpodrun"), Endpoints: endpoints,
		RdzvConf: strings.Join(conf, ","), LogDir: c.String("job-log-dir"), TempDir: h.runDir, Logger: f.log,
		JobUser: f.jobUser, UIDRange: f.uidRange, AllowRootJobs: c.Bool("allow-root-jobs"), AllowEnv: c.StringSlice("allow-job-env"),
		Tracer: f.tracer, JobTracing: f.jobTracing,
		Containers: h.ctrd, ContainerHyperpodrun: h.ctrHyperpodrun,
		// The agent reads a job's own keys (its restart count, its
		// rendezvous) as the job: the same TLS as the jobs get, the job's
		// user and password.
		DialJob: func(ctx context.Context, user, password string) (*clientv3.Client, error) {
			o := f.conn
			o.Endpoints, o.User, o.Password = endpoints, user, password
			o.Cert, o.Key = c.String("job-etcd-cert"), c.String("job-etcd-key")
			return etcdconn.Connect(ctx, o)
		}})
}

// serveUntilSignals runs the agent until it ends or a signal comes: the
// first drains (bounded by drainTimeout), a second stops at once.
func serveUntilSignals(ctx context.Context, cancel context.CancelFunc, agent *nodeagent.Agent, sig <-chan os.Signal, log *slog.Logger, node string, ttl time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	log.Info("hyperpod-agent running", "node", node, "key", agent.Key(), "lease_ttl", ttl)
	select {
	case err := <-done:
		return err
	case s := <-sig:
		log.Info("signal received; draining", "signal", s.String())
		go func() {
			dctx, dcancel := context.WithTimeout(ctx, drainTimeout)
			defer dcancel()
			if err := agent.Drain(dctx); err != nil {
				log.Error("drain incomplete; the node expires with its lease", "err", err)
				cancel()
			}
		}()
	}
	select {
	case err := <-done:
		return err
	case s := <-sig:
		log.Warn("second signal; stopping without draining", "signal", s.String())
		cancel()
		return <-done
	}
}

// Command hyperpod-coordinator runs quota-aware fair-share admission and
// elastic sizing over the fleet registered in etcd. Run two for HA: one is
// elected leader, the other takes over when it goes away.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn/etcdflags"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/telemetry"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

func main() { os.Exit(run(os.Args, os.Stderr)) }

type usageError struct{ error }

func run(args []string, stderr io.Writer) int {
	app := &cli.App{
		Name:  "hyperpod-coordinator",
		Usage: "quota-aware fair-share admission and elastic sizing",
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "embedded-etcd", Usage: "run an in-process etcd (try-outs; not for production)"},
			&cli.DurationFlag{Name: "min-stable-period", Value: policy.DefaultMinStablePeriod, Usage: "minimum time between growth resizes of a job"},
			&cli.DurationFlag{Name: "resync", Value: 10 * time.Minute, Usage: "run a scheduling cycle at least this often even without a change (a safety net: changes arrive by watch, and the stable period wakes a cycle when due)"},
			&cli.DurationFlag{Name: "debounce", Value: 10 * time.Millisecond, Usage: "coalescing window: a cycle starts this long after the last change of a burst of submits and finish records (the burst extends it for 8 windows from its first; a batch written in transactions of 16 changes or more waits 10 windows after its last change and extends it for 100 windows, at most 1s and 10s but never less than one window and 8 windows), with every change delivered by then"},
			&cli.DurationFlag{Name: "finished-retention", Value: 24 * time.Hour, Usage: "delete a finished job's records (spec, status, events, ...) this long after it finished (0: keep them)"},
			&cli.DurationFlag{Name: "compact-retention", Value: 10 * time.Minute, Usage: "compact etcd's history to this age (0: never, for an etcd run with --auto-compaction-retention; needs etcd's root role with auth on)"},
			&cli.DurationFlag{Name: "event-dedup-window", Value: time.Hour, Usage: "the same decision about a job again within this window counts in its last event instead of adding one"},
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:9401", Usage: "address for /healthz and /metrics (empty: none)"},
			&cli.StringFlag{Name: "id", Usage: "name in the leader election (default hostname-pid)"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error (debug: one line per scheduling cycle with its engine, diff and write times)"},
			&cli.IntFlag{Name: "gc-percent", Value: defaultGCPercent, Usage: "Go's garbage collection target for this process, unless $GOGC is set (0: Go's default, 100): a fleet's coordinator keeps a large heap, and at 20,000 nodes 200 keeps collections out of most decisions for about twice the memory (docs/scale.md); $GOMEMLIMIT caps the memory whatever the target"},
			&cli.BoolFlag{Name: "idle-gc", Value: true, Usage: "start Go's garbage collection between cycles when the next decision's allocation could start one, so that its mark runs while the coordinator waits rather than during a decision (docs/scale.md)"},
			&cli.DurationFlag{Name: "idle-return-after", Value: 30 * time.Second, Usage: "with --idle-gc: once no cycle ran for this long, return the heap's free memory to the operating system (one full collection; 0: never). A cold start or a burst of decisions leaves hundreds of MB resident that an idle coordinator does not need (docs/scale.md)"},
			&cli.IntFlag{Name: "max-events-per-job", Value: 200, Usage: "decision events kept per job (the oldest go first)"},
			&cli.IntFlag{Name: "max-events", Value: 20000, Usage: "decision events kept in all"},
			&cli.BoolFlag{Name: "job-credentials", Value: true, Usage: "with --etcd-user (etcd auth on): mint each admitted job an etcd user limited to its own keys, revoked when it ends (the coordinator's user needs etcd's root role; docs/security.md)"},
			&cli.StringFlag{Name: "job-uid-range", Value: coordinator.DefaultJobUIDRange, Usage: "FIRST-LAST: give each admitted job a uid of this range that no other live job holds (its desired record's and assignments' uid; the node agent runs the job as it); it comes free when the job is forgotten. Keep it apart from the nodes' own users and other uid ranges; none: no uids (docs/security.md)"},
		}, etcdSet.Flags()...),
		ErrWriter:      stderr,
		OnUsageError:   func(_ *cli.Context, err error, _ bool) error { return usageError{err} },
		ExitErrHandler: func(*cli.Context, error) {},
		Action:         serve,
	}
	if err := app.Run(args); err != nil {
		fmt.Fprintf(stderr, "hyperpod-coordinator: %v\n", err)
		var ue usageError
		if errors.As(err, &ue) {
			return 2
		}
		return 1
	}
	return 0
}

// defaultGCPercent is --gc-percent's default. At 20,000 nodes / 50,000
// jobs the coordinator's live heap is about 240 MB and each decision on
// the engine's fast path allocates 17-35 MB: at Go's default of 100 a
// collection comes every 15-30 decisions, and its mark, on a two-core
// host, stretched a 40 ms decision to 200 ms (submit -> decision max
// 250-319 ms). At 200: max 134-149 ms, RSS 1.1-1.2 GB against 0.57-0.61.
const defaultGCPercent = 200

// gcPercent is the GC target the coordinator sets from --gc-percent
// (flag) with $GOGC's value env: 0 when it sets none ($GOGC set, or the
// flag 0).
func gcPercent(flag int, env string) (int, error) {
	switch {
	case flag < 0:
		return 0, fmt.Errorf("--gc-percent %d: want 0 (Go's default) or a percentage such as 200; to turn collection off, set GOGC=off", flag)
	case env != "":
		return 0, nil
	}
	return flag, nil
}

// etcdSet is how the coordinator takes the --etcd-* flags.
var etcdSet = etcdflags.Set{DefaultEndpoints: []string{etcdflags.DefaultEndpoint}}

func serve(c *cli.Context) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", c.String("log-level"))}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if p, err := gcPercent(c.Int("gc-percent"), os.Getenv("GOGC")); err != nil {
		return usageError{err}
	} else if p > 0 {
		debug.SetGCPercent(p)
	}
	if c.Int("max-events-per-job") < 1 || c.Int("max-events") < 1 {
		return usageError{errors.New("--max-events-per-job and --max-events must be at least 1")}
	}
	if d := c.Duration("min-stable-period"); d < 0 || d > 24*time.Hour {
		return usageError{fmt.Errorf("--min-stable-period %s: must be between 0 and 24h", d)}
	}
	if d := c.Duration("resync"); d < 100*time.Millisecond || d > 24*time.Hour {
		return usageError{fmt.Errorf("--resync %s: must be between 100ms and 24h", d)}
	}
	if d := c.Duration("debounce"); d < time.Millisecond || d > 10*time.Second {
		return usageError{fmt.Errorf("--debounce %s: must be between 1ms and 10s", d)}
	}
	for _, f := range []string{"finished-retention", "compact-retention", "idle-return-after"} {
		if d := c.Duration(f); d < 0 || (d > 0 && d < time.Second) {
			return usageError{fmt.Errorf("--%s %s: must be 0 (off) or at least 1s", f, d)}
		}
	}
	uidFirst, uidLast, err := coordinator.ParseUIDRange(c.String("job-uid-range"))
	if err != nil {
		return usageError{fmt.Errorf("--job-uid-range: %w", err)}
	}
	if d := c.Duration("event-dedup-window"); d < time.Second {
		return usageError{fmt.Errorf("--event-dedup-window %s: must be at least 1s", d)}
	}
	opts, prefix, err := etcdSet.Parse(c)
	if err != nil {
		return usageError{err}
	}
	if c.Bool("embedded-etcd") {
		srv, err := etcdembed.Start(ctx, etcdembed.Options{})
		if err != nil {
			return err
		}
		defer srv.Close()
		opts.Endpoints = srv.Endpoints
		log.Info("embedded etcd", "endpoints", strings.Join(opts.Endpoints, ","))
	}
	cli, err := etcdconn.Connect(ctx, opts)
	if err != nil {
		return err
	}
	defer cli.Close()
	if simple, err := etcdconn.SimpleTokens(ctx, cli); err == nil && simple {
		log.Warn(etcdconn.SimpleTokenWarning)
	}

	tp, shutdown, err := telemetry.Setup(ctx, "hyperpod-coordinator")
	if err != nil {
		return usageError{err}
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdown(sctx)
	}()
	m := newMetrics()
	reg := m.reg
	if addr := c.String("listen"); addr != "" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return usageError{fmt.Errorf("--listen %s: %w", addr, err)}
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go hs.Serve(l)
		defer hs.Close()
	}
	off := func(d time.Duration) time.Duration {
		if d == 0 {
			return -1
		}
		return d
	}
	co := coordinator.New(cli, coordinator.Config{
		Prefix: prefix, Identity: c.String("id"), Resync: c.Duration("resync"), Debounce: c.Duration("debounce"), Logger: log,
		JobCredentials: opts.User != "" && c.Bool("job-credentials"),
		NodeEnrollment: opts.User != "",
		JobUIDFirst:    uidFirst, JobUIDLast: uidLast,
		Engine:          policy.Config{MinStablePeriod: c.Duration("min-stable-period")},
		MaxEventsPerJob: c.Int("max-events-per-job"), MaxEvents: c.Int("max-events"),
		FinishedRetention: off(c.Duration("finished-retention")), CompactRetention: off(c.Duration("compact-retention")),
		EventDedupWindow: c.Duration("event-dedup-window"),
		IdleGC:           c.Bool("idle-gc"), IdleReturnAfter: c.Duration("idle-return-after"),
		Tracer:  tp,
		OnCycle: m.cycle, OnLeader: m.setLeader, OnEtcdError: m.etcdError,
	})
	m.countReturns(co.MemoryReturns)
	return co.Run(ctx)
}

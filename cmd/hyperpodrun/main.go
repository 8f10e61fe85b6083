// Command hyperpodrun is a drop-in replacement for torchrun that makes any
// PyTorch job elastic on etcd v3. It accepts torchrun's flags in both
// spellings and PET_* environment defaults, and sets exactly torchrun's
// worker environment.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/hyperpodrun/hyperpodrun/agent/elastic"
	"github.com/hyperpodrun/hyperpodrun/launcher"
)

func main() {
	// hyperpodrun re-executes itself as its workers' watchdog (elastic
	// runs); that process never gets past this call. If the agent dies, the
	// watchdog kills its workers and then revokes its rendezvous lease.
	launcher.OnAgentDeath(elastic.RevokeOrphanedLease)
	launcher.WatchdogMain()
	os.Exit(run(os.Args, os.Stderr))
}

// run is main without the exit, so tests can call it in-process.
func run(args []string, stderr *os.File) int {
	cl, err := parseArgs(args)
	if err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "hyperpodrun: %v\nRun 'hyperpodrun --help' for the options.\n", ue.err)
			return 2
		}
		if errors.Is(err, errHelpShown) {
			return 0
		}
		fmt.Fprintf(stderr, "hyperpodrun: %v\n", err)
		return 1
	}
	level := logLevel()
	if cl.level != nil {
		level = *cl.level
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	opts := cl.opts
	if cl.python != "" {
		logger.Info("python interpreter", "python", cl.python)
	}
	for _, n := range cl.notices {
		logger.Warn(n)
	}
	// Reap every descendant: workers' orphans are re-parented to us, and in a
	// container we may be PID 1.
	if err := launcher.EnableSubreaper(); err != nil {
		logger.Warn("cannot become child subreaper; orphans of workers go to init", "err", err)
	}
	sigs := make(chan os.Signal, 4)
	handled := cl.signals
	if len(handled) == 0 {
		handled = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT}
	}
	signal.Notify(sigs, handled...)
	switch opts.RdzvBackend {
	case "etcd", "etcd-v2", "etcd-v3", "c10d":
		// SIGUSR2: planned drain of this node (checkpoint, leave, exit 0).
		signal.Notify(sigs, syscall.SIGUSR2)
	}
	opts.Signals = sigs
	opts.Logger = logger
	opts.Stderr = stderr

	ctx := context.Background()
	err = elastic.Run(ctx, opts)
	if n := launcher.KillOrphans(nil); n > 0 {
		logger.Warn("killed processes the workers left behind", "count", n)
	}
	if err != nil {
		fmt.Fprintf(stderr, "hyperpodrun: %v\n", err)
		var ee *elastic.ExitError
		if errors.As(err, &ee) {
			return ee.Code
		}
		return 1
	}
	return 0
}

func logLevel() slog.Level {
	switch os.Getenv("LOGLEVEL") { // torchrun honours LOGLEVEL
	case "DEBUG":
		return slog.LevelDebug
	case "WARNING", "WARN":
		return slog.LevelWarn
	case "ERROR":
		return slog.LevelError
	}
	return slog.LevelInfo
}

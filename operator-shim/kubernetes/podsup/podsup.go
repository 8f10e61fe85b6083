// Package podsup is the pod supervisor of a job's pod on Kubernetes: the
// container's first process ("hyperpod-kube-controller pod"), which runs
// the job's hyperpodrun as its child and does for it what the node agent's
// runner does on a node of its own: it watches the coordinator's desired
// record of the job and, when the record no longer places the job on this
// node (a planned shrink, a preemption, a suspension or a deletion),
// drains hyperpodrun (SIGUSR2: the workers checkpoint, the node leaves the
// rendezvous, hyperpodrun exits 0). The kubelet's signals are passed on.
// Its exit status is hyperpodrun's, and a drained exit 0 is written to the
// container's termination message ("drained"), so the controller can tell
// a drained pod from a job that succeeded.
package podsup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// DrainedMessage is written to the termination message after a drain.
const DrainedMessage = "drained"

// Config says what to supervise.
type Config struct {
	// Etcd is the fleet's etcd; Prefix its layout's prefix.
	Etcd   *clientv3.Client
	Prefix string
	// Job and Node name the job and the node this pod runs on.
	Job, Node string
	// Argv is hyperpodrun's command line (the program first).
	Argv []string
	// Env is the child's environment (nil: this process's, as in a pod).
	Env []string
	// Stdout takes the child's output and errors (nil: this process's).
	Stdout *os.File
	// TerminationLog is the container's termination message file
	// (default /dev/termination-log; "-" for none).
	TerminationLog string
	// Signals are the kubelet's signals to pass on to the child (nil: this
	// process's SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2).
	Signals <-chan os.Signal
	Logger  *slog.Logger
}

// Placed says whether desired places the job on node; a missing record
// (not written yet) keeps it.
func Placed(d *fleet.Desired, node string) bool {
	if d == nil {
		return true
	}
	return d.Running() && slices.Contains(d.Nodes, node)
}

// Run runs the child until it exits and returns its exit status (128 +
// signal for a child killed by a signal).
func Run(ctx context.Context, cfg Config) (int, error) {
	if len(cfg.Argv) == 0 {
		return 2, errors.New("pod supervisor: no command to run after --")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TerminationLog == "" {
		cfg.TerminationLog = "/dev/termination-log"
	}
	log := cfg.Logger.With("job", cfg.Job, "node", cfg.Node)
	cmd := exec.Command(cfg.Argv[0], cfg.Argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = cfg.Env
	if cfg.Stdout != nil {
		cmd.Stdout, cmd.Stderr = cfg.Stdout, cfg.Stdout
	}
	sigs := cfg.Signals
	if sigs == nil {
		own := make(chan os.Signal, 4)
		signal.Notify(own, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2)
		defer signal.Stop(own)
		sigs = own
	}
	// A pod of a job that is already stopped, or no longer placed on its
	// node, when it starts (the controller had not deleted it yet, or the
	// kubelet restarted it): hyperpodrun is not started at all. Started
	// and then drained at once, it could take the SIGUSR2 before it
	// handles it, and lose the drain or die of the signal.
	if why, placed := placedAtStart(ctx, cfg); !placed {
		log.Info("not starting hyperpodrun: " + why)
		writeDrained(cfg, log)
		return 0, nil
	}
	if err := cmd.Start(); err != nil {
		return 127, fmt.Errorf("pod supervisor: start %s: %w", cfg.Argv[0], err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	leave := make(chan string, 1)
	go watch(wctx, cfg, log, leave)
	drained := false
	for {
		select {
		case err := <-exited:
			code := exitCode(err)
			if drained && code == 0 {
				writeDrained(cfg, log)
			}
			log.Info("hyperpodrun exited", "code", code, "drained", drained)
			return code, nil
		case why := <-leave:
			if !drained {
				drained = true
				log.Info("draining hyperpodrun (SIGUSR2): " + why)
				if err := cmd.Process.Signal(syscall.SIGUSR2); err != nil {
					log.Warn("cannot signal hyperpodrun", "err", err)
				}
			}
		case s := <-sigs:
			log.Info("passing a signal on to hyperpodrun", "signal", s)
			cmd.Process.Signal(s)
		}
	}
}

// writeDrained writes DrainedMessage as the container's termination
// message.
func writeDrained(cfg Config, log *slog.Logger) {
	if cfg.TerminationLog == "-" {
		return
	}
	if err := os.WriteFile(cfg.TerminationLog, []byte(DrainedMessage), 0o644); err != nil {
		log.Warn("cannot write the termination message", "err", err)
	}
}

// placedAtStart reads the desired record once: placed is false, with the
// reason, when it no longer places the job on this node. An unreadable or
// malformed record places it (the watch goes on trying).
func placedAtStart(ctx context.Context, cfg Config) (why string, placed bool) {
	st := fleet.New(cfg.Etcd, cfg.Prefix)
	key := st.Keys.Desired(cfg.Job)
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := cfg.Etcd.Get(gctx, key)
	if err != nil || len(r.Kvs) == 0 {
		return "", true
	}
	d, err := fleet.DecodeDesired(key, r.Kvs[0].Value)
	if err != nil {
		return "", true
	}
	return leaveReason(d, cfg.Node)
}

// leaveReason says why d does not place the job on node (placed false),
// or placed true.
func leaveReason(d *fleet.Desired, node string) (why string, placed bool) {
	if Placed(d, node) {
		return "", true
	}
	if d.Stop != nil {
		return fmt.Sprintf("the coordinator stopped the job (%s): %s", d.Stop.Kind, d.Stop.Reason), false
	}
	return fmt.Sprintf("the coordinator's allocation (generation %d) no longer lists node %s", d.Generation, node), false
}

// watch reports on leave once the desired record no longer places the
// job on this node; it retries etcd until ctx ends.
func watch(ctx context.Context, cfg Config, log *slog.Logger, leave chan<- string) {
	st := fleet.New(cfg.Etcd, cfg.Prefix)
	key := st.Keys.Desired(cfg.Job)
	check := func(d *fleet.Desired) bool {
		why, placed := leaveReason(d, cfg.Node)
		if !placed {
			leave <- why
		}
		return !placed
	}
	for ctx.Err() == nil {
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := cfg.Etcd.Get(gctx, key)
		cancel()
		if err != nil {
			log.Warn("cannot read the job's desired record; retrying", "err", err)
			pause(ctx, time.Second)
			continue
		}
		if len(r.Kvs) > 0 {
			if d, err := fleet.DecodeDesired(key, r.Kvs[0].Value); err != nil {
				log.Warn("ignoring a malformed desired record", "err", err)
			} else if check(d) {
				return
			}
		}
		for w := range cfg.Etcd.Watch(clientv3.WithRequireLeader(ctx), key, clientv3.WithRev(r.Header.Revision+1)) {
			if w.Err() != nil {
				log.Warn("watch of the desired record ended; starting over", "err", w.Err())
				break
			}
			for _, ev := range w.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				d, err := fleet.DecodeDesired(key, ev.Kv.Value)
				if err != nil {
					log.Warn("ignoring a malformed desired record", "err", err)
					continue
				}
				if check(d) {
					return
				}
			}
		}
		pause(ctx, 200*time.Millisecond)
	}
}

func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return 1
}

// RunWithoutEtcd runs the child with signals passed on and nothing else
// (etcd was unreachable when the pod started: the drain then comes from
// the controller deleting the pod after the graceful timeout).
func RunWithoutEtcd(argv []string) (int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return 127, fmt.Errorf("pod supervisor: start %s: %w", argv[0], err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for {
		select {
		case err := <-exited:
			return exitCode(err), nil
		case s := <-sigs:
			cmd.Process.Signal(s)
		}
	}
}

package elastic

import (
	"context"
	"strconv"
	"syscall"
	"time"

	"github.com/hyperpodrun/hyperpodrun/launcher"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// envPrewarm tells a worker it was started ahead of its round: it holds no
// rank and asks for its first assignment on the control channel
// (hyperpodrun_elastic does so at the first read of RANK, WORLD_SIZE,
// MASTER_ADDR... or at wait_for_assignment()).
const envPrewarm = "HYPERPODRUN_PREWARM"

// Prewarm (in-process resize, Options.PrewarmTimeout): a node that joins a
// job already training would make the survivors stop as soon as it
// registers, and then wait in init_process_group while its new workers
// start Python and import torch. So it starts its workers first, with no
// rank (launcher.Assignment.Prewarm); they park on the control channel
// asking for their first assignment (believed only for that:
// control.Channel.AdmitPrewarmed), and the node registers once every
// one of them asks. They are then kept as e.carry, like a survivor's
// parked workers: after the ready barrier and the running marker, resume
// admits each for its rank of the round and answers it. Fencing is
// unchanged: no rank exists before the barrier, and a prewarmed worker
// holds none until it is answered.

// prewarmView is what decides whether this node prewarms its workers.
type prewarmView struct {
	// InProcess: --inprocess-resize.
	InProcess bool
	// Timeout: --inprocess-prewarm-timeout (0: prewarm is off).
	Timeout time.Duration
	// RunningNodes is how many nodes of the job run workers now (their
	// running markers), -1 when it could not be read.
	RunningNodes int
}

// shouldPrewarm decides whether a node that is about to register for the
// first time starts its workers before registering, and says why (for the
// log). It does when registering would interrupt training: in process,
// with prewarm on, while some node of the job runs workers. Not in the
// first round of a fresh job (no node runs workers): registering then
// stops no one, and the round forms sooner when the node registers at once.
func shouldPrewarm(v prewarmView) (bool, string) {
	switch {
	case !v.InProcess:
		return false, "workers are restarted on every change (no --inprocess-resize)"
	case v.Timeout <= 0:
		return false, "--inprocess-prewarm-timeout is 0"
	case v.RunningNodes < 0:
		return false, "cannot tell whether the job is training; registering at once"
	case v.RunningNodes == 0:
		return false, "no node of the job runs workers: registering interrupts no one"
	}
	return true, strconv.Itoa(v.RunningNodes) + " node(s) train: they stop when this node registers"
}

// runningNodes counts the nodes of the job whose workers may run now, or
// returns -1 when etcd does not say in time.
func (e *elastic) runningNodes(ctx context.Context) int {
	n, err := rendezvous.RunningNodes(ctx, e.cli, e.cfg.Prefix, e.cfg.JobID, e.opTimeout())
	if err != nil {
		e.log.Warn("cannot read which nodes of the job run workers; not prewarming", "err", err)
		return -1
	}
	return n
}

// prewarm starts this node's workers ahead of their round and waits until
// each asks for its first assignment (then they are e.carry, and
// e.prewarmed is set), at most Options.PrewarmTimeout (then they are kept
// too: resume assigns them if they have all asked by the time the round
// forms, else restarts them). A worker that exits before asking (a script
// that does not use hyperpodrun_elastic) gives the prewarm up: the workers
// start after the round, as on the restart path. It returns a signal
// received meanwhile (0: none); the workers are stopped then.
func (e *elastic) prewarm(ctx context.Context) syscall.Signal {
	o := e.o
	n := o.Spec.NProcPerNode
	// Believe no report but the prewarmed workers' requests.
	e.ch.SetRound(0)
	env := map[string]string{envPrewarm: "1", envInProcess: "1",
		"HYPERPODRUN_ELASTIC_SIGNAL": strconv.Itoa(int(o.ElasticSignal))}
	for k, v := range e.ch.PrewarmEnv() {
		env[k] = v
	}
	opts := []launcher.StartOption{launcher.OnSpawn(func(pid, _ int) { e.ch.AdmitPrewarmed(pid) })}
	if wd := e.guard.watchdog(); wd != nil {
		opts = append(opts, launcher.GuardedBy(wd))
	}
	e.log.Info("prewarming workers: they start before this node registers and wait for their first assignment",
		"workers", n, "prewarm_timeout", o.PrewarmTimeout)
	started := time.Now()
	g, err := launcher.Start(e.spec(), launcher.Assignment{Prewarm: true, Env: env}, opts...)
	if err != nil {
		e.ch.ForgetPrewarmed()
		e.log.Warn("cannot prewarm the workers; they start after the round", "err", err)
		return 0
	}
	giveUp := func() {
		e.ch.ForgetPrewarmed()
		g.Stop(o.ShutdownSignal, o.ShutdownTimeout)
	}
	t := time.NewTimer(o.PrewarmTimeout)
	defer t.Stop()
	// A worker's exit is not announced on a channel of its own: poll.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		parked, changed := e.ch.Parked()
		pids := g.PIDs()
		ready := len(pids) == n
		for _, pid := range pids {
			if _, ok := parked[pid]; !ok {
				ready = false
			}
		}
		if ready {
			e.log.Info("prewarmed workers wait for their first assignment; registering", "pids", pids,
				"took_ms", time.Since(started).Milliseconds())
			e.carry, e.prewarmed = g, true
			return 0
		}
		if len(pids) < n {
			e.log.Warn("a worker started ahead of its round exited before asking for its assignment (does the script use hyperpodrun_elastic?); registering without prewarm: the workers start after the round")
			giveUp()
			return 0
		}
		select {
		case <-changed:
		case <-tick.C:
		case <-t.C:
			e.log.Warn("not every prewarmed worker asked for its assignment within --inprocess-prewarm-timeout; registering anyway",
				"prewarm_timeout", o.PrewarmTimeout, "asked", len(parked), "workers", n)
			e.carry, e.prewarmed = g, true
			return 0
		case s := <-o.Signals:
			giveUp()
			sig, _ := s.(syscall.Signal)
			return sig
		case <-ctx.Done():
			giveUp()
			return 0
		}
	}
}

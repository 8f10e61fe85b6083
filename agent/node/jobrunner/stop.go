package jobrunner

// How the runner stops running jobs: a drain (the node leaves), or a kill
// of everything (the agent stops without a drain), and what no run may
// start after or during either.

import (
	"context"
	"syscall"
)

// Drain drains every job on the node and waits for them to leave.
func (r *Runner) Drain(ctx context.Context) error {
	r.mu.Lock()
	r.leaving = true
	for job, rt := range r.retry {
		rt.timer.Stop()
		delete(r.retry, job)
	}
	var waits []chan struct{}
	for job, p := range r.jobs {
		p.drain(r.log, job)
		waits = append(waits, p.done)
	}
	r.mu.Unlock()
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			r.killAll()
			return ctx.Err()
		}
	}
	return nil
}

// mayStart reports whether a run may start now. Not once killAll has run
// (the Run loop may still be reconciling when a crash stops the runner),
// nor while the node drains (Drain waits only for the runs it found) or
// StopAll stops the runs of a lost etcd's epoch: reconcile checks the
// same before it starts a job, but r.mu is released in between. The
// caller holds r.mu, which killAll closes r.quit under.
func (r *Runner) mayStart() bool {
	select {
	case <-r.quit:
		return false
	default:
		return !r.leaving && !r.resetting
	}
}

// killAll SIGKILLs every job's hyperpodrun (the rest of each run dies
// with it), cancels pending restarts and waits for the runner's goroutines.
func (r *Runner) killAll() {
	r.mu.Lock()
	for _, p := range r.jobs {
		if p.cmd == nil {
			continue // a container: it outlives the agent, the next one adopts it
		}
		p.draining = true
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	select {
	case <-r.quit:
	default:
		close(r.quit)
	}
	for job, rt := range r.retry {
		rt.timer.Stop()
		delete(r.retry, job)
	}
	r.mu.Unlock()
	r.wg.Wait()
	if r.box != nil {
		r.box.close()
	}
	// The runs' base stays: root's, shared by the agents of the host
	// (their uid claims are there too).
}

package jobrunner

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/hyperpodrun/hyperpodrun/agent/node/nodeagent"
)

var _ nodeagent.DataLossHandler = (*Runner)(nil)

// StopAll stops every job of the node because etcd lost its data (why):
// the control plane does not know them any more and would place other
// jobs on the node beside them. Each run is drained as when its job
// moves away (SIGUSR2: its workers checkpoint and it leaves, then its
// grace, then SIGKILL); pending restarts are dropped; once every run is
// gone, the jobs' uids and log directories are released and what the
// runner knew of them (their finish on this node, their credentials,
// their problem records, which were in the lost etcd) is forgotten. No
// job starts until the Run loop has re-read this node's assignments from
// etcd: a job of the new epoch never runs beside one of the old.
// It returns the jobs it stopped; when ctx ends first, the runs left are
// killed and ctx's error returned.
func (r *Runner) StopAll(ctx context.Context, why string) ([]string, error) {
	r.mu.Lock()
	r.resetting, r.relistDue = true, false
	var stopped []string
	for job, rt := range r.retry {
		rt.timer.Stop()
		delete(r.retry, job)
		if _, running := r.jobs[job]; !running {
			stopped = append(stopped, job) // waiting to restart: it does not
		}
	}
	stopped = append(stopped, r.lostData...) // their hyperpodruns found the loss first
	r.lostData = nil
	waits := map[string]chan struct{}{}
	for job, p := range r.jobs {
		if !p.draining {
			r.log.Warn("stopping the job: "+why, "job", job)
			p.drain(r.log, job)
		}
		stopped = append(stopped, job)
		waits[job] = p.done
	}
	r.mu.Unlock()
	sort.Strings(stopped)
	stopped = slices.Compact(stopped)
	for job, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
			r.mu.Lock()
			for _, p := range r.jobs {
				if p.kill != nil {
					p.kill()
				}
			}
			r.mu.Unlock()
			return stopped, fmt.Errorf("stop job %s: %w", job, ctx.Err())
		}
	}
	r.mu.Lock()
	var claimed []string
	for job := range r.claims {
		claimed = append(claimed, job)
	}
	clear(r.problems) // their records were in the lost etcd
	clear(r.doneHere)
	clear(r.creds)
	r.mu.Unlock()
	for _, job := range claimed {
		r.leave(job)
	}
	r.mu.Lock()
	r.relistDue = true
	r.mu.Unlock()
	select {
	case r.relist <- struct{}{}:
	default:
	}
	r.log.Warn("every job of the node is stopped; it starts only what etcd places on it from now on", "stopped", stopped)
	return stopped, nil
}

// relisted is the Run loop's fresh read of the node's assignments: after
// StopAll it lets jobs start again.
func (r *Runner) relisted() {
	r.mu.Lock()
	if r.relistDue {
		r.resetting, r.relistDue = false, false
	}
	r.mu.Unlock()
}

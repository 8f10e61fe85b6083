package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/hyperpodrun/hyperpodrun/cmd/elasticctl/internal/query"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// workerRestartingNow is whether hyperpodrun restarted the job's workers
// recently (fleet.WorkerRestarts.Restarting), now.
func (v jobView) workerRestartingNow() bool {
	ok, _ := v.WorkerRestarts.Restarting(v.Finished != nil, timeNow())
	return ok
}

// workerRestartsMessage is the MESSAGE of a job Restarting by hyperpodrun.
func workerRestartsMessage(w *fleet.WorkerRestarts, now time.Time) string {
	return w.RestartingMessage(age(w.LastTime, now) + " ago")
}

// addWorkerRestarts reads the restart records of the views' running jobs
// (only a running job can be restarting) and sets them on the views. A
// user who may not read jobs/ (a team's) is shown the rest without a
// word; another failure is a warning.
func addWorkerRestarts(ctx context.Context, st *query.Store, views []jobView, rev int64, warn io.Writer) {
	var names []string
	for _, v := range views {
		if v.Finished == nil && v.Allocation != nil {
			names = append(names, v.Spec.Name)
		}
	}
	if len(names) == 0 {
		return
	}
	got, err := st.WorkerRestartsOf(ctx, names, rev)
	if err != nil {
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			warnAll(warn, []error{fmt.Errorf("restarts not shown: %w", err)})
		}
		return
	}
	for i := range views {
		if w := got[views[i].Spec.Name]; w != nil {
			w.MaxRestarts = views[i].Spec.Run.MaxRestarts
			views[i].WorkerRestarts = w
		}
	}
}

// restartsPoll is how often get jobs -w re-reads the running jobs'
// restart records: hyperpodrun's restarts are under jobs/, which the
// watch does not follow (every rendezvous write of every job is there),
// and Restarting also ends with time alone (fleet.RestartingWindow).
var restartsPoll = 5 * time.Second

// restartsWatch is what get jobs -w last showed of each job, for poll.
type restartsWatch struct {
	jobs map[string]shownJob
	// off: the user may not read jobs/ (a team's), or a read failed
	// with the watch's context gone: no more polls.
	off bool
}

// shownJob is a job's view and the STATE and REASON it was shown with.
type shownJob struct {
	v     jobView
	shown string
}

func shownKey(v jobView) string { return v.phase() + "\x00" + v.reasonCode() }

// newRestartsWatch starts from the views the listing showed.
func newRestartsWatch(views []jobView) *restartsWatch {
	w := &restartsWatch{jobs: make(map[string]shownJob, len(views))}
	w.seen(views)
	return w
}

// seen records views as shown now.
func (w *restartsWatch) seen(views []jobView) {
	for _, v := range views {
		w.jobs[v.Spec.Name] = shownJob{v, shownKey(v)}
	}
}

// gone forgets a deleted job.
func (w *restartsWatch) gone(job string) { delete(w.jobs, job) }

// poll re-reads the running jobs' restart records and returns, sorted by
// name, the views whose STATE or REASON changed since they were shown
// (recording them as shown). A failed read is retried at the next poll;
// permission denied stops polling.
func (w *restartsWatch) poll(ctx context.Context, st *query.Store) []jobView {
	if w.off {
		return nil
	}
	var names []string
	for n, j := range w.jobs {
		if j.v.Finished == nil && j.v.Allocation != nil {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	got, err := st.WorkerRestartsOf(rctx, names, 0)
	cancel()
	if err != nil {
		w.off = errors.Is(err, rpctypes.ErrPermissionDenied)
		return nil
	}
	var out []jobView
	for _, n := range names {
		j := w.jobs[n]
		j.v.WorkerRestarts = got[n]
		if j.v.WorkerRestarts != nil {
			j.v.WorkerRestarts.MaxRestarts = j.v.Spec.Run.MaxRestarts
		}
		if k := shownKey(j.v); k != j.shown {
			j.shown = k
			out = append(out, j.v)
		}
		w.jobs[n] = j
	}
	return out
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/hyperpodrun/hyperpodrun/cmd/elasticctl/internal/query"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// restartingWindow is how long after hyperpodrun's last restart of a job's
// workers (a worker failure inside the restart budget, a hang) the job
// shows Restarting, unless it committed a checkpoint since: a crash loop
// (the job restarted every 3 s) shows Restarting throughout, and a
// job that failed once shows Running again five minutes later, or at its
// next checkpoint. Five minutes is kubectl's longest CrashLoopBackOff.
const restartingWindow = 5 * time.Minute

// Rules of workerRestarting.
const (
	ruleRestartsFinished    = "finished"
	ruleRestartsNone        = "never-restarted"
	ruleRestartsTimeUnknown = "time-unknown"
	ruleRestartsCheckpoint  = "checkpoint-since"
	ruleRestartsRecent      = "recent"
	ruleRestartsSettled     = "settled"
)

// workerRestarting decides whether a job shows Restarting because
// hyperpodrun restarted its workers recently, from its restart record w
// (nil: none), whether it finished, and the time now. Rules, in order:
//
//   - finished: a finished job shows its outcome: no;
//   - never-restarted: no restart counted: no;
//   - time-unknown: the last failure report has no time (a hyperpodrun
//     older than the field): no (describe still shows the count);
//   - checkpoint-since: a checkpoint was committed after the last
//     failure, so the job made progress since: no;
//   - recent: the last failure is less than restartingWindow old (or in
//     the future: the reporting node's clock is ahead): yes;
//   - settled: anything else: no.
func workerRestarting(w *fleet.WorkerRestarts, finished bool, now time.Time) (bool, string) {
	switch {
	case finished:
		return false, ruleRestartsFinished
	case w == nil || w.Count <= 0:
		return false, ruleRestartsNone
	case w.LastTime.IsZero():
		return false, ruleRestartsTimeUnknown
	case w.CheckpointTime.After(w.LastTime):
		return false, ruleRestartsCheckpoint
	case now.Sub(w.LastTime) < restartingWindow:
		return true, ruleRestartsRecent
	}
	return false, ruleRestartsSettled
}

// workerRestartingNow is workerRestarting of the job's view, now.
func (v jobView) workerRestartingNow() bool {
	ok, _ := workerRestarting(v.WorkerRestarts, v.Finished != nil, timeNow())
	return ok
}

// workerRestartsMessage is the MESSAGE of a job Restarting by hyperpodrun:
// the count, how long ago, where, and the first line of the last error.
func workerRestartsMessage(w *fleet.WorkerRestarts, now time.Time) string {
	msg := fmt.Sprintf("hyperpodrun restarted the workers after failures %d time(s), the last %s ago", w.Count, age(w.LastTime, now))
	if w.LastRound > 0 {
		msg += fmt.Sprintf(" (round %d", w.LastRound)
		if w.LastNode != "" {
			msg += " on " + w.LastNode
		}
		msg += ")"
	}
	if first, _, _ := strings.Cut(strings.TrimSpace(w.LastError), "\n"); first != "" {
		const most = 160
		if utf8.RuneCountInString(first) > most {
			first = string([]rune(first)[:most]) + "..."
		}
		msg += ": " + first
	}
	return msg
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

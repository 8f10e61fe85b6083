package main

import (
	"context"
	"errors"
	"fmt"
	"io"
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

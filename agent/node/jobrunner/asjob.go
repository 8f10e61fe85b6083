package jobrunner

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// A node agent's own etcd user may not read jobs/ (a job's rendezvous,
// restart count and checkpoint record): those keys carry the lease ids of
// the job's members, and only the job itself and the coordinator may know
// them (docs/security.md, Liveness). What the runner must know of a job
// placed here (its global restart count, whether its rendezvous finished or
// still has members) it reads as the job, with the credentials the
// coordinator handed to this node in the job's assignment.

// DialJob connects to etcd as a job's own user: the agent's endpoints and
// TLS settings, the job's user and password. Config.DialJob overrides it.
type DialJob func(ctx context.Context, user, password string) (*clientv3.Client, error)

// dialJobDefault connects to cfg.Endpoints (plain or https URLs) as the job.
func dialJobDefault(endpoints []string) DialJob {
	return func(ctx context.Context, user, password string) (*clientv3.Client, error) {
		return etcdconn.Connect(ctx, etcdconn.Options{Endpoints: endpoints, User: user, Password: password})
	}
}

// rememberCreds keeps the credentials a job was started with, for asJob.
func (r *Runner) rememberCreds(job string, creds *fleet.JobCreds) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if creds == nil {
		delete(r.creds, job)
		return
	}
	r.creds[job] = creds
}

// asJob returns a store that reads as the job's own etcd user, and what
// closes it. Without credentials (etcd auth off) it is the agent's own.
func (r *Runner) asJob(ctx context.Context, job string) (*fleet.Store, func(), error) {
	r.mu.Lock()
	creds := r.creds[job]
	r.mu.Unlock()
	if creds == nil {
		return r.st, func() {}, nil
	}
	dial := r.cfg.DialJob
	if dial == nil {
		dial = dialJobDefault(r.cfg.Endpoints)
	}
	cli, err := dial(ctx, creds.User, creds.Password)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to etcd as job %s's user %s: %w", job, creds.User, err)
	}
	return fleet.New(cli, r.st.Keys.Prefix()), func() { cli.Close() }, nil
}

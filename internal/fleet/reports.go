package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
)

// What nodes say about the jobs placed on them (finish and problem reports,
// which the coordinator validates into finished/ and problems/), and the
// jobs' credentials as the coordinator hands them to those nodes.

// MarkFinished is a node agent's report that job finished on f.Node: it
// writes reports/<f.Node>/finished/<job> (a node's etcd user may write
// only its own reports), and the coordinator copies it to finished/<job>
// when the job is placed on that node (the first finish wins there). The
// first report of a node is kept until the coordinator has processed it.
func (s *Store) MarkFinished(ctx context.Context, job string, f Finish) error {
	if err := api.ValidateName("job", job); err != nil {
		return err
	}
	if err := api.ValidateNodeName(f.Node); err != nil {
		return fmt.Errorf("finish report of job %s: %w", job, err)
	}
	key := s.Keys.FinishReport(f.Node, job)
	op, err := putOp(key, f)
	if err != nil {
		return err
	}
	if _, err := s.Cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(op).Commit(); err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	return nil
}

// RecordFinish writes a job's finish record, finished/<job>, unless it has
// one (the first finish wins): the coordinator's copy of a node's report,
// and the Kubernetes controller's own (control-plane components only).
func (s *Store) RecordFinish(ctx context.Context, job string, f Finish) error {
	key := s.Keys.Finish(job)
	op, err := putOp(key, f)
	if err != nil {
		return err
	}
	if _, err := s.Cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(op).Commit(); err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	return nil
}

// RecordFinishOp is RecordFinish's write, for a transaction guarded by
// FinishAbsent.
func (s *Store) RecordFinishOp(job string, f Finish) (clientv3.Op, error) {
	return putOp(s.Keys.Finish(job), f)
}

// FinishAbsent holds while job has no finish record.
func (s *Store) FinishAbsent(job string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(s.Keys.Finish(job)), "=", 0)
}

// Problem is why a node cannot run a job right now (its runtime is down,
// say), written by that node's agent and removed once the job runs there;
// elasticctl describe job shows it. Failures that are the job's own (an
// image that does not exist) end the job instead (Finish).
type Problem struct {
	Job     string    `json:"job" yaml:"job"`
	Node    string    `json:"node" yaml:"node"`
	Message string    `json:"message" yaml:"message"`
	Time    time.Time `json:"time" yaml:"time"`
	// Restarts is, for a job whose hyperpodrun keeps failing on the node,
	// how many times in a row it failed there (the agent restarts it after
	// a backoff); 0 for other problems.
	Restarts int `json:"restarts,omitempty" yaml:"restarts,omitempty"`
	// LastError is how the last of those runs ended.
	LastError string `json:"lastError,omitempty" yaml:"lastError,omitempty"`
	// Cleared, in a node's report only, says the node's problem with the
	// job is gone (DeleteProblem).
	Cleared bool `json:"cleared,omitempty" yaml:"cleared,omitempty"`
}

// PutProblem is a node agent's report of its problem with a job: it writes
// reports/<p.Node>/problems/<p.Job>, which the coordinator copies to
// problems/<job>/<node> when the job is placed on that node.
func (s *Store) PutProblem(ctx context.Context, p Problem) error {
	if err := api.ValidateName("job", p.Job); err != nil {
		return err
	}
	if err := api.ValidateNodeName(p.Node); err != nil {
		return fmt.Errorf("problem report of job %s: %w", p.Job, err)
	}
	p.Cleared = false
	return s.put(ctx, s.Keys.ProblemReport(p.Node, p.Job), p)
}

// DeleteProblem reports that node's problem with job is gone: when the
// node has a problem record of the job (or a report not yet processed), it
// writes a cleared report, which the coordinator applies; otherwise it
// writes nothing.
func (s *Store) DeleteProblem(ctx context.Context, job, node string) error {
	if err := api.ValidateName("job", job); err != nil {
		return err
	}
	if err := api.ValidateNodeName(node); err != nil {
		return fmt.Errorf("problem report of job %s: %w", job, err)
	}
	rep := s.Keys.ProblemReport(node, job)
	r, err := s.Cli.Txn(ctx).Then(clientv3.OpGet(s.Keys.Problem(job, node), clientv3.WithCountOnly()),
		clientv3.OpGet(rep)).Commit()
	if err != nil {
		return fmt.Errorf("read job %s's problem on %s: %w", job, node, err)
	}
	has := r.Responses[0].GetResponseRange().Count > 0
	if kvs := r.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		var p Problem
		if json.Unmarshal(kvs[0].Value, &p) != nil || !p.Cleared {
			has = true
		}
	}
	if !has {
		return nil
	}
	return s.put(ctx, rep, Problem{Job: job, Node: node, Time: time.Now().UTC(), Cleared: true})
}

// PutProblemOp writes a node's problem record of a job, for the
// coordinator's transaction that applies the node's report.
func (s *Store) PutProblemOp(p Problem) (clientv3.Op, error) {
	p.Cleared = false
	return putOp(s.Keys.Problem(p.Job, p.Node), p)
}

// DeleteProblemOp removes a node's problem record of a job, for a
// transaction.
func (s *Store) DeleteProblemOp(job, node string) clientv3.Op {
	return clientv3.OpDelete(s.Keys.Problem(job, node))
}

// Problems returns the nodes' problem records of a job; malformed ones
// come back as problems of their own.
func (s *Store) Problems(ctx context.Context, job string) ([]Problem, []error, error) {
	r, err := s.Cli.Get(ctx, s.Keys.Problems(job), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("list job %s's problems: %w", job, err)
	}
	var out []Problem
	var bad []error
	for _, kv := range r.Kvs {
		var p Problem
		if err := json.Unmarshal(kv.Value, &p); err != nil {
			bad = append(bad, fmt.Errorf("malformed problem record at %s: %w", ClipKey(kv.Key), err))
			continue
		}
		out = append(out, p)
	}
	return out, bad, nil
}

// Finished returns the finish record of every finished job; malformed
// records are returned as problems.
func (s *Store) Finished(ctx context.Context) (map[string]Finish, []error, error) {
	prefix := s.Keys.FinishedPrefix()
	r, err := s.Cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("list finished jobs: %w", err)
	}
	out := map[string]Finish{}
	var bad []error
	for _, kv := range r.Kvs {
		var f Finish
		if err := json.Unmarshal(kv.Value, &f); err != nil {
			bad = append(bad, fmt.Errorf("malformed finish record at %s: %w", ClipKey(kv.Key), err))
			continue
		}
		out[strings.TrimPrefix(string(kv.Key), prefix)] = f
	}
	return out, bad, nil
}

// JobCreds is a job's etcd user and password (creds/<job>), minted by the
// coordinator when auth is on. The node agent writes them to a 0600 file
// for the job's hyperpodrun (--rdzv-conf user=...,password_file=...).
type JobCreds struct {
	Job      string `json:"job"`
	User     string `json:"user"`
	Password string `json:"password"`
}

// Creds reads a job's credentials (nil, nil when none were minted).
func (s *Store) Creds(ctx context.Context, job string) (*JobCreds, error) {
	if err := api.ValidateName("job", job); err != nil {
		return nil, err
	}
	key := s.Keys.Creds(job)
	r, err := s.Cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if len(r.Kvs) == 0 {
		return nil, nil
	}
	var c JobCreds
	if err := json.Unmarshal(r.Kvs[0].Value, &c); err != nil || c.User == "" || c.Job != job {
		return nil, fmt.Errorf("malformed credentials record at %s", key)
	}
	return &c, nil
}

// NodeCreds reads job's credentials as node's agent gets them: from the
// job's assignment to that node (assign/<node>/<job>), which only that
// node's etcd user (and the coordinator) may read. nil, nil when the job
// is not placed there or carries none (auth off).
func (s *Store) NodeCreds(ctx context.Context, node, job string) (*JobCreds, error) {
	if err := api.ValidateName("job", job); err != nil {
		return nil, err
	}
	if err := api.ValidateNodeName(node); err != nil {
		return nil, err
	}
	key := s.Keys.Assignment(node, job)
	r, err := s.Cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if len(r.Kvs) == 0 {
		return nil, nil
	}
	a, err := DecodeAssignment(key, r.Kvs[0].Value)
	if err != nil {
		return nil, err
	}
	if a.Creds == nil {
		return nil, nil
	}
	if a.Creds.User == "" || a.Creds.Job != job {
		return nil, fmt.Errorf("malformed credentials in the assignment at %s", key)
	}
	return a.Creds, nil
}

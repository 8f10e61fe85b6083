package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// WorkerRestarts is what a job's hyperpodruns keep in etcd about the
// restarts they made after worker failures: the count held against
// --max-restarts (Restarts) and the latest round's failure report, which
// elasticctl describe shows as the job's last error. A job crash-looping
// inside hyperpodrun (its workers fail, hyperpodrun restarts them) shows
// here, where no node agent's problem record does.
type WorkerRestarts struct {
	// Count is the job's failure-restart count.
	Count int64 `json:"count"`
	// MaxRestarts is the spec's budget (filled in by the caller).
	MaxRestarts int `json:"maxRestarts,omitempty"`
	// LastRound is the round whose failure was reported last (0: none).
	LastRound int64 `json:"lastRound,omitempty"`
	// LastNode is the node that reported it.
	LastNode string `json:"lastNode,omitempty"`
	// LastError is its one-line detail (what the reporting node saw)
	// followed by its failure summary (torchrun's ChildFailedError text).
	LastError string `json:"lastError,omitempty"`
	// LastTime is when the last failure was reported (zero: a
	// hyperpodrun that did not say).
	LastTime time.Time `json:"lastTime,omitzero"`
	// CheckpointTime is when the job's latest checkpoint was committed
	// (zero: none): a checkpoint after LastTime is progress since the
	// last failure.
	CheckpointTime time.Time `json:"checkpointTime,omitzero"`
	// CheckpointFailure is the last planned change whose checkpoint could
	// not be saved (nil: none; checkpointfailure.go): no restart is
	// counted for it, but it may have cost the steps since the last
	// committed checkpoint.
	CheckpointFailure *CheckpointFailure `json:"checkpointFailure,omitempty"`
}

// failureReport is the part of a round's failure record (rendezvous's
// <job>/rdzv/n/f/<round>) that is shown to users.
type failureReport struct {
	Node    string    `json:"node"`
	Detail  string    `json:"detail,omitempty"`
	Summary string    `json:"summary,omitempty"`
	Time    time.Time `json:"time,omitzero"`
}

// DecodeFailureReport reads a round's failure record into w's Last*
// fields; a malformed record is named as such in LastError, never a panic.
func DecodeFailureReport(k RdzvKeys, key string, v []byte, w *WorkerRestarts) {
	w.LastRound, _ = k.FailureRound(key)
	var f failureReport
	if err := json.Unmarshal(v, &f); err != nil {
		w.LastNode, w.LastError = "", fmt.Sprintf("malformed failure record at %s: %q", ClipKey(key), clip(v))
		return
	}
	// The detail says what the node saw (a failed save and the steps it
	// lost, say), the summary which ranks failed and how.
	w.LastNode, w.LastError = f.Node, strings.TrimSpace(strings.Join([]string{f.Detail, f.Summary}, "\n"))
	w.LastTime = f.Time
}

// WorkerRestarts reads a job's failure-restart count, its latest failure
// report and its last failed planned checkpoint at one revision; nil when
// hyperpodrun never restarted, reported a failure or a failed planned
// checkpoint for it.
func (s *Store) WorkerRestarts(ctx context.Context, job string) (*WorkerRestarts, error) {
	resp, err := s.Cli.Txn(ctx).Then(s.Keys.WorkerRestartsOps(job)...).Commit()
	if err != nil {
		return nil, fmt.Errorf("read job %q's restarts: %w", job, err)
	}
	return s.Keys.DecodeWorkerRestarts(job, resp.Responses), nil
}

// WorkerRestartsOps are the reads of a job's WorkerRestarts, in
// DecodeWorkerRestarts's order: the restart count, the latest failure
// report, the latest checkpoint record and the last failed planned
// checkpoint (opts, e.g. a revision, apply to each).
func (k Keys) WorkerRestartsOps(job string, opts ...clientv3.OpOption) []clientv3.Op {
	with := func(o ...clientv3.OpOption) []clientv3.OpOption { return append(o, opts...) }
	return []clientv3.Op{
		clientv3.OpGet(k.Restarts(job), opts...),
		clientv3.OpGet(k.Rdzv(job).Failures, with(clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))...),
		clientv3.OpGet(k.Checkpoint(job), opts...),
		clientv3.OpGet(k.CheckpointFailed(job), opts...),
	}
}

// DecodeWorkerRestarts decodes the answers to WorkerRestartsOps; nil when
// hyperpodrun never restarted, reported a failure or a failed planned
// checkpoint for the job.
func (k Keys) DecodeWorkerRestarts(job string, resps []*pb.ResponseOp) *WorkerRestarts {
	var w WorkerRestarts
	if kvs := resps[0].GetResponseRange().Kvs; len(kvs) > 0 {
		// A malformed counter reads as 0 here; hyperpodrun reports it.
		w.Count, _ = ParseCount(string(kvs[0].Key), kvs[0].Value, "restart count", 0)
	}
	if kvs := resps[1].GetResponseRange().Kvs; len(kvs) > 0 {
		DecodeFailureReport(k.Rdzv(job), string(kvs[0].Key), kvs[0].Value, &w)
	}
	if kvs := resps[3].GetResponseRange().Kvs; len(kvs) > 0 {
		w.CheckpointFailure = DecodeCheckpointFailure(string(kvs[0].Key), kvs[0].Value)
	}
	if w.Count == 0 && w.LastRound == 0 && w.LastError == "" && w.CheckpointFailure == nil {
		return nil
	}
	if kvs := resps[2].GetResponseRange().Kvs; len(kvs) > 0 {
		// Only its time is read (package checkpoint owns the record); a
		// malformed one reads as no checkpoint.
		var c struct {
			Time time.Time `json:"time"`
		}
		if json.Unmarshal(kvs[0].Value, &c) == nil {
			w.CheckpointTime = c.Time
		}
	}
	return &w
}

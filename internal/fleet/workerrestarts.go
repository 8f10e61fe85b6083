package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

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
}

// failureReport is the part of a round's failure record (rendezvous's
// <job>/rdzv/n/f/<round>) that is shown to users.
type failureReport struct {
	Node    string `json:"node"`
	Detail  string `json:"detail,omitempty"`
	Summary string `json:"summary,omitempty"`
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
}

// WorkerRestarts reads a job's failure-restart count and its latest
// failure report at one revision; nil when hyperpodrun never restarted or
// reported a failure for it.
func (s *Store) WorkerRestarts(ctx context.Context, job string) (*WorkerRestarts, error) {
	rk := s.Keys.Rdzv(job)
	resp, err := s.Cli.Txn(ctx).Then(
		clientv3.OpGet(s.Keys.Restarts(job)),
		clientv3.OpGet(rk.Failures, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1)),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("read job %q's restarts: %w", job, err)
	}
	var w WorkerRestarts
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		// A malformed counter reads as 0 here; hyperpodrun reports it.
		w.Count, _ = ParseCount(string(kvs[0].Key), kvs[0].Value, "restart count", 0)
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		DecodeFailureReport(rk, string(kvs[0].Key), kvs[0].Value, &w)
	}
	if w.Count == 0 && w.LastRound == 0 && w.LastError == "" {
		return nil, nil
	}
	return &w, nil
}

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// CheckpointFailure is what a job's hyperpodrun records when the
// checkpoint of a planned change (a resize, drain or preemption) could
// not be saved (Keys.CheckpointFailed): which save failed, and what the
// change cost. No restart is counted for it, so it is a record of its own
// beside the restart count; elasticctl describe shows it with the job's
// restarts (WorkerRestarts.CheckpointFailure).
type CheckpointFailure struct {
	// Round is the round the planned change ended.
	Round int64 `json:"round"`
	// Node is the node whose worker reported the failed save.
	Node string `json:"node,omitempty"`
	// Step is the step whose checkpoint failed; Committed the last
	// committed step then (-1: none).
	Step      int64 `json:"step"`
	Committed int64 `json:"committed"`
	// LostSteps is how many steps the change lost (0: none, the workers
	// kept their state in process).
	LostSteps int64 `json:"lostSteps"`
	// Detail says it in words: the rank, the save's error, the tries and
	// what was lost or kept.
	Detail string `json:"detail"`
	// Time is when it was recorded.
	Time time.Time `json:"time"`
}

// PutCheckpointFailure records a planned change's failed checkpoint as the
// job's latest (Keys.CheckpointFailed).
func (s *Store) PutCheckpointFailure(ctx context.Context, job string, f CheckpointFailure) error {
	v, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode job %q's checkpoint failure: %w", job, err)
	}
	if _, err := s.Cli.Put(ctx, s.Keys.CheckpointFailed(job), string(v)); err != nil {
		return fmt.Errorf("record job %q's checkpoint failure: %w", job, err)
	}
	return nil
}

// CheckpointFailure reads a job's latest failed planned checkpoint; nil
// when there is none.
func (s *Store) CheckpointFailure(ctx context.Context, job string) (*CheckpointFailure, error) {
	key := s.Keys.CheckpointFailed(job)
	resp, err := s.Cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read job %q's checkpoint failure: %w", job, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return DecodeCheckpointFailure(key, resp.Kvs[0].Value), nil
}

// DecodeCheckpointFailure reads a CheckpointFailed record; a malformed one
// is named as such in Detail, never a panic.
func DecodeCheckpointFailure(key string, v []byte) *CheckpointFailure {
	var f CheckpointFailure
	if err := json.Unmarshal(v, &f); err != nil {
		return &CheckpointFailure{Committed: -1, Detail: fmt.Sprintf("malformed checkpoint failure record at %s: %q", ClipKey(key), clip(v))}
	}
	return &f
}

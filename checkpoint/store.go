package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// Variables that tell restarted workers where to resume ([Record.Env]).
const (
	// EnvCheckpoint is the location of the latest committed checkpoint.
	EnvCheckpoint = "HYPERPODRUN_CHECKPOINT"
	// EnvResumeStep is the step of the latest committed checkpoint.
	EnvResumeStep = "HYPERPODRUN_RESUME_STEP"
	// EnvCheckpointWorldSize is the world size that wrote that checkpoint.
	EnvCheckpointWorldSize = "HYPERPODRUN_CHECKPOINT_WORLD_SIZE"
	// EnvCheckpointRound is the rendezvous round that committed it.
	EnvCheckpointRound = "HYPERPODRUN_CHECKPOINT_ROUND"
)

// ErrStale is returned by Store.Commit for a record older than the stored
// one (a lower step, or an earlier round): the job's checkpoint never moves
// backwards, and a stale round's rank 0 cannot overwrite the checkpoint of
// the round that replaced it.
var ErrStale = errors.New("older than the committed checkpoint")

// Record is a job's latest committed checkpoint, as stored in etcd.
type Record struct {
	// Step is the number of optimizer steps the checkpoint holds.
	Step int64 `json:"step"`
	// Path is where the checkpoint is (a file, a directory or a URL; the
	// training code decides).
	Path string `json:"path"`
	// WorldSize is the world size that wrote it (0 if unknown).
	WorldSize int `json:"world_size"`
	// Round is the rendezvous round that committed it.
	Round int64 `json:"round"`
	// Time is when it was committed.
	Time time.Time `json:"time"`
}

func (r Record) validate() error {
	switch {
	case r.Step < 0:
		return fmt.Errorf("negative step %d", r.Step)
	case r.Path == "":
		return errors.New("empty path")
	case r.WorldSize < 0:
		return fmt.Errorf("negative world_size %d", r.WorldSize)
	case r.Round < 0:
		return fmt.Errorf("negative round %d", r.Round)
	}
	return nil
}

// Env returns the variables that hand the checkpoint to restarted workers.
// A nil record gives an empty map (start from scratch).
func (r *Record) Env() map[string]string {
	if r == nil {
		return map[string]string{}
	}
	env := map[string]string{
		EnvCheckpoint:      r.Path,
		EnvResumeStep:      strconv.FormatInt(r.Step, 10),
		EnvCheckpointRound: strconv.FormatInt(r.Round, 10),
	}
	if r.WorldSize > 0 {
		env[EnvCheckpointWorldSize] = strconv.Itoa(r.WorldSize)
	}
	return env
}

// Store keeps one job's committed checkpoint record in etcd.
type Store struct {
	cli *clientv3.Client
	key string
	log *slog.Logger
}

// NewStore returns the store of job under prefix ("" means
// fleet.DefaultPrefix); the key is fleet's.
func NewStore(cli *clientv3.Client, prefix, job string) *Store {
	return &Store{cli: cli, key: fleet.NewKeys(prefix).Checkpoint(job)}
}

// Key returns the etcd key of the record.
func (s *Store) Key() string { return s.key }

// Commit records rec as the job's latest committed checkpoint unless the
// stored one has a higher step or was committed in a later round, in which
// case it returns an error wrapping ErrStale. A record with the same step
// and round replaces the stored one. Round 0 means unknown (a commit made
// outside any rendezvous) and is not compared. A zero Time is set to now.
func (s *Store) Commit(ctx context.Context, rec Record) error {
	if err := rec.validate(); err != nil {
		return fmt.Errorf("checkpoint: commit to %s: %w", s.key, err)
	}
	if rec.Time.IsZero() {
		rec.Time = time.Now().UTC()
	}
	val, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("checkpoint: commit to %s: encode: %w", s.key, err)
	}
	for {
		cur, rev, err := s.get(ctx)
		if err != nil {
			return err
		}
		if cur != nil && rec.Round != 0 && rec.Round < cur.Round {
			return fmt.Errorf("checkpoint: commit step %d of round %d to %s: %w (step %d of round %d): round %d is no longer current",
				rec.Step, rec.Round, s.key, ErrStale, cur.Step, cur.Round, rec.Round)
		}
		if cur != nil && rec.Step < cur.Step {
			return fmt.Errorf("checkpoint: commit step %d to %s: %w (step %d)", rec.Step, s.key, ErrStale, cur.Step)
		}
		// Compare-and-swap on the revision we read: a concurrent commit
		// makes us re-read and compare steps again.
		cmp := clientv3.Compare(clientv3.ModRevision(s.key), "=", rev)
		resp, err := s.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(s.key, string(val))).Commit()
		if err != nil {
			return fmt.Errorf("checkpoint: commit to %s: %w", s.key, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
}

// Resume returns the checkpoint the workers of round resume from (nil when
// there is none) and claims it for that round: the stored record is
// rewritten with Round = round unless it already belongs to round or a later
// one. From then on every commit of an earlier round is refused with
// ErrStale, so what the round's workers resume from stays final. Without the
// claim, a commit of a superseded round that was still in flight (held up by
// an etcd outage, say) could land after the new round read the record, and
// the steps between the two would be committed and then run again. Round 0
// claims nothing and is the same as Latest.
func (s *Store) Resume(ctx context.Context, round int64) (*Record, error) {
	for {
		cur, rev, err := s.get(ctx)
		if err != nil {
			return nil, err
		}
		if cur == nil || round == 0 || cur.Round >= round {
			return cur, nil
		}
		claimed := *cur
		claimed.Round = round
		val, err := json.Marshal(claimed)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: claim %s for round %d: encode: %w", s.key, round, err)
		}
		cmp := clientv3.Compare(clientv3.ModRevision(s.key), "=", rev)
		resp, err := s.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(s.key, string(val))).Commit()
		if err != nil {
			return nil, fmt.Errorf("checkpoint: claim %s for round %d: %w", s.key, round, err)
		}
		if resp.Succeeded {
			return &claimed, nil
		}
		// A commit landed between the read and the claim: read it again.
	}
}

// Latest returns the job's latest committed checkpoint, or nil when there is
// none. A malformed stored value never stops the job: its last good value
// is returned instead (or nil: start from scratch), and the problem is
// logged with the key.
func (s *Store) Latest(ctx context.Context) (*Record, error) {
	rec, _, err := s.get(ctx)
	return rec, err
}

// get returns the stored record (its last good value when the stored one is
// malformed) and the key's mod revision (0 when absent).
func (s *Store) get(ctx context.Context) (*Record, int64, error) {
	rec, rev, problem, err := fleet.ReadRecord(ctx, s.cli, s.key, decodeRecord)
	if err != nil {
		return nil, 0, fmt.Errorf("checkpoint: %w", err)
	}
	if problem != nil {
		s.logger().Warn("checkpoint: malformed checkpoint record", "key", s.key, "err", problem)
	}
	return rec, rev, nil
}

func decodeRecord(key string, v []byte) (*Record, error) {
	var rec Record
	if err := json.Unmarshal(v, &rec); err != nil {
		return nil, fmt.Errorf("checkpoint: malformed record at %s: %w", key, err)
	}
	if err := rec.validate(); err != nil {
		return nil, fmt.Errorf("checkpoint: malformed record at %s: %w", key, err)
	}
	return &rec, nil
}

// WithLogger sets where the store logs the problems it works around
// (default slog.Default()).
func (s *Store) WithLogger(l *slog.Logger) *Store {
	s.log = l
	return s
}

func (s *Store) logger() *slog.Logger {
	if s.log == nil {
		return slog.Default()
	}
	return s.log
}

// ReportHandler returns a Handler that commits every checkpoint report to s
// (and every step whose checkpoint_update reports are complete) at the
// report's Round, which a Channel with rounds sets to its sender's (else at
// round(), read when the report arrives), and accepts every other report.
// Use it with WithHandler so that a worker's
// report_checkpoint returns only once the record is in etcd.
func (s *Store) ReportHandler(round func() int64) control.Handler {
	var pending parts
	return func(ctx context.Context, r control.Report) error {
		var rec Record
		switch r.Type {
		case control.ReportCheckpoint:
			rec = Record{Step: r.Step, Path: r.Path, WorldSize: r.WorldSize, Time: r.Received.UTC()}
		case control.ReportCheckpointUpdate:
			var done bool
			if rec, done = pending.add(r); !done {
				return nil
			}
		default:
			return nil
		}
		rec.Round = r.Round
		if rec.Round == 0 && round != nil {
			rec.Round = round()
		}
		return s.Commit(ctx, rec)
	}
}

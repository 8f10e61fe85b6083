package fleet_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// A planned change's failed checkpoint is recorded and read back, alone
// and with the job's restarts; the latest replaces the one before; a job
// without one reads nil; a malformed record is named, never a panic.
func TestCheckpointFailureRecord(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := fleet.New(cli, "")
	if f, err := s.CheckpointFailure(ctx, "j"); err != nil || f != nil {
		t.Fatalf("no record: %+v, %v; want nil", f, err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	first := fleet.CheckpointFailure{Round: 3, Node: "a", Step: 14, Committed: 10, LostSteps: 4, Detail: "rank 0 could not save", Time: at}
	second := fleet.CheckpointFailure{Round: 5, Node: "b", Step: 30, Committed: 25, Detail: "kept in process", Time: at}
	for _, f := range []fleet.CheckpointFailure{first, second} {
		if err := s.PutCheckpointFailure(ctx, "j", f); err != nil {
			t.Fatal(err)
		}
	}
	if f, err := s.CheckpointFailure(ctx, "j"); err != nil || f == nil || *f != second {
		t.Errorf("read %+v, %v; want the latest %+v", f, err, second)
	}
	// No restart is counted for it, but the job's restart record has it.
	if w, err := s.WorkerRestarts(ctx, "j"); err != nil || w == nil || w.Count != 0 || w.CheckpointFailure == nil || *w.CheckpointFailure != second {
		t.Errorf("WorkerRestarts = %+v, %v; want no restart and the checkpoint failure %+v", w, err, second)
	}
	if w, err := s.WorkerRestarts(ctx, "other"); err != nil || w != nil {
		t.Errorf("a job with no record: WorkerRestarts = %+v, %v; want nil", w, err)
	}
	if _, err := cli.Put(ctx, s.Keys.CheckpointFailed("bad"), "{not json"); err != nil {
		t.Fatal(err)
	}
	if f, err := s.CheckpointFailure(ctx, "bad"); err != nil || f == nil || !strings.Contains(f.Detail, "malformed checkpoint failure record at") {
		t.Errorf("malformed record read as %+v, %v; want it named", f, err)
	}
}

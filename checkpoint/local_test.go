package checkpoint

import (
	"context"
	"errors"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
)

func TestLocalRecordNeverMovesBackwards(t *testing.T) {
	var l LocalRecord
	if l.Latest() != nil {
		t.Fatal("a new record is not empty")
	}
	h := l.ReportHandler()
	if err := h(context.Background(), control.Report{Type: control.ReportCheckpoint, Step: 10, Path: "/ck/10", WorldSize: 4}); err != nil {
		t.Fatal(err)
	}
	if err := h(context.Background(), control.Report{Type: control.ReportStopping, Step: 3}); err != nil {
		t.Errorf("stopping report refused: %v", err)
	}
	err := h(context.Background(), control.Report{Type: control.ReportCheckpoint, Step: 9, Path: "/ck/9"})
	if !errors.Is(err, ErrStale) {
		t.Errorf("older checkpoint accepted: %v", err)
	}
	if err := l.Commit(Record{Step: 11}); err == nil {
		t.Error("a record without a path was accepted")
	}
	r := l.Latest()
	if r == nil || r.Step != 10 || r.Path != "/ck/10" || r.WorldSize != 4 || r.Env()[EnvResumeStep] != "10" {
		t.Fatalf("latest %+v", r)
	}
	r.Step = 99 // a copy
	if l.Latest().Step != 10 {
		t.Error("Latest returned the kept record, not a copy")
	}
}

package checkpoint

import (
	"context"
	"strconv"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
)

// HyperPod's CheckpointDiscoverySocketClient: every writer reports its part;
// the step is committed only when all parts are in.
func TestCheckpointUpdatesCommitWhenEveryWriterReported(t *testing.T) {
	var l LocalRecord
	h := l.ReportHandler()
	upd := func(rank int, kind, path string, step int64) {
		t.Helper()
		r, err := control.ParseReport([]byte(`{"type":"checkpoint_update","step":` + strconv.FormatInt(step, 10) + `,"path":"` + path +
			`","checkpoint_type":"` + kind + `","num_model_checkpoints":1,"num_data_checkpoints":2,"nodes":2,"rank":` + strconv.FormatInt(int64(rank), 10) + `,"world_size":4}`))
		if err != nil {
			t.Fatal(err)
		}
		if err := h(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	// 2 nodes: 2 model writers (local rank 0 of each), 4 data writers.
	upd(0, "model", "/ck/m10", 10)
	upd(0, "data", "/ck/d10", 10)
	upd(1, "data", "/ck/d10", 10)
	upd(2, "data", "/ck/d10", 10)
	upd(3, "data", "/ck/d10", 10)
	if rec := l.Latest(); rec != nil {
		t.Fatalf("committed %+v before the second model writer reported", rec)
	}
	upd(2, "model", "/ck/m10", 10)
	rec := l.Latest()
	if rec == nil || rec.Step != 10 || rec.Path != "/ck/m10" {
		t.Fatalf("after every part: %+v, want step 10 at /ck/m10", rec)
	}
	if _, err := control.ParseReport([]byte(`{"type":"checkpoint_update","step":1,"path":"/x","checkpoint_type":"optimizer"}`)); err == nil {
		t.Error("an unknown checkpoint_type was accepted")
	}
}

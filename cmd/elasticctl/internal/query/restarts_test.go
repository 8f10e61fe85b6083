package query_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/cmd/elasticctl/internal/query"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// WorkerRestartsOf reads every named job's restart record across many
// transactions (300 jobs: 3 of counts, 2 of the rest), at the revision it
// is given: a restart counted later is not seen.
func TestWorkerRestartsOfManyJobsAtARevision(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := query.New(fleet.New(cli, ""))
	k := st.Keys
	var names []string
	at := time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)
	for i := range 300 {
		name := fmt.Sprintf("job-%03d", i)
		names = append(names, name)
		if i%3 != 0 {
			continue
		}
		if _, err := cli.Put(ctx, k.Restarts(name), fmt.Sprint(i/3+1)); err != nil {
			t.Fatal(err)
		}
		report := fmt.Sprintf(`{"node":"n%d","detail":"worker exited 1","time":%q}`, i, at.Add(time.Duration(i)*time.Second).Format(time.RFC3339))
		if _, err := cli.Put(ctx, k.Rdzv(name).Failure(int64(i+1)), report); err != nil {
			t.Fatal(err)
		}
	}
	r, err := cli.Put(ctx, k.Checkpoint("job-003"), `{"step":9,"path":"/c","round":5,"time":"2026-11-26T04:00:00Z"}`)
	if err != nil {
		t.Fatal(err)
	}
	rev := r.Header.Revision
	if _, err := cli.Put(ctx, k.Restarts("job-001"), "1"); err != nil { // after rev
		t.Fatal(err)
	}
	got, err := st.WorkerRestartsOf(ctx, names, rev)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 100 {
		t.Errorf("%d jobs with restarts, want 100", len(got))
	}
	for i := 0; i < 300; i += 3 {
		name := names[i]
		w := got[name]
		if w == nil || w.Count != int64(i/3+1) || w.LastRound != int64(i+1) || w.LastNode != fmt.Sprintf("n%d", i) ||
			!w.LastTime.Equal(at.Add(time.Duration(i)*time.Second)) {
			t.Errorf("%s: %+v", name, w)
		}
	}
	if w := got["job-003"]; w == nil || !w.CheckpointTime.Equal(time.Date(2026, 11, 26, 4, 0, 0, 0, time.UTC)) {
		t.Errorf("job-003's checkpoint time: %+v", w)
	}
	if w := got["job-001"]; w != nil {
		t.Errorf("a restart counted after the revision is seen: %+v", w)
	}
	if now, err := st.WorkerRestartsOf(ctx, []string{"job-001"}, 0); err != nil || now["job-001"] == nil || now["job-001"].Count != 1 {
		t.Errorf("at the newest revision: %+v %v", now, err)
	}
}

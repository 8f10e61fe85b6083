package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

func spec(name string) fleet.JobSpec {
	return fleet.JobSpec{Job: api.Job{Name: name, Team: "t", PerNode: api.Resources{Accelerators: 1}, SubmitTime: time.Unix(1_800_000_000, 0).UTC()},
		Run: fleet.RunSpec{Script: "a.py"}}
}

// A batch larger than one transaction is written whole, and a batch with
// one existing job leaves nothing behind, however many transactions it
// took; the error names the existing job.
func TestSubmitJobsAllOrNothing(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	var batch []fleet.JobSpec
	for i := range 100 {
		batch = append(batch, spec(fmt.Sprintf("a-%03d", i)))
	}
	if err := st.SubmitJobs(ctx, batch); err != nil {
		t.Fatal(err)
	}
	// The 90th job of the second batch exists: its first transactions are undone.
	var second []fleet.JobSpec
	for i := range 90 {
		second = append(second, spec(fmt.Sprintf("b-%03d", i)))
	}
	second = append(second, spec("a-050"))
	err := st.SubmitJobs(ctx, second)
	if !errors.Is(err, fleet.ErrJobsExist) || !strings.Contains(err.Error(), `job "a-050" already exist`) {
		t.Fatalf("submit with an existing job: %v", err)
	}
	jobs, bad, err := st.Jobs(ctx)
	if err != nil || len(bad) > 0 || len(jobs) != 100 || jobs[0].Name != "a-000" {
		t.Fatalf("after the refused batch: %d jobs (%v %v), want the first batch's 100 only", len(jobs), bad, err)
	}
}

func TestApplyJobsIsIdempotentAndKeepsTheQueuePlace(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	j := spec("x")
	j.SubmitTime = time.Time{}
	now := time.Unix(1_900_000_000, 0).UTC()
	for i, want := range []fleet.ApplyResult{fleet.Created, fleet.Unchanged} {
		res, err := st.ApplyJobs(ctx, []fleet.JobSpec{j}, now.Add(time.Duration(i)*time.Hour))
		if err != nil || res[0] != want {
			t.Fatalf("apply %d: %v %v, want %s", i, res, err, want)
		}
	}
	j.MaxNodes = 3
	if res, err := st.ApplyJobs(ctx, []fleet.JobSpec{j}, now.Add(2*time.Hour)); err != nil || res[0] != fleet.Updated {
		t.Fatalf("changed apply: %v %v", res, err)
	}
	got, err := st.Job(ctx, "x")
	if err != nil || got.MaxNodes != 3 || !got.SubmitTime.Equal(now) {
		t.Errorf("stored: %+v %v; want maxNodes 3 and the first submit time", got, err)
	}
}

package coordinator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

func TestAssignUIDs(t *testing.T) {
	for _, c := range []struct {
		rule        string
		first, last uint32
		held        map[string]uint32
		placed      []string
		want        map[string]uint32
		none        []string
	}{
		{rule: "no range: no uids", placed: []string{"a"}, want: map[string]uint32{}},
		{rule: "a new job gets the lowest free uid", first: 10, last: 12, held: map[string]uint32{"x": 10}, placed: []string{"a"}, want: map[string]uint32{"a": 11}},
		{rule: "a job keeps its uid", first: 10, last: 12, held: map[string]uint32{"a": 12, "x": 10}, placed: []string{"a"}, want: map[string]uint32{"a": 12}},
		{rule: "a stopped live job's uid is not reused", first: 10, last: 11, held: map[string]uint32{"stopped": 10}, placed: []string{"a", "b"}, want: map[string]uint32{"a": 11}, none: []string{"b"}},
		{rule: "a forgotten job's uid is reused", first: 10, last: 11, held: map[string]uint32{"x": 11}, placed: []string{"a"}, want: map[string]uint32{"a": 10}},
		{rule: "two new jobs get two uids", first: 10, last: 20, placed: []string{"a", "b"}, want: map[string]uint32{"a": 10, "b": 11}},
		{rule: "range exhausted: the job waits", first: 10, last: 10, held: map[string]uint32{"x": 10}, placed: []string{"a"}, want: map[string]uint32{}, none: []string{"a"}},
		{rule: "a uid outside the range is replaced", first: 10, last: 11, held: map[string]uint32{"a": 5}, placed: []string{"a"}, want: map[string]uint32{"a": 10}},
		{rule: "of two jobs holding one uid the smaller name keeps it", first: 10, last: 11, held: map[string]uint32{"a": 10, "b": 10}, placed: []string{"a", "b"}, want: map[string]uint32{"a": 10, "b": 11}},
	} {
		t.Run(c.rule, func(t *testing.T) {
			got, none := assignUIDs(c.first, c.last, c.held, c.placed)
			if !maps.Equal(got, c.want) || !slices.Equal(none, c.none) {
				t.Errorf("assignUIDs = %v, none %v; want %v, none %v", got, none, c.want, c.none)
			}
		})
	}
}

func TestParseUIDRange(t *testing.T) {
	for in, want := range map[string][2]uint32{"200000-299999": {200000, 299999}, "none": {}, "": {}, "5-5": {5, 5}} {
		f, l, err := ParseUIDRange(in)
		if err != nil || f != want[0] || l != want[1] {
			t.Errorf("ParseUIDRange(%q) = %d, %d, %v; want %v", in, f, l, err, want)
		}
	}
	for _, bad := range []string{"0-10", "10-5", "x", "1-4294967295", "10"} {
		if _, _, err := ParseUIDRange(bad); err == nil {
			t.Errorf("ParseUIDRange(%q) accepted", bad)
		}
	}
}

// Jobs get fleet-unique uids from the coordinator's range, recorded in
// their desired records and assignments; when the range is used up an
// admitted job waits with a reason; a deleted job's uid goes to the
// waiting job once it is forgotten; a new coordinator keeps every uid.
func TestJobUIDsAreUniqueSurviveRestartsAndComeFreeWhenForgotten(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	run := func() func() {
		c := New(cli, Config{Identity: "c", Resync: 100 * time.Millisecond, JobUIDFirst: 300000, JobUIDLast: 300001, Engine: policy.Config{MinStablePeriod: -1}})
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { c.Run(cctx); close(done) }()
		return func() { cancel(); <-done }
	}
	stop := run()
	defer func() { stop() }()
	for i, job := range []string{"j1", "j2", "j3"} {
		spec := fleet.JobSpec{Job: policy.Job{Name: job, Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}}
		if err := st.SubmitJob(ctx, spec); err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			waitTarget(t, ctx, cli, job, "1")
		}
	}
	uids := map[string]uint32{}
	for _, job := range []string{"j1", "j2"} {
		d, err := st.Desired(ctx, job)
		if err != nil || d.UID < 300000 || d.UID > 300001 {
			t.Fatalf("%s's desired record %+v, %v; want a uid of 300000-300001", job, d, err)
		}
		uids[job] = d.UID
		as, _, _, err := st.Assignments(ctx, d.Nodes[0])
		if err != nil || len(as) != 1 || as[0].UID != d.UID {
			t.Errorf("%s's assignment %+v, %v; want uid %d", job, as, err, d.UID)
		}
	}
	if uids["j1"] == uids["j2"] {
		t.Fatalf("j1 and j2 share uid %d", uids["j1"])
	}
	waitStatus := func(job string, ok func(*fleet.Status) bool, what string) {
		t.Helper()
		eventually(t, 15*time.Second, job+" "+what, func() (bool, string) {
			s, err := st.Status(ctx, job)
			return err == nil && ok(s), fmt.Sprintf("%+v %v", s, err)
		})
	}
	waitStatus("j3", func(s *fleet.Status) bool { return s.Kind == policy.KindPending && s.Code == codeNoUID }, "waits for a uid")
	if d, err := st.Desired(ctx, "j3"); err != nil || d.Running() {
		t.Fatalf("j3 runs without a uid: %+v, %v", d, err)
	}
	// A new coordinator derives the same uids from the desired records.
	stop()
	stop = run()
	for job, uid := range uids {
		d, err := st.Desired(ctx, job)
		if err != nil || d.UID != uid {
			t.Errorf("%s after a restart: %+v, %v; want uid %d", job, d, err, uid)
		}
	}
	waitStatus("j3", func(s *fleet.Status) bool { return s.Kind == policy.KindPending && s.Code == codeNoUID }, "still waits for a uid after a restart")
	// j1 deleted and forgotten: j3 gets its uid.
	if err := st.DeleteJob(ctx, "j1"); err != nil {
		t.Fatal(err)
	}
	waitTarget(t, ctx, cli, "j3", "1")
	if d, err := st.Desired(ctx, "j3"); err != nil || d.UID != uids["j1"] {
		t.Errorf("j3: %+v, %v; want j1's freed uid %d", d, err, uids["j1"])
	}
}

func TestFreeUIDs(t *testing.T) {
	for _, c := range []struct {
		rule        string
		first, last uint32
		inUse       map[uint32]int
		need        []string
		want        map[string]uint32
		none        []string
	}{
		{rule: "a new job gets the lowest free uid", first: 10, last: 12, inUse: map[uint32]int{10: 1}, need: []string{"a"}, want: map[string]uint32{"a": 11}},
		{rule: "two new jobs get two uids", first: 10, last: 20, need: []string{"a", "b"}, want: map[string]uint32{"a": 10, "b": 11}},
		{rule: "a uid held by two records is in use", first: 10, last: 11, inUse: map[uint32]int{10: 2}, need: []string{"a"}, want: map[string]uint32{"a": 11}},
		{rule: "range exhausted: the job waits", first: 10, last: 11, inUse: map[uint32]int{10: 1}, need: []string{"a", "b"}, want: map[string]uint32{"a": 11}, none: []string{"b"}},
	} {
		t.Run(c.rule, func(t *testing.T) {
			got, none := freeUIDs(c.first, c.last, c.inUse, c.need)
			if !maps.Equal(got, c.want) || !slices.Equal(none, c.none) {
				t.Errorf("freeUIDs = %v, none %v; want %v, none %v", got, none, c.want, c.none)
			}
		})
	}
}

// TestViewCountsUIDsInUse: the view's count of the uids in use follows the
// desired records as they are set, replaced and dropped (a forgotten
// job's uid comes free; one still held by another record does not).
func TestViewCountsUIDsInUse(t *testing.T) {
	v := newView(fleet.NewKeys(""), nil)
	v.desired, v.deleted, v.owned = map[string]fleet.Desired{}, map[string]bool{}, map[string]specRec{}
	v.setDesired(fleet.Desired{Allocation: policy.Allocation{Job: "a"}, UID: 10})
	v.setDesired(fleet.Desired{Allocation: policy.Allocation{Job: "b"}, UID: 10})
	v.setDesired(fleet.Desired{Allocation: policy.Allocation{Job: "c"}, UID: 11})
	v.setDesired(fleet.Desired{Allocation: policy.Allocation{Job: "c"}, UID: 12})
	if want := map[uint32]int{10: 2, 12: 1}; !maps.Equal(v.uidUse, want) {
		t.Fatalf("in use %v, want %v", v.uidUse, want)
	}
	v.dropDesired("a")
	v.dropDesired("c")
	if want := map[uint32]int{10: 1}; !maps.Equal(v.uidUse, want) {
		t.Fatalf("in use %v, want %v", v.uidUse, want)
	}
}

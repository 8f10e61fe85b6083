package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// A job's status is its status record, or, while it runs as its desired
// record places it, the status that record implies (the coordinator
// writes no status record then): every reader goes through fleet.StatusOf.
func TestStatusOf(t *testing.T) {
	t0, t1 := time.Unix(1000, 0).UTC(), time.Unix(2000, 0).UTC()
	running := &fleet.Desired{Allocation: api.Allocation{Job: "j", Team: "t", Size: 2, Nodes: []string{"a", "b"}, Since: t0, LastResize: t1},
		Generation: 3, Message: "admitted within the team's quota"}
	waiting := &fleet.Status{Reason: api.Reason{Job: "j", Team: "t", Kind: api.KindPending, Code: api.CodeNoCapacity, Message: "no room"}, Time: t0, Since: t0}
	for _, tc := range []struct {
		rule string
		st   *fleet.Status
		d    *fleet.Desired
		want *fleet.Status
	}{
		{rule: "a status record is the job's status", st: waiting, d: running, want: waiting},
		{rule: "a running desired record without a status record implies Running at its size since its last resize, with its message",
			d: running, want: &fleet.Status{Reason: api.Reason{Job: "j", Team: "t", Kind: api.KindRunning, Message: "admitted within the team's quota", FromSize: 2, ToSize: 2}, Time: t1, Since: t1}},
		{rule: "a record never resized implies Running since its admission, and one without a message says where it runs",
			d:    &fleet.Desired{Allocation: api.Allocation{Job: "j", Size: 1, Since: t0}, Generation: 1},
			want: &fleet.Status{Reason: api.Reason{Job: "j", Kind: api.KindRunning, Message: "running on 1 node(s)", FromSize: 1, ToSize: 1}, Time: t0, Since: t0}},
		{rule: "a stop record implies nothing", d: &fleet.Desired{Allocation: api.Allocation{Job: "j"}, Generation: 4, Stop: &fleet.Stop{Kind: fleet.StopShutdown}}},
		{rule: "no record implies nothing"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			got := fleet.StatusOf(tc.st, tc.d)
			gb, _ := json.Marshal(got)
			wb, _ := json.Marshal(tc.want)
			if string(gb) != string(wb) {
				t.Errorf("StatusOf: %s, want %s", gb, wb)
			}
		})
	}
}

// Store.Status and Store.Statuses read fleet.StatusOf from etcd: a job running
// as admitted (desired record, no status record) reads Running; a waiting
// one its status record; a stopped one nothing.
func TestStoreReadsImpliedStatuses(t *testing.T) {
	_, cli := etcdtest.Start(t)
	s := fleet.New(cli, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Unix(1000, 0).UTC()
	put := func(key string, v any) {
		b, _ := json.Marshal(v)
		if _, err := cli.Put(ctx, key, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	put(s.Keys.Desired("run"), fleet.Desired{Allocation: api.Allocation{Job: "run", Team: "t", Size: 1, Nodes: []string{"n"}, Since: t0}, Generation: 1, Message: "admitted"})
	put(s.Keys.Status("wait"), fleet.Status{Reason: api.Reason{Job: "wait", Team: "t", Kind: api.KindPending, Message: "no room"}, Time: t0, Since: t0})
	put(s.Keys.Desired("stopped"), fleet.Desired{Allocation: api.Allocation{Job: "stopped"}, Generation: 2, Stop: &fleet.Stop{Kind: fleet.StopShutdown}})
	if st, err := s.Status(ctx, "run"); err != nil || st.Kind != api.KindRunning || st.ToSize != 1 || st.Message != "admitted" || !st.Since.Equal(t0) {
		t.Errorf("run: %+v %v; want Running at 1 since %v, the admission's message", st, err, t0)
	}
	if st, err := s.Status(ctx, "wait"); err != nil || st.Kind != api.KindPending {
		t.Errorf("wait: %+v %v; want its Pending record", st, err)
	}
	for _, job := range []string{"stopped", "unknown"} {
		if st, err := s.Status(ctx, job); !errors.Is(err, fleet.ErrNotFound) {
			t.Errorf("%s: %+v %v; want fleet.ErrNotFound", job, st, err)
		}
	}
	all, bad, err := s.Statuses(ctx)
	if err != nil || len(bad) != 0 || len(all) != 2 || all["run"].Kind != api.KindRunning || all["wait"].Kind != api.KindPending {
		t.Errorf("Statuses: %+v %v %v; want run Running and wait Pending", all, bad, err)
	}
}

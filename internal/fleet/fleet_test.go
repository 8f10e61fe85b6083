package fleet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// EventsAt returns a job's events, its own and those naming it as the job
// capacity was taken for, and the revision to watch from: an event written
// after the read arrives on the watch, none is lost or repeated.
func TestEventsAtAndWatchFromItsRevision(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	put := func(sec int, r policy.Reason) {
		t.Helper()
		e := fleet.Event{Time: time.Unix(1_800_000_000+int64(sec), 0), Reason: r}
		b, _ := json.Marshal(e)
		if _, err := cli.Put(ctx, st.Keys.Event(e.Time, e.Job), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	put(1, policy.Reason{Job: "sweep", Kind: policy.KindAdmitted})
	put(2, policy.Reason{Job: "sweep", Kind: policy.KindShrunk, For: []string{"prod"}})
	put(3, policy.Reason{Job: "other", Kind: policy.KindAdmitted})
	evs, _, rev, err := st.EventsAt(ctx, "prod")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Job != "sweep" || evs[0].Kind != policy.KindShrunk {
		t.Fatalf("events concerning prod: %+v, want sweep's shrink for it", evs)
	}
	if all, _, _ := st.Events(ctx, ""); len(all) != 3 {
		t.Errorf("all events: %d, want 3", len(all))
	}
	// Written between the history read and the watch: still seen.
	put(4, policy.Reason{Job: "prod", Kind: policy.KindAdmitted})
	w := cli.Watch(ctx, st.Keys.EventsPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	select {
	case resp := <-w:
		if len(resp.Events) != 1 {
			t.Fatalf("watch from the read's revision: %d events, want the one written after it", len(resp.Events))
		}
	case <-ctx.Done():
		t.Fatal("the event written after the read never arrived")
	}
}

// The decision history is bounded per job and in total; the newest events
// stay.
func TestPruneEventsKeepsTheNewestWithinBothBounds(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	put := func(sec int, job string) {
		t.Helper()
		if err := st.PutEvent(ctx, fleet.Event{Time: time.Unix(1_800_000_000+int64(sec), 0), Reason: policy.Reason{Job: job, Kind: policy.KindAdmitted}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		put(i, "busy")
	}
	for i := range 3 {
		put(100+i, "quiet-job")
	}
	n, err := st.PruneEvents(ctx, 4, 6)
	if err != nil || n != 7 {
		t.Fatalf("pruned %d (%v), want 7: busy keeps 4 of 10, then the oldest go until 6 remain", n, err)
	}
	evs, _, err := st.Events(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, fmt.Sprintf("%s@%d", e.Job, e.Time.Unix()-1_800_000_000))
	}
	if len(got) != 6 || got[len(got)-1] != "quiet-job@102" || got[0] != "busy@7" {
		t.Errorf("kept %v, want busy@7..9 and the three quiet-job events (the newest six within 4 per job)", got)
	}
}

// A job's restart count reads as 0 until the rendezvous counts one, then
// as the decimal stored; a malformed count is an error naming its key.
func TestRestarts(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	if n, _, err := st.Restarts(ctx, "j"); n != 0 || err != nil {
		t.Errorf("no record: %d, %v; want 0, nil", n, err)
	}
	cli.Put(ctx, st.Keys.Restarts("j"), fleet.FormatCount(3))
	if n, _, err := st.Restarts(ctx, "j"); n != 3 || err != nil {
		t.Errorf("after 3 restarts: %d, %v; want 3, nil", n, err)
	}
	cli.Put(ctx, st.Keys.Restarts("j"), "three")
	if n, problem, err := st.Restarts(ctx, "j"); n != 3 || err != nil || problem == nil || !strings.Contains(problem.Error(), st.Keys.Restarts("j")) {
		t.Errorf("malformed count: %d, %v, %v; want the last good 3 and a problem naming the key", n, problem, err)
	}
}

package query_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/cmd/elasticctl/internal/query"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

func spec(name string) fleet.JobSpec {
	return fleet.JobSpec{Job: api.Job{Name: name, Team: "t", PerNode: api.Resources{Accelerators: 1}, SubmitTime: time.Unix(1_800_000_000, 0).UTC()},
		Run: fleet.RunSpec{Script: "a.py"}}
}

func TestJobRecordsReadOnlyTheNamedJobs(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := query.New(fleet.New(cli, ""))
	var all []fleet.JobSpec
	for i := range 40 {
		all = append(all, spec(fmt.Sprintf("j-%02d", i)))
	}
	if err := st.SubmitJobs(ctx, all); err != nil {
		t.Fatal(err)
	}
	if err := st.SetTarget(ctx, "j-07", 2); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordFinish(ctx, "j-39", fleet.Finish{Outcome: fleet.Succeeded, Node: "n"}); err != nil {
		t.Fatal(err)
	}
	names := []string{"j-07", "j-39", "nope"}
	for i := range 35 { // more than one transaction's worth
		names = append(names, fmt.Sprintf("j-%02d", i))
	}
	recs, bad, rev, err := st.JobRecords(ctx, names)
	if err != nil || len(bad) > 0 || rev == 0 {
		t.Fatal(err, bad)
	}
	if len(recs) != 36 || recs["j-07"].Desired.Target() != 2 || recs["j-39"].Finished == nil || recs["j-39"].Finished.Outcome != fleet.Succeeded {
		t.Errorf("records: %d, j-07 %+v, j-39 %+v", len(recs), recs["j-07"], recs["j-39"])
	}
	if _, ok := recs["nope"]; ok {
		t.Error("a job without a spec has records")
	}
	if _, _, _, err := st.JobRecords(ctx, []string{"../nodes/x"}); err == nil {
		t.Error("a name escaping its prefix was read")
	}
}

// Events: Since and Tail are key ranges; one job's events are its own and
// those of the same decisions that name it.
func TestQueryEvents(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := query.New(fleet.New(cli, ""))
	t0 := time.Unix(1_800_000_000, 0)
	put := func(sec int, r api.Reason) {
		t.Helper()
		if err := st.PutEvent(ctx, fleet.Event{Time: t0.Add(time.Duration(sec) * time.Second), Reason: r}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		put(i, api.Reason{Job: "other", Kind: api.KindPending})
	}
	put(20, api.Reason{Job: "sweep", Kind: api.KindShrunk, For: []string{"prod"}})
	put(20, api.Reason{Job: "prod", Kind: api.KindAdmitted})
	put(30, api.Reason{Job: "prod", Kind: api.KindRunning})
	evs, _, _, err := st.QueryEvents(ctx, query.EventQuery{Job: "prod"})
	if err != nil || len(evs) != 3 || evs[0].Job == "other" {
		t.Fatalf("prod's events: %+v %v", evs, err)
	}
	evs, _, _, _ = st.QueryEvents(ctx, query.EventQuery{Tail: 2})
	if len(evs) != 2 || evs[1].Kind != api.KindRunning {
		t.Errorf("tail 2: %+v", evs)
	}
	evs, _, _, _ = st.QueryEvents(ctx, query.EventQuery{Since: t0.Add(8 * time.Second)})
	if len(evs) != 5 {
		t.Errorf("since 8s: %d events, want 5", len(evs))
	}
	evs, _, _, _ = st.QueryEvents(ctx, query.EventQuery{Job: "prod", Tail: 1})
	if len(evs) != 1 || evs[0].Kind != api.KindRunning {
		t.Errorf("prod tail 1: %+v", evs)
	}
}

func TestWatchJobsFromARevision(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := query.New(fleet.New(cli, ""))
	snap, _, err := st.JobsSnapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Written after the snapshot, before the watch starts: still reported.
	if err := st.SubmitJobs(ctx, []fleet.JobSpec{spec("late")}); err != nil {
		t.Fatal(err)
	}
	changes, errc := st.WatchJobs(ctx, snap.Revision+1)
	select {
	case names := <-changes:
		if len(names) != 1 || names[0] != "late" {
			t.Errorf("changed: %v", names)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-ctx.Done():
		t.Fatal("the change was never reported")
	}
}

// listed is what a listing shows of a snapshot: JobsListing decodes only
// these fields.
func listed(s *query.Snapshot) string {
	var b strings.Builder
	for _, j := range s.Jobs {
		p := "nil"
		if j.Priority != nil {
			p = fmt.Sprint(*j.Priority)
		}
		fmt.Fprintf(&b, "spec %s %s %s %s %s %d %d %v %v %v %s\n", j.Name, j.Team, p, j.PriorityClass, j.Flavor, j.MinNodes, j.MaxNodes,
			j.Sizes, j.Elastic, j.Suspended, j.SubmitTime.UTC().Format(time.RFC3339Nano))
	}
	for _, d := range s.Desired {
		fmt.Fprintf(&b, "desired %s %s %d %q %d %+v\n", d.Job, d.Team, d.Size, d.Nodes, d.Generation, d.Stop)
	}
	for _, name := range slices.Sorted(maps.Keys(s.Statuses)) {
		st := s.Statuses[name]
		fmt.Fprintf(&b, "status %s: %s %s %s %s %q %d %s\n", name, st.Job, st.Team, st.Kind, st.Code, st.Message, st.ToSize, st.Since.UTC().Format(time.RFC3339Nano))
	}
	for _, name := range slices.Sorted(maps.Keys(s.Finished)) {
		f := s.Finished[name]
		fmt.Fprintf(&b, "finished %s: %s %s %q\n", name, f.Outcome, f.Node, f.Message)
	}
	return b.String()
}

// JobsListing reads the listed fields of every record as JobsSnapshot
// does, whatever the JSON looks like (escapes, other case, nulls, other
// spacing), and reports the same malformed records in the same words.
func TestJobsListingReadsWhatJobsSnapshotReads(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := query.New(fleet.New(cli, ""))
	k := st.Keys
	records := map[string]string{
		k.Spec("t", "plain"): `{"name":"plain","team":"t","perNode":{"accelerators":8,"memory":"64Gi"},"minNodes":1,"maxNodes":4,"elastic":true,"submitTime":"2026-11-23T00:08:44.123456789Z","run":{"script":"a.py","env":{"A":"{\"}"}}}`,
		k.Spec("t", "spaced"): " {\n \"name\" : \"spaced\" , \"team\":\"t\", \"priority\": 70, \"priorityClass\": \"high\", \"sizes\": [2, 4], \"suspended\": true,\n" +
			" \"submitTime\": \"2026-11-23T01:00:00+02:00\", \"run\": {\"args\": [\"x\"]}, \"extra\": [1.5e3, -0, 0.5E-2, true, false, null, {}, [], {\"a\": [{}]}] }\n",
		k.Spec("t", "escaped"):   `{"name":"esc\u0061ped","team":"t","flavor":"h\u00e9\"x","run":{}}`,
		k.Spec("t", "folded"):    `{"NAME":"folded","Team":"t","MaxNodes":3,"run":{}}`,
		k.Spec("t", "nulls"):     `{"name":"nulls","team":"t","priority":null,"flavor":null,"sizes":null,"elastic":null,"submitTime":null,"run":null}`,
		k.Spec("t", "dupe"):      `{"name":"x","name":"dupe","team":"t","maxNodes":2,"maxNodes":3}`,
		k.Spec("t", "utf8"):      "{\"name\":\"utf8\",\"team\":\"t\",\"flavor\":\"\xff\"}",
		k.Spec("t", "float"):     `{"name":"float","team":"t","maxNodes":2.0}`,
		k.Spec("t", "badtype"):   `{"name":"badtype","team":"t","elastic":"yes"}`,
		k.Spec("t", "badjson"):   `{"name":"badjson","team":"t"`,
		k.Spec("t", "trailing"):  `{"name":"trailing","team":"t"} x`,
		k.Spec("t", "notjson"):   `{not json`,
		k.Spec("t", "badnum"):    `{"name":"badnum","team":"t","run":{"x":01}}`,
		k.Spec("t", "badesc"):    `{"name":"badesc","team":"t","run":{"x":"\q"}}`,
		k.Spec("t", "ctrl"):      "{\"name\":\"ctrl\",\"team\":\"t\",\"run\":{\"x\":\"a\tb\"}}",
		k.Spec("t", "wrongkey"):  `{"name":"other","team":"t"}`,
		k.Spec("u", "wrongteam"): `{"name":"wrongteam","team":"t"}`,
		k.Spec("t", "time"):      `{"name":"time","team":"t","submitTime":"yesterday"}`,
		k.Desired("plain"):       `{"job":"plain","team":"t","size":2,"nodes":["n1", "n\u00322"],"since":"2026-11-23T00:08:44Z","generation":3}`,
		k.Desired("spaced"):      `{"job":"spaced","size":0,"nodes":[],"generation":1,"stop":{"kind":"preemption","reason":"r"}}`,
		k.Desired("escaped"):     `{"job":"escaped","size":1,"nodes":null,"generation":1}`,
		k.Desired("badsize"):     `{"job":"badsize","size":2,"nodes":["a"],"generation":1}`,
		k.Desired("badstop"):     `{"job":"badstop","size":0,"generation":1,"stop":{"kind":"nap"}}`,
		k.Desired("negative"):    `{"job":"negative","size":1,"generation":-1}`,
		k.Desired("misnamed"):    `{"job":"other","size":1,"generation":1}`,
		k.Status("plain"):        `{"job":"plain","team":"t","kind":"Running","code":"WithinQuota","message":"ok \"quoted\"","fromSize":1,"toSize":2,"holders":[{"job":"x"}],"time":"2026-11-23T00:08:44Z","since":"2026-11-23T00:08:44.5+01:00"}`,
		k.Status("badsince"):     `{"job":"badsince","kind":"Running","toSize":1,"since":"soon"}`,
		k.Status("spaced"):       `{"job":"spaced","kind":"Pending","code":null,"message":"wait"}`,
		k.Status("misnamed"):     `{"job":"other","kind":"Pending"}`,
		k.Status("badkind"):      `{"job":"badkind","kind":7}`,
		k.Finish("plain"):        `{"outcome":"Succeeded","node":"n1","time":"2026-11-23T00:08:44Z"}`,
		k.Finish("spaced"):       `{"outcome":"Failed","node":"n2","message":"exit 1","extra":[1,{"a":"b"}]}`,
		k.Finish("broken"):       `{"outcome":"Failed",`,
	}
	for key, v := range records {
		if _, err := cli.Put(ctx, key, v); err != nil {
			t.Fatal(err)
		}
	}
	full, fullBad, err := st.JobsSnapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lean, leanBad, err := st.JobsListing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := listed(full), listed(lean); a != b {
		t.Errorf("JobsListing read\n%s\nJobsSnapshot read\n%s", b, a)
	}
	words := func(errs []error) []string {
		var out []string
		for _, e := range errs {
			out = append(out, e.Error())
		}
		slices.Sort(out)
		return out
	}
	if a, b := words(fullBad), words(leanBad); !slices.Equal(a, b) {
		t.Errorf("JobsListing's problems\n%s\nJobsSnapshot's\n%s", strings.Join(b, "\n"), strings.Join(a, "\n"))
	}
	if len(full.Jobs) != 7 || len(fullBad) != 19 || lean.Revision != full.Revision {
		t.Errorf("%d jobs, %d problems, revisions %d and %d", len(full.Jobs), len(fullBad), lean.Revision, full.Revision)
	}
}

// JobHistory: the job's records, and its events (its own, and those of the
// same decisions naming it) from the time since gives, not before.
func TestJobHistory(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := query.New(fleet.New(cli, ""))
	t0 := time.Unix(1_800_000_000, 0)
	if err := st.SubmitJobs(ctx, []fleet.JobSpec{spec("prod")}); err != nil {
		t.Fatal(err)
	}
	put := func(sec int, r api.Reason) {
		t.Helper()
		if err := st.PutEvent(ctx, fleet.Event{Time: t0.Add(time.Duration(sec) * time.Second), Reason: r}); err != nil {
			t.Fatal(err)
		}
	}
	put(1, api.Reason{Job: "prod", Kind: api.KindPending, Message: "an earlier namesake's"})
	for i := range 10 {
		put(2+i, api.Reason{Job: "other", Kind: api.KindPending})
	}
	put(20, api.Reason{Job: "sweep", Kind: api.KindShrunk, For: []string{"prod"}})
	put(20, api.Reason{Job: "prod", Kind: api.KindAdmitted})
	put(20, api.Reason{Job: "bystander", Kind: api.KindPending})
	put(30, api.Reason{Job: "prod", Kind: api.KindRunning})
	pb, _ := json.Marshal(fleet.Problem{Job: "prod", Node: "n1", Message: "containerd is down"})
	if _, err := cli.Put(ctx, st.Keys.Problem("prod", "n1"), string(pb)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, st.Keys.Problem("prod-2", "n1"), string(pb)); err != nil { // another job's
		t.Fatal(err)
	}
	var sawSpec bool
	d, bad, err := st.JobHistory(ctx, "prod", func(r query.JobRecord) time.Time {
		sawSpec = r.Spec != nil && r.Spec.Name == "prod"
		return t0.Add(5 * time.Second)
	})
	if err != nil || len(bad) > 0 || d == nil || !sawSpec || d.Spec.Name != "prod" {
		t.Fatalf("JobHistory: %+v %v %v", d, bad, err)
	}
	if len(d.Problems) != 1 || d.Problems[0].Message != "containerd is down" {
		t.Errorf("problems: %+v", d.Problems)
	}
	var got []string
	for _, e := range d.History {
		got = append(got, fmt.Sprintf("%d %s %s", e.Time.Unix()-t0.Unix(), e.Job, e.Kind))
	}
	if want := []string{"20 prod Admitted", "20 sweep Shrunk", "30 prod Running"}; !slices.Equal(got, want) {
		t.Errorf("history %q, want %q", got, want)
	}
	if d, _, err := st.JobHistory(ctx, "nope", func(query.JobRecord) time.Time { return time.Time{} }); d != nil || err != nil {
		t.Errorf("a job without a spec: %+v %v", d, err)
	}
}

// A snapshot is one revision, though its prefixes are read by separate
// requests: while a writer changes a job's spec and status together (one
// transaction each time), every snapshot shows the two agreeing, at the
// revision it names.
func TestJobsSnapshotIsOneRevision(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st := query.New(fleet.New(cli, ""))
	k := st.Keys
	write := func(n int) (int64, error) {
		j := spec("pair")
		j.MaxNodes = n
		b, _ := json.Marshal(j)
		sb, _ := json.Marshal(fleet.Status{Reason: api.Reason{Job: "pair", Kind: api.KindPending, Message: fmt.Sprint(n)}})
		r, err := cli.Txn(ctx).Then(clientv3.OpPut(k.Spec("t", "pair"), string(b)), clientv3.OpPut(k.Status("pair"), string(sb))).Commit()
		if err != nil {
			return 0, err
		}
		return r.Header.Revision, nil
	}
	if _, err := write(1); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for n := 2; ; n++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if _, err := write(n); err != nil {
				done <- err
				return
			}
		}
	}()
	for i := range 60 {
		read := st.JobsSnapshot
		if i%2 == 1 {
			read = st.JobsListing
		}
		snap, bad, err := read(ctx)
		if err != nil || len(bad) > 0 || len(snap.Jobs) != 1 {
			t.Fatalf("snapshot %d: %v %v", i, bad, err)
		}
		if got, want := snap.Statuses["pair"].Message, fmt.Sprint(snap.Jobs[0].MaxNodes); got != want {
			t.Fatalf("snapshot %d at revision %d: the spec says %s, the status %s", i, snap.Revision, want, got)
		}
		r, err := cli.Get(ctx, k.Spec("t", "pair"), clientv3.WithRev(snap.Revision))
		if err != nil || len(r.Kvs) != 1 || !strings.Contains(string(r.Kvs[0].Value), fmt.Sprintf(`"maxNodes":%d`, snap.Jobs[0].MaxNodes)) {
			t.Fatalf("snapshot %d is not the state at its revision %d: %v %s", i, snap.Revision, err, r.Kvs)
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

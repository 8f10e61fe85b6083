package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/internal/tcpproxy"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func TestStoreCommitAndLatest(t *testing.T) {
	cli := etcdClient(t)
	ctx := testCtx(t, 20*time.Second)
	job := uniqueJob("job-basic")
	s := NewStore(cli, "", job)
	if s.Key() != "/hyperpodrun/jobs/"+job+"/checkpoint" {
		t.Fatalf("key %q does not follow docs/internals.md", s.Key())
	}
	if rec, err := s.Latest(ctx); err != nil || rec != nil {
		t.Fatalf("Latest with nothing committed = %+v, %v; want nil, nil", rec, err)
	}
	at := time.Date(2025, 5, 1, 12, 0, 0, 0, time.UTC)
	want := Record{Step: 120, Path: "/ckpt/step-120", WorldSize: 3, Round: 4, Time: at}
	if err := s.Commit(ctx, want); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	got, err := s.Latest(ctx)
	if err != nil || got == nil {
		t.Fatalf("Latest: %+v, %v", got, err)
	}
	if got.Step != want.Step || got.Path != want.Path || got.WorldSize != 3 || got.Round != 4 || !got.Time.Equal(at) {
		t.Fatalf("Latest = %+v, want %+v", got, want)
	}
	// A zero time is filled in.
	if err := s.Commit(ctx, Record{Step: 130, Path: "/ckpt/step-130", WorldSize: 2}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Latest(ctx); got.Time.IsZero() || got.Step != 130 {
		t.Fatalf("Latest = %+v", got)
	}
}

func TestStoreNeverGoesBackwards(t *testing.T) {
	cli := etcdClient(t)
	ctx := testCtx(t, 20*time.Second)
	job := uniqueJob("job-backwards")
	s := NewStore(cli, "/custom/", job)
	if s.Key() != "/custom/jobs/"+job+"/checkpoint" {
		t.Fatalf("key %q", s.Key())
	}
	if err := s.Commit(ctx, Record{Step: 50, Path: "/a/50"}); err != nil {
		t.Fatal(err)
	}
	err := s.Commit(ctx, Record{Step: 40, Path: "/a/40"})
	if !errors.Is(err, ErrStale) {
		t.Fatalf("Commit of an older step = %v, want ErrStale", err)
	}
	if got, _ := s.Latest(ctx); got.Step != 50 || got.Path != "/a/50" {
		t.Fatalf("older commit changed the record: %+v", got)
	}
	// The same step may be re-reported (e.g. a retry); it replaces the record.
	if err := s.Commit(ctx, Record{Step: 50, Path: "/b/50"}); err != nil {
		t.Fatalf("re-commit of the same step: %v", err)
	}
	if got, _ := s.Latest(ctx); got.Path != "/b/50" {
		t.Fatalf("Latest = %+v", got)
	}
}

func TestStoreConcurrentCommitsKeepTheHighestStep(t *testing.T) {
	cli := etcdClient(t)
	ctx := testCtx(t, 30*time.Second)
	// Several agents (separate clients) racing with steps in random order.
	job := uniqueJob("job-race")
	stores := []*Store{NewStore(cli, "", job), NewStore(etcdClient(t), "", job), NewStore(etcdClient(t), "", job)}
	steps := rand.Perm(40)
	var wg sync.WaitGroup
	errs := make(chan error, len(steps))
	for i, st := range steps {
		wg.Add(1)
		go func(s *Store, step int) {
			defer wg.Done()
			err := s.Commit(ctx, Record{Step: int64(step), Path: fmt.Sprintf("/c/%d", step)})
			if err != nil && !errors.Is(err, ErrStale) {
				errs <- err
			}
		}(stores[i%len(stores)], st)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Commit: %v", err)
	}
	got, err := stores[0].Latest(ctx)
	if err != nil || got.Step != 39 || got.Path != "/c/39" {
		t.Fatalf("Latest = %+v, %v; want step 39", got, err)
	}
}

func TestStoreRejectsInvalidRecordsAndSurvivesMalformedValues(t *testing.T) {
	cli := etcdClient(t)
	ctx := testCtx(t, 20*time.Second)
	s := NewStore(cli, "", uniqueJob("job-bad"))
	for _, r := range []Record{{Step: -1, Path: "/x"}, {Step: 1}, {Step: 1, Path: "/x", WorldSize: -2}} {
		if err := s.Commit(ctx, r); err == nil {
			t.Errorf("Commit(%+v) succeeded", r)
		}
	}
	// A malformed record never stops the job: its last good value is read
	// in its place (logged with the key), commits are still compared with
	// it, and the next commit replaces the bad value.
	var logs bytes.Buffer
	s.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))
	if err := s.Commit(ctx, Record{Step: 5, Path: "/ckpt/5", Round: 1}); err != nil {
		t.Fatal(err)
	}
	for i, bad := range []string{"garbage", `{"step":"ten","path":"/x"}`, `{"step":3}`, `{"step":-4,"path":"/x"}`} {
		if _, err := cli.Put(ctx, s.Key(), bad); err != nil {
			t.Fatal(err)
		}
		rec, err := s.Latest(ctx)
		if err != nil || rec == nil || rec.Step != int64(5+i) {
			t.Fatalf("Latest over %q = %+v, %v; want the last good step %d", bad, rec, err, 5+i)
		}
		if !strings.Contains(logs.String(), s.Key()) {
			t.Fatalf("the malformed record was not logged with its key: %q", logs.String())
		}
		if err := s.Commit(ctx, Record{Step: 1, Path: "/x", Round: 1}); !errors.Is(err, ErrStale) {
			t.Fatalf("Commit of an older step over %q = %v, want ErrStale against the last good record", bad, err)
		}
		if err := s.Commit(ctx, Record{Step: int64(6 + i), Path: "/x", Round: 1}); err != nil {
			t.Fatalf("Commit over %q: %v", bad, err)
		}
	}
	// A job whose record was never good starts from scratch.
	fresh := NewStore(cli, "", uniqueJob("job-never-good"))
	cli.Put(ctx, fresh.Key(), "garbage")
	if rec, err := fresh.Latest(ctx); rec != nil || err != nil {
		t.Fatalf("Latest of a record never good = %+v, %v; want none", rec, err)
	}
	if err := fresh.Commit(ctx, Record{Step: 1, Path: "/x"}); err != nil {
		t.Fatalf("Commit over a record never good: %v", err)
	}
}

func TestRecordEnv(t *testing.T) {
	var none *Record
	if env := none.Env(); len(env) != 0 {
		t.Fatalf("nil record env = %v", env)
	}
	env := (&Record{Step: 42, Path: "/ckpt/step-42", WorldSize: 3, Round: 9}).Env()
	want := map[string]string{EnvCheckpoint: "/ckpt/step-42", EnvResumeStep: "42", EnvCheckpointWorldSize: "3", EnvCheckpointRound: "9"}
	if len(env) != len(want) {
		t.Fatalf("env = %v, want %v", env, want)
	}
	for k, v := range want {
		if env[k] != v {
			t.Fatalf("env[%s] = %q, want %q", k, env[k], v)
		}
	}
}

// The agent's path: a worker's checkpoint report is recorded in etcd before
// the worker's report call returns; other reports are accepted; a stale
// report is refused back to the worker.
func TestReportHandlerCommitsBeforeAcknowledging(t *testing.T) {
	cli := etcdClient(t)
	ctx := testCtx(t, 20*time.Second)
	s := NewStore(cli, "", uniqueJob("job-handler"))
	round := int64(5)
	ch, err := control.NewChannel(filepath.Join(t.TempDir(), "ctl"), control.WithHandler(s.ReportHandler(func() int64 { return round })))
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := control.SendReport(ctx, ch.SocketPath(), control.Report{Type: control.ReportCheckpoint, Step: 20, Path: "/ckpt/20", Rank: 0, WorldSize: 3}); err != nil {
		t.Fatalf("report: %v", err)
	}
	rec, err := s.Latest(ctx)
	if err != nil || rec == nil || rec.Step != 20 || rec.Path != "/ckpt/20" || rec.WorldSize != 3 || rec.Round != 5 || rec.Time.IsZero() {
		t.Fatalf("after acknowledged report Latest = %+v, %v", rec, err)
	}
	if err := control.SendReport(ctx, ch.SocketPath(), control.Report{Type: control.ReportStopping, Step: 20, Rank: 1}); err != nil {
		t.Fatalf("stopping report: %v", err)
	}
	err = control.SendReport(ctx, ch.SocketPath(), control.Report{Type: control.ReportCheckpoint, Step: 10, Path: "/ckpt/10"})
	if err == nil || !strings.Contains(err.Error(), "older than") {
		t.Fatalf("stale report = %v, want a refusal", err)
	}
	if rec, _ := s.Latest(ctx); rec.Step != 20 {
		t.Fatalf("stale report moved the record to %+v", rec)
	}
}

// TestStoreRefusesAStaleRoundsCommit: the rank 0 of a round that was
// replaced (its agent was frozen, its lease expired) may still report a
// checkpoint with a higher step than the new round has reached; it must not
// overwrite the new round's record.
func TestStoreRefusesAStaleRoundsCommit(t *testing.T) {
	cli := etcdClient(t)
	ctx := testCtx(t, 20*time.Second)
	s := NewStore(cli, "", uniqueJob("job-stale-round"))
	if err := s.Commit(ctx, Record{Step: 100, Path: "/old/100", Round: 3}); err != nil {
		t.Fatal(err)
	}
	// Round 4 resumed from step 100 and committed step 110.
	if err := s.Commit(ctx, Record{Step: 110, Path: "/new/110", Round: 4}); err != nil {
		t.Fatal(err)
	}
	// Round 3's rank 0 kept training while frozen out and reports step 150.
	err := s.Commit(ctx, Record{Step: 150, Path: "/old/150", Round: 3})
	if !errors.Is(err, ErrStale) {
		t.Fatalf("Commit of a stale round's step 150 = %v, want ErrStale", err)
	}
	if !strings.Contains(err.Error(), "round 3") {
		t.Errorf("error %q does not name the stale round", err)
	}
	if got, _ := s.Latest(ctx); got.Step != 110 || got.Path != "/new/110" || got.Round != 4 {
		t.Fatalf("a stale round's commit changed the record: %+v", got)
	}
	// A later round commits as usual.
	if err := s.Commit(ctx, Record{Step: 120, Path: "/new/120", Round: 5}); err != nil {
		t.Fatalf("commit of a later round: %v", err)
	}
}

// TestResumeRefusesACommitHeldUpByAnOutage is the soak's lost-steps case: a
// fenced round's rank 0 reports step 816 while its node cannot reach etcd;
// the commit is still in flight when etcd comes back, after the next round's
// agent read step 801 as where to resume. Without the claim the late commit
// lands (same round as the record, higher step) and the job's record says
// 816 while its workers redo 802..816.
func TestResumeRefusesACommitHeldUpByAnOutage(t *testing.T) {
	cli := etcdClient(t)
	ctx := testCtx(t, 30*time.Second)
	job := uniqueJob("job-held-commit")
	s := NewStore(cli, "", job)
	if err := s.Commit(ctx, Record{Step: 801, Path: "/ckpt/801", Round: 5}); err != nil {
		t.Fatal(err)
	}

	// The fenced node reaches etcd through a proxy that is cut: its commit
	// waits in the client for the connection to come back.
	proxy, err := tcpproxy.New(strings.TrimPrefix(etcdSrv.Endpoints[0], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	fenced, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + proxy.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fenced.Close() })
	if _, err := fenced.Get(ctx, "warm-up"); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	late := make(chan error, 1)
	go func() { late <- NewStore(fenced, "", job).Commit(ctx, Record{Step: 816, Path: "/ckpt/816", Round: 5}) }()

	// Round 6 forms on the nodes that reach etcd and claims the record.
	rec, err := s.Resume(ctx, 6)
	if err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if rec == nil || rec.Step != 801 || rec.Round != 6 {
		t.Fatalf("Resume(6) = %+v, want step 801 claimed for round 6", rec)
	}
	select {
	case err := <-late:
		t.Fatalf("the fenced commit returned while its etcd was cut: %v", err)
	default:
	}

	// etcd is back for the fenced node: its commit is refused.
	if err := proxy.Restore(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-late:
		if !errors.Is(err, ErrStale) {
			t.Fatalf("late commit of round 5 after round 6 resumed = %v, want ErrStale", err)
		}
	case <-ctx.Done():
		t.Fatal("the fenced commit never returned after etcd came back")
	}
	if got, _ := s.Latest(ctx); got.Step != 801 || got.Round != 6 {
		t.Fatalf("record after the late commit = %+v, want step 801 of round 6 (what round 6 resumed from)", got)
	}
	// Round 6's own commits go on; resuming again claims nothing new.
	if err := s.Commit(ctx, Record{Step: 810, Path: "/ckpt/810", Round: 6}); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Resume(ctx, 6); err != nil || rec.Step != 810 {
		t.Fatalf("Resume(6) again = %+v, %v; want step 810", rec, err)
	}
	if rec, err := s.Resume(ctx, 0); err != nil || rec.Step != 810 || rec.Round != 6 {
		t.Fatalf("Resume(0) = %+v, %v; want the record unchanged", rec, err)
	}
}

func TestResumeWithNothingCommitted(t *testing.T) {
	cli := etcdClient(t)
	ctx := testCtx(t, 10*time.Second)
	if rec, err := NewStore(cli, "", uniqueJob("job-resume-empty")).Resume(ctx, 3); err != nil || rec != nil {
		t.Fatalf("Resume with no record = %+v, %v; want nil, nil", rec, err)
	}
}

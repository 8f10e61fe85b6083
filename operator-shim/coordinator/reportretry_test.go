package coordinator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

func TestRetryWake(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		rule    string
		wake    time.Time
		retries int // cycles in a row that left reports
		want    time.Time
	}{
		{"no report left: the wake as it is", now.Add(time.Minute), 0, now.Add(time.Minute)},
		{"no report left and no wake: none", time.Time{}, 0, time.Time{}},
		{"a report left and no wake: a retry", time.Time{}, 1, now.Add(reportRetry)},
		{"a report left and a later wake: the retry first", now.Add(time.Minute), 1, now.Add(reportRetry)},
		{"a report left and a sooner wake: the wake", now.Add(100 * time.Millisecond), 1, now.Add(100 * time.Millisecond)},
		{"left by a second cycle in a row: twice as long", time.Time{}, 2, now.Add(2 * reportRetry)},
		{"left by a fifth cycle in a row: 16 times", time.Time{}, 5, now.Add(16 * reportRetry)},
		{"left by a sixth cycle in a row: the bound", time.Time{}, 6, now.Add(maxReportRetry)},
		{"left for an hour: still the bound", time.Time{}, 3600, now.Add(maxReportRetry)},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := retryWake(tc.wake, now, tc.retries); !got.Equal(tc.want) {
				t.Errorf("retryWake(%v, now, %d) = %v, want %v", tc.wake, tc.retries, got, tc.want)
			}
		})
	}
}

// A node's finish report that the coordinator cannot process (etcd
// refuses writes: its space alarm) is processed once etcd takes writes
// again, with no other input to start a cycle. It waited for the next
// input or the resync (10 minutes): in a 3-member soak a finished job
// stayed Running for four minutes after an etcd member's disk was full,
// until a node agent's restart brought a cycle.
func TestAReportLeftByAnEtcdErrorIsProcessedWithoutAnotherInput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	putNeuronNodes(t, ctx, cli, st, "trainium2", 1)
	if err := st.PutTeam(ctx, policy.Team{Name: "a", Quotas: []policy.FlavorQuota{{Flavor: "trainium2", Nominal: 8}}}); err != nil {
		t.Fatal(err)
	}
	var writeErrors atomic.Int32
	// The reports reach the coordinator 300 ms late: the test refuses
	// etcd's writes meanwhile.
	c := New(cli, Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnEtcdError: func(op string) {
			if op == "write" {
				writeErrors.Add(1)
			}
		},
		watchDelay: func(p string) time.Duration {
			if p == st.Keys.ReportsPrefix() {
				return 300 * time.Millisecond
			}
			return 0
		}})
	runCoordinator(t, ctx, c)
	if err := st.SubmitJob(ctx, fleet.JobSpec{Job: gpuJob("j", "a", 0), Run: fleet.RunSpec{Script: "train.py"}}); err != nil {
		t.Fatal(err)
	}
	var node string
	until(t, "j placed", func() bool {
		d, err := st.Desired(ctx, "j")
		if err != nil || !d.Running() {
			return false
		}
		node = d.Nodes[0]
		return true
	})
	if err := st.MarkFinished(ctx, "j", fleet.Finish{Outcome: fleet.Succeeded, Node: node, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	m, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := m.Members[0].ID
	if _, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: id, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	until(t, "the coordinator failing to process the report", func() bool { return writeErrors.Load() > 0 })
	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: id, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "j finished by its node's report, with no other input", func() (bool, string) {
		f, _, err := st.FinishOf(ctx, "j")
		return err == nil && f != nil && f.Outcome == fleet.Succeeded, fmt.Sprintf("%+v %v", f, err)
	})
}

func TestCycleRetryDelay(t *testing.T) {
	for _, tc := range []struct {
		rule   string
		failed int // cycles in a row that failed
		want   time.Duration
	}{
		{"no failed cycle: none", 0, 0},
		{"one failed cycle (a transient error): read again at once", 1, 0},
		{"a second in a row: 100 ms", 2, 100 * time.Millisecond},
		{"a third: twice as long", 3, 200 * time.Millisecond},
		{"the tenth: 25.6 s", 10, 25600 * time.Millisecond},
		{"the eleventh: the bound", 11, 30 * time.Second},
		{"for hours: still the bound", 100000, 30 * time.Second},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := cycleRetryDelay(tc.failed); got != tc.want {
				t.Errorf("cycleRetryDelay(%d) = %v, want %v", tc.failed, got, tc.want)
			}
		})
	}
}

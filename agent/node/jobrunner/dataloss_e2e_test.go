package jobrunner

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// etcd restarted with its data directory wiped under a running job (issue
// 24), on Debian's etcd, a real coordinator, the real node agent and a
// real hyperpodrun with its worker: the job's processes stop (none left),
// the node is registered free and says why, a job submitted after the
// wipe does not run beside the old one on the node's only accelerator,
// and the first job can be submitted again and runs.
func TestEtcdWipedUnderARunningJob(t *testing.T) {
	bin, ok := etcdtest.DebianEtcd()
	if !ok {
		t.Skip("Debian's etcd binary is not installed (apt-get install etcd-server)")
	}
	hpr := hyperpodrun(t)
	etcd := etcdtest.StartRestartable(t, bin)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.URL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	st := fleet.New(cli, "")
	f := newProcessFleet(t, cli, []string{etcd.URL}, hpr)

	// As root, each job runs as its own uid (the first of the range for
	// the first job of each epoch): the old job's uid must be released
	// for the new epoch's job to run.
	var uids UIDRange
	if os.Geteuid() == 0 {
		uids = UIDRange{First: 231000, Last: 231009}
	}
	f.startCoordinator(coordinator.Config{JobUIDFirst: uids.First, JobUIDLast: uids.Last})
	r, agent := f.startAgent("node-a", Config{AllowRootJobs: !uids.Set(), UIDRange: uids, DrainMargin: 2 * time.Second})

	// Each job's worker appends its pid to <dir>/runs and runs until
	// stopped.
	// (Reachable and writable by the jobs' uids.)
	dirs := map[string]string{"j": t.TempDir(), "k": t.TempDir()}
	wdir := t.TempDir()
	worker := filepath.Join(wdir, "w.sh")
	if err := os.WriteFile(worker, []byte(loopWorker), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(wdir), wdir, dirs["j"], dirs["k"]} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{dirs["j"], dirs["k"]} { // a job's uid changes with the epoch
		if err := os.WriteFile(filepath.Join(d, "runs"), nil, 0o666); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(d, "runs"), 0o666); err != nil {
			t.Fatal(err)
		}
	}
	submit := func(job string) error {
		return st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: job, Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 1},
			Run: fleet.RunSpec{Script: worker, NoPython: true, Env: map[string]string{"OUT": dirs[job]}, GracefulTimeoutSeconds: 2}})
	}
	team := func() {
		t.Helper()
		if err := st.PutTeam(ctx, policy.Team{Name: "t", Weight: 1, Quotas: []policy.FlavorQuota{{Flavor: e2eFlavor, Nominal: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	pids := func(job string) []int {
		b, _ := os.ReadFile(filepath.Join(dirs[job], "runs"))
		var ps []int
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil {
				ps = append(ps, p)
			}
		}
		return ps
	}
	waitFor := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		testutil.Eventually(t, within, what, testutil.True(cond))
	}

	team()
	if err := submit("j"); err != nil {
		t.Fatal(err)
	}
	waitFor("job j's worker to run", 60*time.Second, func() bool { return len(pids("j")) == 1 })
	r.mu.Lock()
	hprPID := r.jobs["j"].cmd.Process.Pid
	r.mu.Unlock()
	// The old job: its hyperpodrun and every worker it started (it
	// rejoins the empty etcd on its own and starts them again).
	oldAlive := func() bool { return alive(hprPID) || slices.ContainsFunc(pids("j"), alive) }

	etcd.Wipe()
	// What the reporter did next: the team again, and a new job
	// that fits only on the node the old job still holds.
	waitFor("the team to be written to the empty etcd", 30*time.Second, func() bool {
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		defer wcancel()
		return st.PutTeam(wctx, policy.Team{Name: "t", Weight: 1, Quotas: []policy.FlavorQuota{{Flavor: e2eFlavor, Nominal: 1}}}) == nil
	})
	if err := submit("k"); err != nil {
		t.Fatal(err)
	}
	// Until k's worker runs, j's must be gone the moment k's starts.
	testutil.Eventually(t, 60*time.Second, "job k to run on the node", func() (bool, string) {
		k := pids("k")
		if len(k) > 0 && oldAlive() {
			t.Fatalf("node double-booked: job k's worker %d runs beside the old job j (workers %v, hyperpodrun %d alive %v)",
				k[0], pids("j"), hprPID, alive(hprPID))
		}
		return len(k) > 0, ""
	})
	if oldAlive() {
		t.Fatalf("the old job's processes are left: workers %v, hyperpodrun %d alive %v", pids("j"), hprPID, alive(hprPID))
	}
	before := len(pids("j"))
	if !strings.Contains(f.logs.String(), "etcd lost its data") || !strings.Contains(f.logs.String(), "level=ERROR") {
		t.Errorf("the agent did not say at error level that etcd lost its data")
	}
	// The node's record says so (elasticctl describe node shows it).
	nodes, _, err := st.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || !slices.ContainsFunc(nodes[0].Reasons, func(s string) bool {
		return strings.Contains(s, "etcd lost its data") && strings.Contains(s, "jobs stopped on this node: j")
	}) {
		t.Errorf("node record after the wipe: %+v, want a reason naming the loss and job j", nodes)
	}
	// And the metric counts it.
	resp, err := http.Get("http://" + agent.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`(?m)^hyperpod_agent_etcd_data_loss_total\{[^}]*\} 1$`).Match(body) {
		t.Errorf("metrics lack hyperpod_agent_etcd_data_loss_total 1:\n%s", body)
	}

	// The first job can be submitted again (not "still leaving its nodes"
	// for ever) and runs once the node is free.
	waitFor("job j to be accepted again", 30*time.Second, func() bool { return submit("j") == nil })
	if err := st.DeleteJob(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	waitFor("the resubmitted job j to run", 60*time.Second, func() bool {
		ps := pids("j")
		return len(ps) == before+1 && alive(ps[before])
	})
	if k := pids("k"); alive(k[0]) {
		t.Errorf("job k's worker %d still runs beside the resubmitted j", k[0])
	}
}

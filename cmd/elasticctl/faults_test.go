package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// Faults of the fleet's records, as a user of elasticctl sees them
// (issue 10's table): a bad record is skipped, never charged, scheduled
// onto, or used to end or preempt a job.

// jobsJSON is 'elasticctl get jobs -o json', by job name.
func jobsJSON(t *testing.T, ep string) map[string]jobView {
	t.Helper()
	out := mustCtl(t, ep, "get", "jobs", "-o", "json")
	var views []jobView
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		t.Fatalf("get jobs -o json: %v\n%s", err, out)
	}
	m := map[string]jobView{}
	for _, v := range views {
		m[v.Spec.Name] = v
	}
	return m
}

// waitCycles waits until the coordinator has run n more cycles.
func waitCycles(t *testing.T, _ *clientv3.Client, n int) {
	t.Helper()
	want := coordCycles.Load() + int64(n)
	testutil.Eventually(t, 20*time.Second, fmt.Sprintf("%d more coordinator cycles", n), func() (bool, string) {
		got := coordCycles.Load()
		return got >= want, fmt.Sprintf("%d of them", got-want+int64(n))
	})
}

// waitRunning waits until the job holds an allocation (Admitted in the
// cycle that admits it, Running or Grown after).
func waitRunning(t *testing.T, ep, job string) jobView {
	t.Helper()
	var v jobView
	waitFor(t, job+" running", func() (bool, string) {
		v = jobsJSON(t, ep)[job]
		return v.Allocation != nil, mustCtl(t, ep, "get", "jobs")
	})
	return v
}

func waitState(t *testing.T, ep, job, state string) jobView {
	t.Helper()
	var v jobView
	waitFor(t, job+" "+state, func() (bool, string) {
		v = jobsJSON(t, ep)[job]
		if state == "Admitted" {
			// Admitted lasts one coordinator cycle: Running (placed) follows.
			return (v.state() == state || v.state() == "Running") && v.Allocation != nil, mustCtl(t, ep, "get", "jobs")
		}
		return v.state() == state, mustCtl(t, ep, "get", "jobs")
	})
	return v
}

// One unparsable team record used to preempt the team's running jobs at
// once (TeamNotFound): the team's last good value is used instead.
func TestUnparsableTeamRecordPreemptsNothing(t *testing.T) {
	ep, cli := startFleet(t, 2)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	startCoordinator(t, cli)
	mustCtl(t, ep, "submit", "-f", writeFile(t, "sweep.yaml", elasticJob))
	before := waitRunning(t, ep, "sweep")
	if _, err := cli.Put(context.Background(), fleet.NewKeys("").Team("research"), "{not json"); err != nil {
		t.Fatal(err)
	}
	waitCycles(t, cli, 3)
	v := jobsJSON(t, ep)["sweep"]
	if v.Allocation == nil || v.Allocation.Size != before.Allocation.Size || v.state() == "Preempted" || v.state() == "Pending" {
		t.Fatalf("after its team's record was corrupted, sweep is %s with %+v; want it still running at %d nodes",
			v.state(), v.Allocation, before.Allocation.Size)
	}
	if _, errs, _ := ctl(t, ep, "get", "teams"); !strings.Contains(errs, "teams/research") {
		t.Errorf("get teams does not warn about the malformed record: %q", errs)
	}
}

// A node record written without a lease used to be scheduled onto and
// never expire: it is ignored.
func TestNodeWithoutLeaseIsNeverScheduledOnto(t *testing.T) {
	ep, cli := startFleet(t, 0)
	b, _ := json.Marshal(h100Node("ghost"))
	if _, err := cli.Put(context.Background(), fleet.NewKeys("").Node("ghost"), string(b)); err != nil {
		t.Fatal(err)
	}
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	startCoordinator(t, cli)
	mustCtl(t, ep, "submit", "-f", writeFile(t, "sweep.yaml", elasticJob))
	v := waitState(t, ep, "sweep", "Pending")
	if v.Allocation != nil {
		t.Fatalf("sweep was placed on %v, a node without a lease", v.Allocation.Nodes)
	}
	if out, errs, _ := ctl(t, ep, "get", "nodes"); strings.Contains(out, "ghost") || !strings.Contains(errs, "lease") {
		t.Errorf("get nodes lists the node without a lease or does not say why it is ignored:\n%s\n%s", out, errs)
	}
}

// A spec stored under a key that does not match its name used to win,
// charging the job to the other team: it is ignored.
func TestSpecUnderAnotherKeyIsIgnored(t *testing.T) {
	ep, cli := startFleet(t, 2)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	startCoordinator(t, cli)
	mustCtl(t, ep, "submit", "-f", writeFile(t, "sweep.yaml", elasticJob))
	waitRunning(t, ep, "sweep")
	impostor := `{"name":"sweep","team":"prod","priority":99,"flavor":"nvidia-h100-80gb","perNode":{"accelerators":8},"minNodes":2,"maxNodes":2,"run":{"script":"x.py"}}`
	// Another team's younger spec of the same name, and a spec naming team
	// prod stored under team research's prefix.
	if _, err := cli.Put(context.Background(), fleet.NewKeys("").Spec("prod", "sweep"), impostor); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(context.Background(), fleet.NewKeys("").Spec("research", "zzz"), impostor); err != nil {
		t.Fatal(err)
	}
	waitCycles(t, cli, 3)
	jobs := jobsJSON(t, ep)
	if v := jobs["sweep"]; v.Spec.Team != "research" || v.Allocation == nil || v.Allocation.Team != "research" {
		t.Errorf("sweep is charged to team %q (allocation %+v), want research", v.Spec.Team, v.Allocation)
	}
	if _, ok := jobs["zzz"]; ok {
		t.Error("the spec under another job's key became a job")
	}
}

// A job deleted and submitted again under the same name used to inherit
// its restart count and checkpoint, and fail at once with "1 restart(s)
// exceed --max-restarts 0": the new job starts afresh.
func TestDeletedJobSubmittedAgainStartsAfresh(t *testing.T) {
	ep, cli := startFleet(t, 1)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	startCoordinator(t, cli)
	job := writeFile(t, "sweep.yaml", elasticJob)
	mustCtl(t, ep, "submit", "-f", job)
	waitRunning(t, ep, "sweep")
	k := fleet.NewKeys("")
	ctx := context.Background()
	// What the job's hyperpodruns leave: a restart count, a checkpoint.
	cli.Put(ctx, k.Restarts("sweep"), "1")
	cli.Put(ctx, k.Checkpoint("sweep"), `{"step":40,"path":"/ckpt/step-40","world_size":8,"round":3}`)
	// A node still in the rendezvous: the name cannot be reused yet.
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	cli.Put(ctx, k.Rdzv("sweep").Member("node-0"), `{"addr":"a","lws":1}`, clientv3.WithLease(l.ID))
	mustCtl(t, ep, "delete", "sweep")
	if _, errs, code := ctl(t, ep, "submit", "-f", job); code == 0 || !strings.Contains(errs, "still leaving") {
		t.Errorf("submit while the old job's node is still in its rendezvous: exit %d, %q; want a refusal saying it is still leaving", code, errs)
	}
	cli.Revoke(ctx, l.ID) // the node leaves
	waitFor(t, "the deleted job's records to be gone", func() (bool, string) {
		r, err := cli.Get(ctx, k.Job("sweep"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 0, ""
	})
	mustCtl(t, ep, "submit", "-f", job)
	waitRunning(t, ep, "sweep")
	for _, key := range []string{k.Restarts("sweep"), k.Checkpoint("sweep")} {
		if r, err := cli.Get(ctx, key); err != nil || len(r.Kvs) != 0 {
			t.Errorf("the new job inherited %s", key)
		}
	}
}

// No name escapes its prefix: 'elasticctl delete ../nodes/node3' used to
// delete a live node, and a team named ../specs/x overwrote a spec.
func TestNamesCannotEscapeTheirPrefix(t *testing.T) {
	ep, _ := startFleet(t, 1)
	if _, errs, code := ctl(t, ep, "delete", "../nodes/node-0"); code != 2 || !strings.Contains(errs, "DNS-1123") {
		t.Errorf("delete ../nodes/node-0: exit %d, %q; want 2 and the naming rule", code, errs)
	}
	if out := mustCtl(t, ep, "get", "nodes"); !strings.Contains(out, "node-0") {
		t.Errorf("the node is gone:\n%s", out)
	}
	evil := "teams:\n- name: ../specs/x\n  quotas:\n  - flavor: nvidia-h100-80gb\n    nominal: 8\n"
	if _, errs, code := ctl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", evil)); code == 0 || !strings.Contains(errs, "DNS-1123") {
		t.Errorf("apply a team named ../specs/x: exit %d, %q; want a refusal naming the rule", code, errs)
	}
	for _, args := range [][]string{{"resize", "job", "../x", "--nodes", "1"}, {"suspend", "a/b"}, {"describe", "job", "../../x"}} {
		if _, errs, code := ctl(t, ep, args...); code != 2 || !strings.Contains(errs, "DNS-1123") {
			t.Errorf("%v: exit %d, %q; want 2 and the naming rule", args, code, errs)
		}
	}
}

// A file over 1 MiB is refused at once: a 10 MB file used to take seconds
// and hundreds of MiB before etcd refused it.
func TestHugeFileRefusedAtOnce(t *testing.T) {
	ep, _ := startFleet(t, 0)
	big := elasticJob + "# " + strings.Repeat("x", 10<<20) + "\n"
	// The size guard refuses it before any parsing (the message is its).
	_, errs, code := ctl(t, ep, "submit", "-f", writeFile(t, "big.yaml", big))
	if code == 0 || !strings.Contains(errs, "larger than 1 MiB") {
		t.Errorf("a 10 MB job file: exit %d, %q; want a refusal naming the limit", code, errs)
	}
}

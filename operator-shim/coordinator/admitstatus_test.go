package coordinator

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// An admission writes no status record, and a finish deletes none: a job
// running as its desired record places it has none, and every reader
// (fleet.StatusOf) takes the status that record implies: Running at its
// size since its admission, with the admission's message; the Admitted
// decision is the job's event. Before, the status was written at every
// admission and deleted at every finish: 1,000 of a 20,000-node churn
// round's 3,826 writes (issue 27). etcd's history of each status key
// shows it was never written.
func TestAnAdmissionWritesNoStatus(t *testing.T) {
	cli, ctx := setup(t) // 3 nodes of 16; team a, nominal 48
	st := fleet.New(cli, "")
	var cc cycleCounter
	runCoordinator(t, ctx, New(cli, Config{Engine: policy.Config{MinStablePeriod: -1}, OnCycle: cc.observe}))
	job := func(name, team string) fleet.JobSpec {
		return fleet.JobSpec{Job: policy.Job{Name: name, Team: team, PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}}
	}
	for _, name := range []string{"first", "second"} {
		if err := st.SubmitJob(ctx, job(name, "a")); err != nil {
			t.Fatal(err)
		}
		waitTarget(t, ctx, cli, name, "1")
	}
	// A submit the fast path leaves to a full cycle (no team quota): that
	// cycle decides first and second again, unchanged.
	if err := st.SubmitJob(ctx, job("other", "no-quota")); err != nil {
		t.Fatal(err)
	}
	until(t, "a cycle that decided other and changed no allocation", func() bool {
		cc.mu.Lock()
		defer cc.mu.Unlock()
		return cc.jobs["other"] && cc.calm > 0
	})
	// first finishes: its stop record goes out, its status was never
	// there to delete, and readers see no status.
	if err := st.MarkFinished(ctx, "first", fleet.Finish{Outcome: fleet.Succeeded, Node: "n0"}); err != nil {
		t.Fatal(err)
	}
	until(t, "first stopped", func() bool { d, err := st.Desired(ctx, "first"); return err == nil && d != nil && d.Stop != nil })
	if s, err := st.Status(ctx, "first"); !errors.Is(err, fleet.ErrNotFound) {
		t.Errorf("a finished job's status: %+v %v; want none", s, err)
	}
	head, err := cli.Get(ctx, st.Keys.Root(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"first", "second"} {
		for rev := int64(1); rev <= head.Header.Revision; rev++ {
			r, err := cli.Get(ctx, st.Keys.Status(name), clientv3.WithRev(rev))
			if err != nil || len(r.Kvs) != 0 {
				t.Fatalf("%s's status record at revision %d: %v %v; want none ever", name, rev, r.Kvs, err)
			}
		}
		s, err := st.Status(ctx, name)
		if name == "first" {
			continue // finished (above)
		}
		if err != nil || s.Kind != policy.KindRunning || s.ToSize != 1 || s.FromSize != 1 || s.Message == "" || s.Since.IsZero() {
			t.Errorf("%s's status: %+v %v; want Running at 1 node, the admission's message and time", name, s, err)
		}
		evs, _, err := st.Events(ctx, name)
		if err != nil || len(evs) != 1 || evs[0].Kind != policy.KindAdmitted {
			t.Errorf("%s's events: %+v %v; want its admission", name, evs, err)
		} else if evs[0].Message != s.Message {
			t.Errorf("%s's status says %q, its admission %q; want the admission's message", name, s.Message, evs[0].Message)
		}
	}
}

// A job's status after a resize, as the planner leaves it, by rule: the
// resize has its own status record while it is news; once the job runs
// as placed the record goes, and the status its desired record implies
// says where it runs, not the resize's message.
func TestStatusAfterAResize(t *testing.T) {
	t0 := time.Unix(1000, 0)
	k := fleet.NewKeys("")
	two := api.Allocation{Job: "a", Team: "t", Flavor: "f", Size: 2, AcceleratorsPerNode: 8, Nodes: []string{"n1", "n2"}, Since: t0, LastResize: t0}
	three := two
	three.Size, three.Nodes, three.LastResize = 3, []string{"n1", "n2", "n3"}, t0.Add(time.Minute)
	c := newPlanCoordinator(t)
	commit := func(d policy.Decision) []string {
		p := planNow(c, d, !c.view.haveLast)
		if _, err := c.commitPlan(context.Background(), &fakeCommitter{}, p); err != nil {
			t.Fatal(err)
		}
		return opKeys(p)
	}
	commit(policy.Decision{Now: t0, Allocations: []api.Allocation{two},
		Reasons: []policy.Reason{{Job: "a", Team: "t", Kind: policy.KindAdmitted, ToSize: 2, Message: "admitted at 2 nodes"}}})
	grown := commit(policy.Decision{Now: t0.Add(time.Minute), Allocations: []api.Allocation{three},
		Reasons: []policy.Reason{{Job: "a", Team: "t", Kind: policy.KindGrown, Code: policy.CodeFairShare, FromSize: 2, ToSize: 3, Message: "grown from 2 to 3 nodes"}}})
	if !slices.Contains(grown, "put "+k.Status("a")) {
		t.Errorf("the grow writes no status record: %v", grown)
	}
	steady := commit(policy.Decision{Now: t0.Add(2 * time.Minute), Allocations: []api.Allocation{three},
		Reasons: []policy.Reason{{Job: "a", Team: "t", Kind: policy.KindRunning, FromSize: 3, ToSize: 3, Message: "running on 3 nodes"}}})
	if !slices.Contains(steady, "delete "+k.Status("a")) {
		t.Errorf("running as placed again keeps the grow's status record: %v", steady)
	}
	d := c.view.desired["a"]
	s := fleet.StatusOf(c.view.statuses["a"], &d)
	if s == nil || s.Kind != policy.KindRunning || s.ToSize != 3 || strings.Contains(s.Message, "grown") || !s.Since.Equal(three.LastResize) {
		t.Errorf("a's status once it runs as placed: %+v; want Running at 3 since the grow, not the grow's message", s)
	}
	if again := commit(policy.Decision{Now: t0.Add(3 * time.Minute), Allocations: []api.Allocation{three},
		Reasons: []policy.Reason{{Job: "a", Team: "t", Kind: policy.KindRunning, FromSize: 3, ToSize: 3, Message: "running on 3 nodes"}}}); len(again) != 0 {
		t.Errorf("the same decision again writes %v", again)
	}
}

// A status record that cannot be read, with no good version, is replaced
// when a coordinator reads the fleet (here: deleted, the job running as
// admitted) rather than left for every reader to trip on.
func TestAnUnreadableStatusIsRepaired(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	first, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { New(cli, Config{Engine: policy.Config{MinStablePeriod: -1}}).Run(first); close(done) }()
	if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "j", Team: "a", PerNode: policy.Resources{Accelerators: 16}, MinNodes: 1, MaxNodes: 1}}); err != nil {
		t.Fatal(err)
	}
	waitTarget(t, ctx, cli, "j", "1")
	stop()
	<-done
	if _, err := cli.Put(ctx, st.Keys.Status("j"), "{not a status"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Status(ctx, "j"); err == nil {
		t.Fatal("an unreadable status record reads as a status")
	}
	runCoordinator(t, ctx, New(cli, Config{Engine: policy.Config{MinStablePeriod: -1}}))
	until(t, "the unreadable status gone and j read as Running", func() bool {
		s, err := st.Status(ctx, "j")
		return err == nil && s.Kind == policy.KindRunning
	})
	if rec, err := st.StatusRecord(ctx, "j"); err != nil || rec != nil {
		t.Errorf("j's status record: %+v %v; want none", rec, err)
	}
}

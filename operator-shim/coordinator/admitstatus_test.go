package coordinator

import (
	"errors"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

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

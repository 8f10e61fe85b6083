package coordinator

import (
	"testing"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// An admission writes the job's status once: from the start it says
// Running at the job's size, and the Admitted decision is the job's event.
// Before, the status said Admitted and the next cycle that decided the job
// again (its follow-up, or the cycle of the next input) rewrote it as
// Running: 500 of a 20,000-node churn round's 4,300 writes (issue 27).
// etcd's version of each status key counts the writes.
func TestAnAdmissionWritesItsStatusOnce(t *testing.T) {
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
	for _, name := range []string{"first", "second"} {
		r, err := cli.Get(ctx, st.Keys.Status(name))
		if err != nil || len(r.Kvs) != 1 {
			t.Fatalf("%s's status: %v %v", name, r, err)
		}
		s, err := fleet.DecodeStatus(string(r.Kvs[0].Key), r.Kvs[0].Value)
		if err != nil {
			t.Fatal(err)
		}
		if v := r.Kvs[0].Version; v != 1 || s.Kind != policy.KindRunning || s.ToSize != 1 {
			t.Errorf("%s's status was written %d times and says %s at %d node(s); want once, Running at 1", name, v, s.Kind, s.ToSize)
		}
		evs, _, err := st.Events(ctx, name)
		if err != nil || len(evs) != 1 || evs[0].Kind != policy.KindAdmitted {
			t.Errorf("%s's events: %+v %v; want its admission", name, evs, err)
		}
	}
}

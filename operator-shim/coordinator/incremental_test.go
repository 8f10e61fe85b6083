package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// The write diff visits only the jobs whose decision changed since the
// last cycle. Over random sequences of changes (submits, finishes,
// deletes, resubmits under the same name, spec edits, suspensions, quota
// changes, nodes lost and back) every cycle's diff is checked against a
// full comparison of the decision with the view (TestMain turns that on:
// a miss panics), and at the end a coordinator that reads etcd afresh
// finds nothing to write: what the incremental diffs wrote is what a
// full one would have.
func TestIncrementalWritesEqualAFullDiff(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { incrementalRun(t, seed) })
	}
}

func incrementalRun(t *testing.T, seed uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, cli := etcdtest.Start(t)
	st := fleet.New(cli, "")
	k := st.Keys
	rng := rand.New(rand.NewPCG(seed, 11))
	const flavor = "trainium2"
	lease, err := cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	putNode := func(i int) { putNeuronNode(t, ctx, cli, st, flavor, i, lease.ID) }
	const nodes = 8
	for i := 0; i < nodes; i++ {
		putNode(i)
	}
	team := func(name string, nominal int, preempt bool) {
		tm := policy.Team{Name: name, Cohort: "all", Quotas: []policy.FlavorQuota{{Flavor: flavor, Nominal: nominal}}}
		if preempt {
			tm.Preemption = policy.PreemptLowerPriority
		}
		if err := st.PutTeam(ctx, tm); err != nil {
			t.Fatal(err)
		}
	}
	team("a", 24, true)
	team("b", 24, false)
	team("c", 16, true)
	teams := []string{"a", "b", "c"}
	var cc cycleCounter
	c := New(cli, Config{Debounce: 5 * time.Millisecond, Resync: 100 * time.Millisecond, Engine: policy.Config{MinStablePeriod: -1}, OnCycle: cc.observe,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	defer func() { stop(); <-done }()

	specs := map[string]fleet.JobSpec{} // submitted and not deleted
	id := 0
	newSpec := func(name string) fleet.JobSpec {
		p := rng.IntN(10)
		j := policy.Job{Name: name, Team: teams[rng.IntN(len(teams))], Priority: &p, PerNode: policy.Resources{Accelerators: 1 + rng.IntN(8)}}
		if rng.IntN(3) == 0 {
			j.PerNode.Accelerators = 8
			j.MinNodes = 1 + rng.IntN(2)
			j.MaxNodes = j.MinNodes + rng.IntN(3)
			j.Elastic = j.MaxNodes > j.MinNodes
		}
		return fleet.JobSpec{Job: j, Run: fleet.RunSpec{Script: "train.py"}}
	}
	putSpec := func(s fleet.JobSpec) {
		raw, _ := json.Marshal(s)
		if _, err := cli.Put(ctx, k.Spec(s.Team, s.Name), string(raw)); err != nil {
			t.Fatal(err)
		}
	}
	pick := func() (string, bool) {
		if len(specs) == 0 {
			return "", false
		}
		names := make([]string, 0, len(specs))
		for n := range specs {
			names = append(names, n)
		}
		slices.Sort(names)
		return names[rng.IntN(len(names))], true
	}
	var deleted []string
	down := map[int]bool{}
	for step := 0; step < 60; step++ {
		n0, _ := cc.get()
		switch x := rng.IntN(10); {
		case x < 4 || len(specs) == 0:
			id++
			s := newSpec(fmt.Sprintf("j%03d", id))
			if err := st.SubmitJob(ctx, s); err != nil {
				t.Fatal(err)
			}
			specs[s.Name] = s
		case x == 4:
			if name, ok := pick(); ok {
				if err := st.MarkFinished(ctx, name, fleet.Finish{Outcome: fleet.Succeeded, Node: "n00", Time: time.Now()}); err != nil {
					t.Fatal(err)
				}
			}
		case x == 5:
			if name, ok := pick(); ok {
				if err := st.DeleteJob(ctx, name); err != nil {
					t.Fatal(err)
				}
				delete(specs, name)
				deleted = append(deleted, name)
			}
		case x == 6 && len(deleted) > 0:
			// The same name again: its old records are forgotten.
			s := newSpec(deleted[0])
			if err := st.SubmitJob(ctx, s); err == nil {
				specs[s.Name] = s
				deleted = deleted[1:]
			}
		case x == 7:
			if name, ok := pick(); ok {
				s := specs[name]
				if rng.IntN(2) == 0 {
					s.Suspended = !s.Suspended
				} else if s.MaxNodes > 1 {
					s.MaxNodes--
				}
				specs[name] = s
				putSpec(s)
			}
		case x == 8:
			team(teams[rng.IntN(len(teams))], 8*rng.IntN(5), rng.IntN(2) == 0)
		default:
			i := rng.IntN(nodes)
			if down[i] {
				putNode(i)
			} else if _, err := cli.Delete(ctx, k.Node(fmt.Sprintf("n%02d", i))); err != nil {
				t.Fatal(err)
			}
			down[i] = !down[i]
		}
		until(t, "a cycle after the change", func() bool { n, _ := cc.get(); return n > n0 })
	}
	// Settled: a last job, suspended, is decided (the spec watch caught
	// up), and five cycles in a row (the resync runs one every 100ms)
	// wrote nothing.
	last := newSpec("zz-last")
	last.Suspended = true
	if err := st.SubmitJob(ctx, last); err != nil {
		t.Fatal(err)
	}
	until(t, "the coordinator settles", func() bool { return cc.settled("zz-last", 5) })
	stop()
	<-done
	fresh := New(cli, Config{Engine: policy.Config{MinStablePeriod: -1}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := fresh.reload(ctx); err != nil {
		t.Fatal(err)
	}
	s, _ := fresh.view.state(time.Now(), fresh.cfg.Engine)
	units, _, _, _ := fresh.writes(policy.Schedule(s))
	var keys []string
	for _, u := range units {
		for _, op := range u {
			keys = append(keys, string(op.KeyBytes()))
		}
	}
	if len(keys) > 0 {
		t.Errorf("a coordinator reading etcd afresh would write %d records the running one left out: %v", len(keys), keys)
	}
	if len(specs) < 3 {
		t.Errorf("the sequence left %d jobs: too few to say much", len(specs))
	}
}

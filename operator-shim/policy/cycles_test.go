package policy

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// took records "victim<-beneficiary" from a decision.
func took(d Decision, into map[[2]string]time.Time, now time.Time) {
	for _, r := range d.Reasons {
		if r.Kind != KindShrunk && r.Kind != KindPreempted {
			continue
		}
		for _, b := range r.For {
			if _, ok := into[[2]string{r.Job, b}]; !ok {
				into[[2]string{r.Job, b}] = now
			}
		}
	}
}

// No thrash, steady demand: two teams both wanting more than the fleet
// settle within a few cycles and then nothing is resized or preempted again.
func TestNoThrashUnderSteadyOverload(t *testing.T) {
	a, b := mkTeam("a", 64), mkTeam("b", 64)
	a.Preemption, b.Preemption = PreemptLowerPriority, PreemptLowerPriority
	var jobs []Job
	for i := 0; i < 6; i++ {
		jobs = append(jobs,
			job(fmt.Sprintf("a-el%d", i), "a", 10+10*i, 1, 6, true),
			job(fmt.Sprintf("b-el%d", i), "b", 60-10*i, 1, 6, true),
			frac(fmt.Sprintf("a-f%d", i), "a", 30, 2+i%3),
			frac(fmt.Sprintf("b-f%d", i), "b", 30, 1+i%4))
	}
	e := newEnv(t, mkNodes("n", 16, 8), []Team{a, b}, jobs...)
	pairs := map[[2]string]time.Time{}
	changes := 0
	for c := 0; c < 300; c++ {
		d := e.cycle()
		took(d, pairs, e.st.Now)
		for _, r := range d.Reasons {
			switch r.Kind {
			case KindShrunk, KindPreempted, KindGrown, KindAdmitted:
				if c >= 10 {
					changes++
					t.Errorf("cycle %d: %s %s: %s", c, r.Job, r.Kind, r.Message)
				}
			}
		}
		if changes > 5 {
			t.FailNow()
		}
	}
	for p := range pairs {
		if _, ok := pairs[[2]string{p[1], p[0]}]; ok {
			t.Fatalf("%s and %s took capacity from each other", p[0], p[1])
		}
	}
}

// No thrash, churn: jobs of three teams arrive and finish at random over
// 600 cycles (three seeds). A job never takes capacity back from a job that
// took capacity from it while that job still holds the allocation it got
// that way, and no job grows twice within the stable period (shrinks come
// only from reclaim and priority preemption).
func TestNoThrashUnderChurn(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { churn(t, seed, 600) })
	}
}

func churn(t *testing.T, seed uint64, cycles int) {
	rng := rand.New(rand.NewPCG(seed, 2))
	teams := []Team{mkTeam("a", 48), mkTeam("b", 48), mkTeam("c", 32)}
	teams[0].Weight = 2
	teams[1].Preemption = PreemptLowerPriority
	e := newEnv(t, mkNodes("n", 16, 8), teams)
	pairs := map[[2]string]time.Time{}
	// epochs[{victim, beneficiary}] = the beneficiary's allocation Since.
	epochs := map[[2]string]time.Time{}
	prevSince := map[string]time.Time{}
	finish := map[string]int{}
	lastGrow := map[string]time.Time{}
	id := 0
	for c := 0; c < cycles; c++ {
		for k := rng.IntN(3); k > 0; k-- {
			tm := teams[rng.IntN(len(teams))].Name
			name := fmt.Sprintf("%s-%d", tm, id)
			id++
			var j Job
			switch rng.IntN(3) {
			case 0:
				j = frac(name, tm, rng.IntN(100), 1<<rng.IntN(4))
			case 1:
				j = job(name, tm, rng.IntN(100), 1+rng.IntN(2), 0, false)
				j.MaxNodes = j.MinNodes
			default:
				j = job(name, tm, rng.IntN(100), 1, 2+rng.IntN(6), true)
			}
			e.add(j)
			finish[name] = 5 + rng.IntN(60)
		}
		d := e.cycle()
		took(d, pairs, e.st.Now)
		// A reversal: v takes from b while b still holds the allocation
		// (same Since) through which b took from v.
		for _, r := range d.Reasons {
			if r.Kind != KindShrunk && r.Kind != KindPreempted {
				continue
			}
			for _, b := range r.For {
				if since, ok := epochs[[2]string{b, r.Job}]; ok {
					if cur, ok := prevSince[r.Job]; ok && cur.Equal(since) {
						t.Fatalf("cycle %d: %s took capacity back from %s, which took it from %s with this allocation", c, b, r.Job, b)
					}
				}
			}
		}
		for _, r := range d.Reasons {
			if r.Kind != KindShrunk && r.Kind != KindPreempted {
				continue
			}
			for _, b := range r.For {
				if a, ok := d.Allocation(b); ok {
					epochs[[2]string{r.Job, b}] = a.Since
				}
			}
		}
		prevSince = map[string]time.Time{}
		for _, a := range d.Allocations {
			prevSince[a.Job] = a.Since
		}
		for _, r := range d.Reasons {
			if r.Kind == KindGrown {
				if lg, ok := lastGrow[r.Job]; ok && e.st.Now.Sub(lg) < DefaultMinStablePeriod {
					t.Fatalf("%s grew twice within the stable period", r.Job)
				}
				lastGrow[r.Job] = e.st.Now
			}
		}
		// Running jobs make progress; finished ones leave.
		for _, a := range d.Allocations {
			finish[a.Job]--
			if finish[a.Job] <= 0 {
				e.remove(a.Job)
			}
		}
	}
	if len(pairs) == 0 {
		t.Fatalf("scenario never reclaimed anything; it tests nothing")
	}
	reversed := 0
	for p := range pairs {
		if _, ok := pairs[[2]string{p[1], p[0]}]; ok {
			reversed++
		}
	}
	t.Logf("%d pairs took from each other only after losing the allocation to a third job", reversed/2)
	t.Logf("%d victim/beneficiary pairs, %d jobs", len(pairs), id)
}

// Deterministic: shuffled input gives the same decision.
func TestDeterministicOutput(t *testing.T) {
	st := bigState(400, 900, 12, 7)
	d1 := Schedule(st)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 3; i++ {
		s2 := st
		s2.Nodes = append([]Node(nil), st.Nodes...)
		s2.Jobs = append([]Job(nil), st.Jobs...)
		s2.Teams = append([]Team(nil), st.Teams...)
		rng.Shuffle(len(s2.Nodes), func(a, b int) { s2.Nodes[a], s2.Nodes[b] = s2.Nodes[b], s2.Nodes[a] })
		rng.Shuffle(len(s2.Jobs), func(a, b int) { s2.Jobs[a], s2.Jobs[b] = s2.Jobs[b], s2.Jobs[a] })
		rng.Shuffle(len(s2.Teams), func(a, b int) { s2.Teams[a], s2.Teams[b] = s2.Teams[b], s2.Teams[a] })
		d2 := Schedule(s2)
		if !reflect.DeepEqual(mustJSON(t, d1), mustJSON(t, d2)) {
			t.Fatalf("decision depends on input order")
		}
	}
	// And over a few cycles of its own output.
	st.Allocations = d1.Allocations
	st.Now = st.Now.Add(2 * time.Minute)
	checkInvariants(t, st, Schedule(st))
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// bigState builds a mixed fleet: n nodes of 8 GPUs, j jobs, t teams.
func bigState(n, j, t int, seed uint64) State {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	st := State{Now: t0}
	for i := 0; i < n; i++ {
		st.Nodes = append(st.Nodes, Node{Name: fmt.Sprintf("node-%05d", i), Flavor: h100, Accelerators: 8})
	}
	per := n * 8 / t
	for i := 0; i < t; i++ {
		tm := Team{Name: fmt.Sprintf("team-%03d", i), Cohort: fmt.Sprintf("c%d", i%3), Weight: float64(1 + i%3),
			Preemption: PreemptLowerPriority, Quotas: []FlavorQuota{{Flavor: h100, Nominal: per}}}
		st.Teams = append(st.Teams, tm)
	}
	for i := 0; i < j; i++ {
		tm := st.Teams[rng.IntN(t)].Name
		jb := Job{Name: fmt.Sprintf("job-%05d", i), Team: tm, Priority: ip(rng.IntN(100)), SubmitTime: t0.Add(time.Duration(i) * time.Second)}
		switch r := rng.IntN(10); {
		case r < 6:
			jb.PerNode.Accelerators = 1 << rng.IntN(4)
		case r < 8:
			jb.PerNode.Accelerators = 8
			jb.MinNodes = 1 + rng.IntN(4)
		default:
			jb.PerNode.Accelerators = 8
			jb.MinNodes, jb.MaxNodes, jb.Elastic = 1+rng.IntN(2), 4+rng.IntN(8), true
		}
		st.Jobs = append(st.Jobs, jb)
	}
	return st
}

// Invariants hold over random states and many cycles.
func TestRandomStatesKeepInvariants(t *testing.T) {
	for seed := uint64(0); seed < 20; seed++ {
		st := bigState(30+int(seed)*3, 80+int(seed)*10, 2+int(seed%5), seed)
		rng := rand.New(rand.NewPCG(seed, 99))
		for c := 0; c < 15; c++ {
			// Perturb: nodes fail, drain, recover; jobs suspend.
			for k := 0; k < 3; k++ {
				n := &st.Nodes[rng.IntN(len(st.Nodes))]
				switch rng.IntN(4) {
				case 0:
					n.Unhealthy = !n.Unhealthy
				case 1:
					n.Draining = !n.Draining
				case 2:
					n.UnhealthyAccelerators = rng.IntN(3)
				}
				st.Jobs[rng.IntN(len(st.Jobs))].Suspended = rng.IntN(4) == 0
			}
			d := Schedule(st)
			checkInvariants(t, st, d)
			st.Allocations = d.Allocations
			st.Now = st.Now.Add(30 * time.Second)
		}
	}
}

// Bad input never panics and is reported with the field and the fix.
func TestInvalidInputIsReportedNotPanicked(t *testing.T) {
	st := State{
		Now: t0,
		Nodes: []Node{
			{Name: "ok", Flavor: h100, Accelerators: 8},
			{Name: "", Flavor: h100, Accelerators: 8},
			{Name: "neg", Flavor: h100, Accelerators: -1},
			{Name: "ok", Flavor: h100, Accelerators: 8},
			{Name: "noflavor", Accelerators: 8},
		},
		Teams: []Team{
			{Name: "a", Quotas: []FlavorQuota{{Flavor: h100, Nominal: 8, LendingLimit: ip(9)}}},
			{Name: "b", Weight: -1, Preemption: "Sometimes", Quotas: []FlavorQuota{{Flavor: h100, Nominal: -3}, {Flavor: h100}}},
			{Name: "c", Quotas: []FlavorQuota{{Flavor: h100, Nominal: 8}}},
		},
		Jobs: []Job{
			{Name: "j0", Team: "c", PerNode: Resources{Accelerators: 0}},
			{Name: "j1", Team: "c", PerNode: Resources{Accelerators: 8}, MinNodes: 2, MaxNodes: 4},
			{Name: "j2", Team: "c", PerNode: Resources{Accelerators: 8}, MinNodes: 3, MaxNodes: 2, Elastic: true},
			{Name: "j3", Team: "c", PerNode: Resources{Accelerators: 8}, Sizes: []int{4, 2}, Elastic: true},
			{Name: "j4", Team: "c", PerNode: Resources{Accelerators: 8}, Priority: ip(150)},
			{Name: "j5", Team: "a", PerNode: Resources{Accelerators: 8}},
			{Name: "j6", Team: "c", PerNode: Resources{Accelerators: 4}, Step: -2},
		},
		Allocations: []Allocation{
			{Job: "ghost", Size: 1, Nodes: []string{"ok"}},
			{Job: "j6", Size: 3, Nodes: []string{"ok", "ok", "missing"}},
			{Job: "j6", Size: 1, Nodes: []string{"ok"}},
		},
	}
	d := Schedule(st)
	var lines []string
	for _, p := range d.Problems {
		lines = append(lines, p.Error)
	}
	text := strings.Join(lines, "\n")
	for _, want := range []string{
		`node "": name: must be set`,
		"accelerators: must be between 0 and 4096 (got -1)",
		"listed twice",
		"flavor: must be set",
		"lendingLimit: must be between 0 and nominal (8) (got 9)",
		"weight: must be a positive number",
		`preemption: must be "Never" or "LowerPriority"`,
		"quotas[0].nominal: must be >= 0",
		"quotas[1].flavor",
		"perNode.accelerators: must be between 1",
		"set maxNodes to it or set elastic: true",
		"maxNodes: must be >= minNodes (3) (got 2)",
		"sizes: must be ascending",
		"priority: must be 0-99 (got 150)",
		"step: must be >= 1",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("problems lack %q:\n%s", want, text)
		}
	}
	wantKind(t, d, "j0", KindInvalid, CodeInvalidSpec)
	wantKind(t, d, "j5", KindPending, CodeTeamNotFound)
	if len(d.Released) != 1 || d.Released[0] != "ghost" {
		t.Fatalf("released %v", d.Released)
	}
}

// FuzzSchedule: any state decoded from bytes schedules without panicking
// and keeps the invariants.
func FuzzSchedule(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add([]byte("hyperpodrun policy engine fuzz seed with more bytes"))
	f.Add([]byte{255, 0, 255, 0, 17, 200, 3, 3, 3, 9, 100, 2})
	f.Fuzz(func(t *testing.T, data []byte) {
		st := stateFromBytes(data)
		for c := 0; c < 3; c++ {
			d := Schedule(st)
			checkInvariants(t, st, d)
			st.Allocations = d.Allocations
			st.Now = st.Now.Add(time.Duration(int(byteAt(data, c))) * time.Second)
		}
	})
}

func byteAt(b []byte, i int) byte {
	if len(b) == 0 {
		return 0
	}
	return b[i%len(b)]
}

func stateFromBytes(b []byte) State {
	i := 0
	nx := func(m int) int { i++; return int(byteAt(b, i)) % m }
	st := State{Now: t0}
	st.Config.MinStablePeriod = time.Duration(nx(3)-1) * 30 * time.Second
	if nx(2) == 0 {
		st.Config.Queueing = StrictFIFO
	}
	flavors := []string{h100, "trainium2"}
	for k := nx(12); k > 0; k-- {
		st.Nodes = append(st.Nodes, Node{Name: fmt.Sprintf("n%d", nx(10)), Flavor: flavors[nx(2)], Accelerators: nx(10),
			UnhealthyAccelerators: nx(3), Draining: nx(5) == 0, Unhealthy: nx(6) == 0, VCPUs: nx(3) * 16})
	}
	for k := nx(4); k > 0; k-- {
		q := FlavorQuota{Flavor: flavors[nx(2)], Nominal: nx(40) - 2}
		if nx(2) == 0 {
			q.BorrowingLimit = ip(nx(20))
		}
		if nx(2) == 0 {
			q.LendingLimit = ip(nx(20))
		}
		st.Teams = append(st.Teams, Team{Name: fmt.Sprintf("t%d", nx(4)), Cohort: fmt.Sprint(nx(2)),
			Weight: float64(nx(3)), Preemption: []PreemptionPolicy{"", PreemptNever, PreemptLowerPriority}[nx(3)], Quotas: []FlavorQuota{q}})
	}
	for k := nx(16); k > 0; k-- {
		j := Job{Name: fmt.Sprintf("j%d", nx(20)), Team: fmt.Sprintf("t%d", nx(5)), Priority: ip(nx(110) - 5),
			PerNode: Resources{Accelerators: nx(10), VCPUs: nx(3) * 8}, MinNodes: nx(4), MaxNodes: nx(6), Step: nx(3),
			Elastic: nx(2) == 0, Suspended: nx(8) == 0, SubmitTime: t0.Add(time.Duration(nx(100)) * time.Second)}
		if nx(2) == 0 {
			j.Flavor = flavors[nx(2)]
		}
		if nx(6) == 0 {
			j.Sizes = []int{1 + nx(2), 3 + nx(3)}
		}
		st.Jobs = append(st.Jobs, j)
	}
	for k := nx(4); k > 0; k-- {
		a := Allocation{Job: fmt.Sprintf("j%d", nx(20)), Size: nx(3)}
		for m := nx(4); m > 0; m-- {
			a.Nodes = append(a.Nodes, fmt.Sprintf("n%d", nx(10)))
		}
		st.Allocations = append(st.Allocations, a)
	}
	return st
}

func TestJSONRoundTrip(t *testing.T) {
	in := `{"name":"a","cohort":"x","weight":2,"preemption":"LowerPriority",
	  "quotas":[{"flavor":"nvidia-h100-80gb","nominal":32,"borrowingLimit":8,"lendingLimit":16,"vcpus":512,"memory":"4Ti"}]}`
	var tm Team
	if err := json.Unmarshal([]byte(in), &tm); err != nil {
		t.Fatal(err)
	}
	if tm.Quotas[0].Memory != 4<<40 || *tm.Quotas[0].BorrowingLimit != 8 || tm.Validate() != nil {
		t.Fatalf("%+v", tm)
	}
	out := mustJSON(t, tm)
	if !strings.Contains(out, `"memory":"4Ti"`) {
		t.Fatalf("%s", out)
	}
	for s, want := range map[string]ByteSize{"1024": 1024, "512Mi": 512 << 20, "80G": 80e9, "1.5Gi": 3 << 29} {
		if got, err := ParseByteSize(s); err != nil || got != want {
			t.Fatalf("%s: %v %v", s, got, err)
		}
	}
	if _, err := ParseByteSize("lots"); err == nil || !strings.Contains(err.Error(), "64Gi") {
		t.Fatalf("err %v", err)
	}
	var b ByteSize
	if err := json.Unmarshal([]byte(`68719476736`), &b); err != nil || b != 64<<30 {
		t.Fatalf("%v %v", b, err)
	}
	d := Schedule(bigState(20, 40, 3, 1))
	var back Decision
	if err := json.Unmarshal([]byte(mustJSON(t, d)), &back); err != nil {
		t.Fatal(err)
	}
	if mustJSON(t, back) != mustJSON(t, d) {
		t.Fatalf("decision does not round-trip")
	}
}

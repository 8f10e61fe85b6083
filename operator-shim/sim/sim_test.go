package sim

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

const h100 = "nvidia-h100-80gb"

func TestGenerateIsHeliosShaped(t *testing.T) {
	o := GenOptions{Seed: 7, Jobs: 20000, Capacity: 256, Load: 1, ElasticFraction: 0.5,
		Teams: []TeamLoad{{Name: "a", Share: 2}, {Name: "b", Share: 1}}}
	tr := Generate(o)
	if len(tr) != 20000 {
		t.Fatalf("%d jobs", len(tr))
	}
	var gpus, durs []float64
	teams := map[string]int{}
	elastic := 0
	for i, j := range tr {
		if err := j.Validate(); err != nil {
			t.Fatal(err)
		}
		if i > 0 && j.Submit < tr[i-1].Submit {
			t.Fatalf("not in submission order")
		}
		g := float64(j.GPUsPerNode * j.StaticNodes())
		gpus = append(gpus, g)
		durs = append(durs, j.Work/g)
		teams[j.Team]++
		if j.Elastic {
			elastic++
			if j.MinNodes != max(1, j.Nodes/2) || j.MaxNodes != 2*j.Nodes {
				t.Fatalf("elastic bounds %+v", j)
			}
		}
	}
	sort.Float64s(gpus)
	sort.Float64s(durs)
	mean := 0.0
	for _, g := range gpus {
		mean += g
	}
	mean /= float64(len(gpus))
	if med := gpus[len(gpus)/2]; med != 1 || mean < 3.3 || mean > 4.1 {
		t.Fatalf("GPUs median %v mean %.2f, want 1 and ~3.7", med, mean)
	}
	if med := durs[len(durs)/2]; med < 170 || med > 235 {
		t.Fatalf("median duration %.0f s, want ~200", med)
	}
	if mx := durs[len(durs)-1]; mx > 3*86400+1 || mx < 86400 {
		t.Fatalf("longest job %.0f s: want a tail of days, capped at 3", mx)
	}
	if r := float64(teams["a"]) / float64(teams["b"]); r < 1.8 || r > 2.2 {
		t.Fatalf("team ratio %.2f", r)
	}
	if elastic == 0 {
		t.Fatalf("no elastic jobs")
	}
	if !reflect.DeepEqual(tr[:50], Generate(o)[:50]) {
		t.Fatalf("same seed, different trace")
	}
	o.Seed = 8
	if reflect.DeepEqual(tr[:50], Generate(o)[:50]) {
		t.Fatalf("different seed, same trace")
	}
}

func TestTraceFormatsRoundTrip(t *testing.T) {
	tr := Generate(GenOptions{Seed: 1, Jobs: 200, ElasticFraction: 0.5, Teams: []TeamLoad{{Name: "a", Share: 1}}})
	var jl, cs bytes.Buffer
	if err := WriteJSONL(&jl, tr); err != nil {
		t.Fatal(err)
	}
	if err := WriteCSV(&cs, tr); err != nil {
		t.Fatal(err)
	}
	for name, buf := range map[string][]byte{"jsonl": jl.Bytes(), "csv": cs.Bytes()} {
		got, err := ReadTrace(bytes.NewReader(buf), "", name) // sniffed
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, tr) {
			t.Fatalf("%s: round trip differs: %+v vs %+v", name, got[0], tr[0])
		}
	}
}

func TestTraceErrorsNameLineAndField(t *testing.T) {
	for _, c := range []struct{ in, format, want string }{
		{"name,team,submit,gpus_per_node,work\na,t,1,8,100\nb,t,2,eight,100\n", "csv", "t.csv:3: column gpus_per_node: invalid number \"eight\""},
		{"name,team,submit,gpus,work\n", "csv", "t.csv:1: unknown column \"gpus\""},
		{"name,team,submit,work\n", "csv", "missing required column \"gpus_per_node\""},
		{"name,team,submit,gpus_per_node,work,elastic\na,t,1,8,100,maybe\n", "csv", "t.csv:2: column elastic: want true or false"},
		{"name,team,submit,gpus_per_node,work\na,t,1,8,0\n", "csv", "job 1 (\"a\"): work: must be > 0"},
		{"name,team,submit,gpus_per_node,work\na,t,1,8,10\na,t,2,8,10\n", "csv", "name \"a\" already used by job 1"},
		{"{\"name\":\"a\",\"team\":\"t\",\"submit\":1,\"gpusPerNode\":8,\"work\":5}\n\n{\"name\":\"b\",\"gpus\":3}\n", "jsonl", "t.csv:3: json: unknown field \"gpus\""},
	} {
		_, err := ReadTrace(strings.NewReader(c.in), c.format, "t.csv")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want %q", c.in, err, c.want)
		}
	}
}

const teamsYAML = `# two teams
teams:
- name: research
  cohort: lab
  weight: 2
  preemption: LowerPriority
  quotas:
  - flavor: nvidia-h100-80gb
    nominal: 16
    borrowingLimit: 16
    memory: 2Ti
- name: product
  cohort: lab
  quotas:
  - flavor: nvidia-h100-80gb
    nominal: 16
fleet:
- flavor: nvidia-h100-80gb
  nodes: 4
  acceleratorsPerNode: 8
config:
  minStablePeriod: 30s
`

func TestParseTeams(t *testing.T) {
	tf, err := ParseTeams([]byte(teamsYAML), "teams.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(tf.Teams) != 2 || tf.Teams[0].Weight != 2 || *tf.Teams[0].Quotas[0].BorrowingLimit != 16 ||
		tf.Teams[0].Quotas[0].Memory != 2<<40 || tf.Config.MinStablePeriod.Seconds() != 30 || len(BuildFleet(tf.Fleet)) != 4 {
		t.Fatalf("%+v", tf)
	}
	// A bare list works too.
	if tf, err := ParseTeams([]byte("- name: a\n  quotas: [{flavor: x, nominal: 8}]\n"), "l.yaml"); err != nil || tf.Teams[0].Name != "a" {
		t.Fatalf("%v %+v", err, tf)
	}
	for _, c := range []struct{ in, want string }{
		{strings.Replace(teamsYAML, "nominal: 16\nfleet", "nominal: -4\nfleet", 1), "teams.yaml:12: team \"product\": quotas[0].nominal: must be >= 0"},
		{strings.Replace(teamsYAML, "weight: 2", "wieght: 2", 1), "line 5: field wieght not found"},
		{strings.Replace(teamsYAML, "name: product", "name: research", 1), "teams.yaml:12: team \"research\" already defined at line 3"},
		{strings.Replace(teamsYAML, "LowerPriority", "Sometimes", 1), "teams.yaml:3: team \"research\": preemption: must be \"Never\" or \"LowerPriority\""},
		{strings.Replace(teamsYAML, "memory: 2Ti", "memory: lots", 1), "invalid memory size \"lots\""},
		{"teams: 3\n", "teams.yaml"},
		{"", "empty file"},
	} {
		_, err := ParseTeams([]byte(c.in), "teams.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}

func twoTeams() []policy.Team {
	return []policy.Team{
		{Name: "a", Quotas: []policy.FlavorQuota{{Flavor: h100, Nominal: 16}}},
		{Name: "b", Quotas: []policy.FlavorQuota{{Flavor: h100, Nominal: 16}}},
	}
}

// The demo scenario in virtual time: a's elastic job grows into b's idle
// quota, b's job takes it back (shrink, restart delay), a grows back when b
// finishes; sizes, reclaim latency and work accounting are exact.
func TestRunLendReclaimGrowBack(t *testing.T) {
	trace := []TraceJob{
		{Name: "a-el", Team: "a", Submit: 0, GPUsPerNode: 8, Nodes: 2, MinNodes: 1, MaxNodes: 4, Elastic: true, Work: 32 * 1000},
		{Name: "b-1", Team: "b", Submit: 100, GPUsPerNode: 8, Nodes: 2, Work: 16 * 200},
	}
	var sizes []string
	rep, err := Run(trace, Options{Teams: twoTeams(), Config: policy.Config{MinStablePeriod: -1}, OnCycle: func(t float64, d *policy.Decision) {
		for _, r := range d.Reasons {
			if r.FromSize != r.ToSize {
				sizes = append(sizes, r.Job+":"+string(r.Kind))
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a-el:Admitted", "a-el:Shrunk", "b-1:Admitted", "a-el:Grown"}
	if !reflect.DeepEqual(sizes, want) {
		t.Fatalf("events %v, want %v", sizes, want)
	}
	if rep.Completed != 2 || rep.Shrinks != 1 || rep.Grows != 1 || rep.Preemptions != 0 {
		t.Fatalf("%+v", rep)
	}
	// b waited for a's checkpoint: 15 s.
	if rep.ReclaimMax != 15 || rep.Teams[1].ReclaimMax != 15 {
		t.Fatalf("reclaim max %v", rep.ReclaimMax)
	}
	// a: 4 nodes for 100 s (3,200 GPU-s), 2 nodes while b runs (15 s delay
	// + 200 s), then 4 nodes again after a 15 s restart: finishes at
	// 100 + 215 + 15 + (32000-3200-3200)/32 = 1130 s.
	if math.Abs(rep.Makespan-1130) > 1e-6 {
		t.Fatalf("makespan %v, want 1130", rep.Makespan)
	}
	tbl := rep.Table()
	for _, s := range []string{"RECLAIM MAX", "mode engine", "a ", "b "} {
		if !strings.Contains(tbl, s) {
			t.Fatalf("table lacks %q:\n%s", s, tbl)
		}
	}
	var back Report
	b, _ := json.Marshal(rep)
	if err := json.Unmarshal(b, &back); err != nil || back.Teams[0].Team != "a" {
		t.Fatalf("%v %s", err, b)
	}
}

// FIFO: static sizes, no lending: a runs at its static 2 nodes only and b's
// quota idles while b has nothing to run.
func TestRunFIFOBaseline(t *testing.T) {
	trace := []TraceJob{
		{Name: "a-el", Team: "a", Submit: 0, GPUsPerNode: 8, Nodes: 2, MinNodes: 1, MaxNodes: 4, Elastic: true, Work: 16 * 1000},
		{Name: "a-2", Team: "a", Submit: 1, GPUsPerNode: 8, Nodes: 2, Work: 16 * 1000},
		{Name: "a-3", Team: "a", Submit: 2, GPUsPerNode: 4, Nodes: 1, Work: 4 * 10},
	}
	fifo, err := Run(trace, Options{Mode: ModeFIFO, Teams: twoTeams(), WindowStart: 0, WindowEnd: 2000})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := Run(trace, Options{Teams: twoTeams(), WindowStart: 0, WindowEnd: 2000})
	if err != nil {
		t.Fatal(err)
	}
	// FIFO: a-el [0,1000), a-2 waits (strict FIFO, quota full) [1000,2000),
	// a-3 behind it: makespan 2000+10.
	if math.Abs(fifo.Makespan-2010) > 1e-6 || fifo.Teams[0].WaitP95 < 990 {
		t.Fatalf("fifo makespan %v waits %v", fifo.Makespan, fifo.Teams[0].WaitP95)
	}
	if !(eng.Utilization > fifo.Utilization) || eng.Makespan >= fifo.Makespan {
		t.Fatalf("engine %.1f%% %vs vs fifo %.1f%% %vs", eng.Utilization, eng.Makespan, fifo.Utilization, fifo.Makespan)
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	if _, err := Run([]TraceJob{{Name: "x", Team: "ghost", GPUsPerNode: 1, Work: 1}}, Options{Teams: twoTeams()}); err == nil || !strings.Contains(err.Error(), "ghost") {
		t.Fatalf("err %v", err)
	}
	if _, err := Run(nil, Options{}); err == nil {
		t.Fatalf("no teams accepted")
	}
	if _, err := Run(nil, Options{Teams: twoTeams(), Mode: "lifo"}); err == nil {
		t.Fatalf("bad mode accepted")
	}
}

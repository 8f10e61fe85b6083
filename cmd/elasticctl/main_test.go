package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"gopkg.in/yaml.v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

func ctl(t *testing.T, ep string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append([]string{"elasticctl", "--etcd-endpoints", ep}, args...), &out, &errb)
	return out.String(), errb.String(), code
}

func writeFile(t *testing.T, name, body string) string {
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const teamsYAML = `teams:
- name: research
  weight: 1
  quotas:
  - flavor: nvidia-h100-80gb
    nominal: 16
- name: prod
  weight: 1
  preemption: LowerPriority
  quotas:
  - flavor: nvidia-h100-80gb
    nominal: 16
`

const elasticJob = `name: sweep
team: research
priorityClass: low
flavor: nvidia-h100-80gb
perNode: {accelerators: 8}
minNodes: 1
maxNodes: 4
elastic: true
run:
  script: train.py
`

const prodJob = `name: serve-train
team: prod
priorityClass: high
flavor: nvidia-h100-80gb
perNode: {accelerators: 8}
minNodes: 2
maxNodes: 2
run:
  script: train.py
`

func TestSubmitGrowReclaimDescribeResize(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, cli := etcdtest.Start(t)
	ep := srv.Endpoints[0]
	for i := 0; i < 4; i++ {
		inv := api.Inventory{Node: fmt.Sprintf("node-%d", i), State: api.StateReady, Flavor: "nvidia-h100-80gb", VCPUs: 96}
		for g := 0; g < 8; g++ {
			inv.Accelerators = append(inv.Accelerators, api.Accelerator{Kind: api.KindNVIDIA, Index: g, Flavor: "nvidia-h100-80gb", Healthy: true})
		}
		etcdtest.RegisterNode(t, cli, inv)
	}
	if out, errs, code := ctl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML)); code != 0 || !strings.Contains(out, "team/prod created") {
		t.Fatalf("apply: %d %s %s", code, out, errs)
	}
	coord := coordinator.New(cli, coordinator.Config{Engine: policy.Config{MinStablePeriod: -1}, Resync: 100 * time.Millisecond})
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { coord.Run(cctx); close(done) }()
	defer func() { stop(); <-done }()

	waitJob := func(what string, cond func(string) bool) string {
		t.Helper()
		var out string
		testutil.Eventually(t, 20*time.Second, what, func() (bool, string) {
			out, _, _ = ctl(t, ep, "get", "jobs")
			return cond(out), "\n" + out
		})
		return out
	}
	if _, errs, code := ctl(t, ep, "submit", "-f", writeFile(t, "sweep.yaml", elasticJob)); code != 0 {
		t.Fatalf("submit: %s", errs)
	}
	waitJob("the elastic job to grow into all 4 idle nodes (borrowing)", func(o string) bool {
		return rowHas(o, "sweep", "4", "1:4")
	})
	if _, errs, code := ctl(t, ep, "submit", "-f", writeFile(t, "prod.yaml", prodJob)); code != 0 {
		t.Fatalf("submit: %s", errs)
	}
	waitJob("prod to take its quota back by shrinking sweep", func(o string) bool {
		return rowHas(o, "serve-train", "2", "2:2") && rowHas(o, "sweep", "2", "1:4")
	})
	out, _, _ := ctl(t, ep, "describe", "job", "sweep")
	for _, want := range []string{"Admitted sweep 0 -> 4", "Shrunk sweep 4 -> 2", "for serve-train of team prod", "reclaimed its nominal quota"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe job sweep lacks %q:\n%s", want, out)
		}
	}
	if out, _, _ := ctl(t, ep, "get", "teams"); !strings.Contains(out, "prod") || !strings.Contains(out, "16") {
		t.Errorf("get teams:\n%s", out)
	}
	if out, _, _ := ctl(t, ep, "get", "nodes", "-o", "json"); !strings.Contains(out, `"node-3"`) {
		t.Errorf("get nodes -o json:\n%s", out)
	}
	if _, errs, code := ctl(t, ep, "resize", "job", "sweep", "--max", "1"); code != 0 {
		t.Fatalf("resize: %s", errs)
	}
	waitJob("sweep to shrink to its new max", func(o string) bool { return rowHas(o, "sweep", "1", "1:1") })
	if _, errs, code := ctl(t, ep, "suspend", "sweep"); code != 0 {
		t.Fatal(errs)
	}
	waitJob("sweep suspended", func(o string) bool { return rowHas(o, "sweep", "Suspended", "0") })
	ctl(t, ep, "delete", "serve-train")
	ctl(t, ep, "resume", "sweep")
	ctl(t, ep, "resize", "job", "sweep", "--max", "4")
	waitJob("sweep to grow back when prod's capacity frees", func(o string) bool { return rowHas(o, "sweep", "4", "1:4") })
	if out, _, _ := ctl(t, ep, "events", "sweep"); !strings.Contains(out, "Shrunk sweep 4 -> 2") {
		t.Errorf("events lacks the reclaim:\n%s", out)
	}
}

// rowHas reports whether the table row of job contains every cell.
func rowHas(table, job string, cells ...string) bool {
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != job {
			continue
		}
		for _, c := range cells {
			found := false
			for _, x := range f {
				if x == c {
					found = true
				}
			}
			if !found {
				return false
			}
		}
		return true
	}
	return false
}

func TestBadYAMLNamesFileLineAndField(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"unknown.yaml", "name: x\nteam: t\nperNode: {accelerators: 1}\nmaxNode: 3\nrun: {script: a.py}\n", `unknown.yaml:4: unknown field "maxNode": did you mean "maxNodes"?`},
		{"type.yaml", "name: x\nteam: t\nperNode:\n  accelerators: lots\nrun: {script: a.py}\n", "type.yaml:4: perNode.accelerators: want a whole number, got a string (lots)"},
		{"range.yaml", "name: x\nteam: t\nperNode: {accelerators: 1}\nminNodes: 3\nmaxNodes: 2\nrun: {script: a.py}\n", `range.yaml:5: job "x": maxNodes: must be >= minNodes`},
		{"syntax.yaml", "name: x\n  team: : t\n", "syntax.yaml"},
		{"noscript.yaml", "name: x\nteam: t\nperNode: {accelerators: 1}\nrun: {}\n", "noscript.yaml:4: run.script"},
	} {
		// No etcd is needed: the file is checked before connecting.
		jobs, err := loadJobs(writeFile(t, tc.name, tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v (jobs %v), want an error containing %q", tc.name, err, jobs, tc.want)
		}
	}
	_, err := loadTeams(writeFile(t, "teams.yaml", "teams:\n- name: a\n  quotas:\n  - flavor: x\n    nominal: -3\n"))
	if err == nil || !strings.Contains(err.Error(), `teams.yaml:2: team "a": quotas[0].nominal: must be >= 0`) {
		t.Errorf("negative quota: %v", err)
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	for _, args := range [][]string{{"get", "pods"}, {"resize", "job", "x"}, {"--nope"}, {"describe", "job"}, {"get", "jobs", "-o", "xml"}} {
		if _, _, code := ctl(t, "127.0.0.1:1", args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

func TestSimulateGeneratedTrace(t *testing.T) {
	var trace, errb bytes.Buffer
	if code := run([]string{"elasticctl", "simulate", "generate", "--jobs", "200", "--capacity", "64", "--teams", "a,b"}, &trace, &errb); code != 0 {
		t.Fatalf("generate: %d %s", code, errb.String())
	}
	tp := writeFile(t, "trace.jsonl", trace.String())
	teams := writeFile(t, "teams.yaml", "teams:\n- name: a\n  quotas: [{flavor: nvidia-h100-80gb, nominal: 32}]\n- name: b\n  quotas: [{flavor: nvidia-h100-80gb, nominal: 32}]\nfleet:\n- flavor: nvidia-h100-80gb\n  nodes: 8\n  acceleratorsPerNode: 8\n")
	var out bytes.Buffer
	if code := run([]string{"elasticctl", "simulate", "--trace", tp, "--teams", teams, "-o", "json"}, &out, &errb); code != 0 {
		t.Fatalf("simulate: %d %s", code, errb.String())
	}
	var rep map[string]any
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("simulate -o json: %v\n%s", err, out.String())
	}
	out.Reset()
	run([]string{"elasticctl", "simulate", "--trace", tp, "--teams", teams}, &out, &errb)
	if !strings.Contains(out.String(), "utilization") || !strings.Contains(out.String(), "RECLAIM") {
		t.Errorf("table:\n%s", out.String())
	}
	if code := run([]string{"elasticctl", "simulate", "--trace", tp}, &out, &errb); code != 2 {
		t.Errorf("simulate without --teams: exit %d, want 2", code)
	}
}

// h100Node is a ready node with eight healthy H100s.
func h100Node(name string) api.Inventory {
	inv := api.Inventory{Node: name, State: api.StateReady, Flavor: "nvidia-h100-80gb", Flavors: []string{"nvidia-h100-80gb"}, VCPUs: 96}
	for g := 0; g < 8; g++ {
		inv.Accelerators = append(inv.Accelerators, api.Accelerator{Kind: api.KindNVIDIA, Index: g, Flavor: "nvidia-h100-80gb", Healthy: true})
	}
	return inv
}

func putNode(t *testing.T, cli *clientv3.Client, inv api.Inventory) {
	t.Helper()
	etcdtest.RegisterNode(t, cli, inv)
}

// startFleet starts etcd with n idle H100 nodes registered.
func startFleet(t *testing.T, n int) (string, *clientv3.Client) {
	t.Helper()
	srv, cli := etcdtest.Start(t)
	for i := 0; i < n; i++ {
		putNode(t, cli, h100Node(fmt.Sprintf("node-%d", i)))
	}
	return srv.Endpoints[0], cli
}

// startCoordinator runs a coordinator until the test ends.
// coordCycles counts the cycles of the coordinators startCoordinator runs
// (a steady coordinator writes nothing to etcd to count them by).
var coordCycles atomic.Int64

func startCoordinator(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	coord := coordinator.New(cli, coordinator.Config{Engine: policy.Config{MinStablePeriod: -1}, Resync: 100 * time.Millisecond,
		OnCycle: func(coordinator.CycleStats) { coordCycles.Add(1) }})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { coord.Run(ctx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
}

// waitFor polls cond until it holds, failing the test after 15 s with the
// last output cond saw.
func waitFor(t *testing.T, what string, cond func() (bool, string)) string {
	t.Helper()
	var last string
	testutil.Eventually(t, 15*time.Second, what, func() (bool, string) {
		var ok bool
		ok, last = cond()
		return ok, "\n" + last
	})
	return last
}

func mustCtl(t *testing.T, ep string, args ...string) string {
	t.Helper()
	out, errs, code := ctl(t, ep, args...)
	if code != 0 {
		t.Fatalf("elasticctl %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errs)
	}
	return out
}

// waitJobRow waits until `get jobs` shows job's row with every cell.
func waitJobRow(t *testing.T, ep, job string, cells ...string) string {
	t.Helper()
	return waitFor(t, fmt.Sprintf("job %s row with %v", job, cells), func() (bool, string) {
		out, _, _ := ctl(t, ep, "get", "jobs")
		return rowHas(out, job, cells...), out
	})
}

const soloTeam = `teams:
- name: solo
  weight: 2
  quotas:
  - flavor: nvidia-h100-80gb
    nominal: 16
    borrowingLimit: 0
`

const hogJob = `name: hog
team: solo
priorityClass: high
flavor: nvidia-h100-80gb
perNode: {accelerators: 8}
minNodes: 2
maxNodes: 2
run:
  script: train.py
`

const waiterJob = `name: waiter
team: solo
priorityClass: low
flavor: nvidia-h100-80gb
perNode: {accelerators: 8}
minNodes: 1
maxNodes: 1
run:
  script: eval.py
`

// startPendingFleet sets up 4 idle nodes and team solo (nominal 16, no
// borrowing) whose quota is entirely held by hog (2 nodes x 8), so waiter
// (1 node x 8) stays Pending although half the fleet is idle.
func startPendingFleet(t *testing.T) (string, *clientv3.Client) {
	t.Helper()
	ep, cli := startFleet(t, 4)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", soloTeam))
	startCoordinator(t, cli)
	mustCtl(t, ep, "submit", "-f", writeFile(t, "hog.yaml", hogJob))
	waitJobRow(t, ep, "hog", "2", "2:2")
	mustCtl(t, ep, "submit", "-f", writeFile(t, "waiter.yaml", waiterJob))
	waitJobRow(t, ep, "waiter", "Pending", "0", "1:1")
	return ep, cli
}

func TestDescribePendingJobNamesHolders(t *testing.T) {
	ep, _ := startPendingFleet(t)
	out := mustCtl(t, ep, "get", "jobs")
	if !rowHas(out, "waiter", "Pending", "BorrowingLimit") || strings.Contains(out, "borrowing limit") {
		t.Errorf("get jobs: waiter's REASON should be the short code BorrowingLimit:\n%s", out)
	}
	if out := mustCtl(t, ep, "get", "jobs", "-o", "wide"); !rowHas(out, "waiter", "Pending", "BorrowingLimit") || !strings.Contains(out, "borrowing limit") {
		t.Errorf("get jobs -o wide: waiter's MESSAGE should say the team is at its borrowing limit:\n%s", out)
	}
	out = mustCtl(t, ep, "describe", "job", "waiter")
	for _, re := range []string{
		`(?m)^Job:\s+waiter$`,
		`(?m)^Team:\s+solo$`,
		`(?m)^Size:\s+1\.\.1 nodes \(elastic: false\)$`,
		`(?m)^State:\s+Pending$`,
		`(?m)^Why:\s+team solo is at its borrowing limit: uses 16 of nominal 16 \+ borrowing limit 0 on nvidia-h100-80gb, the job needs 8 more`,
		`(?m)^Capacity held by:\n  hog of team solo: 16 accelerator\(s\)$`,
		`(?m)^History:\n  \d\d:\d\d:\d\d  Pending waiter: team solo is at its borrowing limit`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("describe job waiter does not match %s:\n%s", re, out)
		}
	}
	if strings.Contains(out, "(borrowing)") || strings.Contains(out, "Nodes:") {
		t.Errorf("describe job waiter: hog is within its quota and waiter holds no nodes:\n%s", out)
	}
	// The running job's describe names its nodes and no holders.
	out = mustCtl(t, ep, "describe", "job", "hog")
	if !regexp.MustCompile(`(?m)^Nodes:\s+node-\d, node-\d \(since `).MatchString(out) || strings.Contains(out, "Capacity held by") {
		t.Errorf("describe job hog:\n%s", out)
	}
	if !regexp.MustCompile(`Admitted hog 0 -> 2 nodes`).MatchString(out) {
		t.Errorf("describe job hog lacks its admission in History:\n%s", out)
	}
	// describe -o json carries the same explanation, machine-readably.
	var dj struct {
		Job struct {
			Status struct {
				Kind    string `json:"kind"`
				Code    string `json:"code"`
				Holders []struct {
					Job          string `json:"job"`
					Team         string `json:"team"`
					Accelerators int    `json:"accelerators"`
				} `json:"holders"`
			} `json:"status"`
		} `json:"job"`
		History []struct {
			Kind string `json:"kind"`
		} `json:"history"`
	}
	out = mustCtl(t, ep, "describe", "job", "waiter", "-o", "json")
	if err := json.Unmarshal([]byte(out), &dj); err != nil {
		t.Fatalf("describe job -o json: %v\n%s", err, out)
	}
	st := dj.Job.Status
	if st.Kind != "Pending" || st.Code != "BorrowingLimit" || len(st.Holders) != 1 || st.Holders[0].Job != "hog" || st.Holders[0].Team != "solo" || st.Holders[0].Accelerators != 16 || len(dj.History) == 0 {
		t.Errorf("describe job waiter -o json: %+v\n%s", dj, out)
	}
	if _, errs, code := ctl(t, ep, "describe", "job", "nope"); code != 1 || !strings.Contains(errs, `job "nope" not found`) {
		t.Errorf("describe job nope: exit %d, stderr %q", code, errs)
	}
}

func TestDescribeTeamShowsQuotaUsageAndJobs(t *testing.T) {
	ep, _ := startPendingFleet(t)
	usage := "Usage nvidia-h100-80gb: 16 of nominal 16 used (0 borrowed); 1 running, 1 pending (8 accelerators waiting)"
	out := waitFor(t, "the team's usage to count hog and waiter", func() (bool, string) {
		out, _, _ := ctl(t, ep, "describe", "team", "solo")
		return strings.Contains(out, usage), out
	})
	for _, re := range []string{
		`(?m)^Team:\s+solo$`,
		`(?m)^Cohort:\s+-$`,
		`(?m)^Weight:\s+2$`,
		`(?m)^Quota nvidia-h100-80gb: nominal 16, borrowing limit 0, lending limit none$`,
		`(?m)^` + regexp.QuoteMeta(usage) + `$`,
		`(?m)^Jobs:$`,
		`(?m)^  hog\s+(Admitted|Running)\s+2 node\(s\)$`,
		`(?m)^  waiter\s+Pending\s+0 node\(s\)$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("describe team solo does not match %s:\n%s", re, out)
		}
	}
	// -o yaml gives the team's definition.
	out = mustCtl(t, ep, "describe", "team", "solo", "-o", "yaml")
	var team struct {
		Name   string  `yaml:"name"`
		Weight float64 `yaml:"weight"`
		Quotas []struct {
			Flavor         string `yaml:"flavor"`
			Nominal        int    `yaml:"nominal"`
			BorrowingLimit *int   `yaml:"borrowingLimit"`
		} `yaml:"quotas"`
	}
	if err := yaml.Unmarshal([]byte(out), &team); err != nil {
		t.Fatalf("describe team -o yaml: %v\n%s", err, out)
	}
	if team.Name != "solo" || team.Weight != 2 || len(team.Quotas) != 1 || team.Quotas[0].Nominal != 16 || team.Quotas[0].BorrowingLimit == nil || *team.Quotas[0].BorrowingLimit != 0 {
		t.Errorf("describe team -o yaml: %+v\n%s", team, out)
	}
	if _, errs, code := ctl(t, ep, "describe", "team", "nope"); code != 1 || !strings.Contains(errs, `team "nope"`) || !strings.Contains(errs, "not found") {
		t.Errorf("describe team nope: exit %d, stderr %q", code, errs)
	}
}

func TestDescribeNodeShowsInventory(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	ep := srv.Endpoints[0]
	inv := api.Inventory{Node: "gpu-7", State: api.StateDraining, Flavor: "nvidia-h100-80gb", Flavors: []string{"nvidia-h100-80gb"},
		VCPUs: 192, MemoryBytes: 2 << 40, NVIDIADriver: "550.54.15", Reasons: []string{"no Neuron driver: /sys/class/neuron_device is missing"}}
	for g := 0; g < 2; g++ {
		inv.Accelerators = append(inv.Accelerators, api.Accelerator{Kind: api.KindNVIDIA, Index: g, Name: "NVIDIA H100 80GB HBM3",
			Flavor: "nvidia-h100-80gb", UUID: fmt.Sprintf("GPU-%d", g), PCIBusID: fmt.Sprintf("00000000:0%d:00.0", g+7), MemoryBytes: 80 << 30, Healthy: g == 0})
	}
	inv.Accelerators[1].HealthReason = "XID 79: fallen off the bus"
	putNode(t, cli, inv)
	putNode(t, cli, h100Node("gpu-8"))

	out := mustCtl(t, ep, "describe", "node", "gpu-7")
	for _, re := range []string{
		`(?m)^Node gpu-7  flavor nvidia-h100-80gb  vCPUs 192  memory 2 TiB  state draining  NVIDIA driver 550\.54\.15$`,
		`(?m)^KIND\s+INDEX\s+NAME\s+FLAVOR\s+MEMORY`,
		`(?m)^GPU\s+0\s+NVIDIA H100 80GB HBM3\s+nvidia-h100-80gb\s+80 GiB\s.*00000000:07:00\.0\s+GPU-0\s.*healthy$`,
		`(?m)^GPU\s+1\s+NVIDIA H100 80GB HBM3\s+nvidia-h100-80gb\s+80 GiB\s.*GPU-1\s.*UNHEALTHY: XID 79: fallen off the bus$`,
		`(?m)^note: no Neuron driver: /sys/class/neuron_device is missing$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("describe node gpu-7 does not match %s:\n%s", re, out)
		}
	}
	if strings.Contains(out, "gpu-8") {
		t.Errorf("describe node gpu-7 shows another node:\n%s", out)
	}
	out = mustCtl(t, ep, "describe", "node", "gpu-7", "-o", "json")
	var got api.Inventory
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("describe node -o json: %v\n%s", err, out)
	}
	if got.Node != "gpu-7" || got.State != api.StateDraining || len(got.Accelerators) != 2 || got.Accelerators[1].Healthy || got.Accelerators[1].HealthReason != inv.Accelerators[1].HealthReason {
		t.Errorf("describe node -o json: %+v", got)
	}
	if _, errs, code := ctl(t, ep, "describe", "node", "gpu-9"); code != 1 || !strings.Contains(errs, `node "gpu-9" not found`) {
		t.Errorf("describe node gpu-9: exit %d, stderr %q", code, errs)
	}
}

func TestGetJobsYAMLAndJSON(t *testing.T) {
	ep, _ := startPendingFleet(t)
	type view struct {
		Spec struct {
			Name          string `yaml:"name" json:"name"`
			Team          string `yaml:"team" json:"team"`
			PriorityClass string `yaml:"priorityClass" json:"priorityClass"`
			MinNodes      int    `yaml:"minNodes" json:"minNodes"`
			MaxNodes      int    `yaml:"maxNodes" json:"maxNodes"`
			PerNode       struct {
				Accelerators int `yaml:"accelerators" json:"accelerators"`
			} `yaml:"perNode" json:"perNode"`
			Run struct {
				Script string `yaml:"script" json:"script"`
			} `yaml:"run" json:"run"`
		} `yaml:"spec" json:"spec"`
		Allocation *struct {
			Size  int      `yaml:"size" json:"size"`
			Nodes []string `yaml:"nodes" json:"nodes"`
		} `yaml:"allocation" json:"allocation"`
		Status *struct {
			Kind    string `yaml:"kind" json:"kind"`
			Message string `yaml:"message" json:"message"`
			Holders []struct {
				Job string `yaml:"job" json:"job"`
			} `yaml:"holders" json:"holders"`
		} `yaml:"status" json:"status"`
	}
	check := func(format string, vs []view, raw string) {
		t.Helper()
		if len(vs) != 2 || vs[0].Spec.Name != "hog" || vs[1].Spec.Name != "waiter" {
			t.Fatalf("get jobs -o %s: want hog and waiter in name order, got %+v\n%s", format, vs, raw)
		}
		hog, waiter := vs[0], vs[1]
		if hog.Spec.Team != "solo" || hog.Spec.PriorityClass != "high" || hog.Spec.MinNodes != 2 || hog.Spec.MaxNodes != 2 || hog.Spec.PerNode.Accelerators != 8 || hog.Spec.Run.Script != "train.py" {
			t.Errorf("get jobs -o %s: hog spec %+v", format, hog.Spec)
		}
		if hog.Allocation == nil || hog.Allocation.Size != 2 || len(hog.Allocation.Nodes) != 2 {
			t.Errorf("get jobs -o %s: hog allocation %+v\n%s", format, hog.Allocation, raw)
		}
		if waiter.Spec.Run.Script != "eval.py" || waiter.Allocation != nil {
			t.Errorf("get jobs -o %s: waiter %+v\n%s", format, waiter, raw)
		}
		if waiter.Status == nil || waiter.Status.Kind != "Pending" || !strings.Contains(waiter.Status.Message, "borrowing limit") || len(waiter.Status.Holders) != 1 || waiter.Status.Holders[0].Job != "hog" {
			t.Errorf("get jobs -o %s: waiter status %+v\n%s", format, waiter.Status, raw)
		}
	}
	out := mustCtl(t, ep, "get", "jobs", "-o", "yaml")
	var yv []view
	if err := yaml.Unmarshal([]byte(out), &yv); err != nil {
		t.Fatalf("get jobs -o yaml is not YAML: %v\n%s", err, out)
	}
	if strings.HasPrefix(strings.TrimSpace(out), "[") || strings.HasPrefix(strings.TrimSpace(out), "{") {
		t.Errorf("get jobs -o yaml printed JSON:\n%s", out)
	}
	check("yaml", yv, out)

	out = mustCtl(t, ep, "get", "jobs", "-o", "json")
	var jv []view
	if err := json.Unmarshal([]byte(out), &jv); err != nil {
		t.Fatalf("get jobs -o json: %v\n%s", err, out)
	}
	check("json", jv, out)

	// get nodes lists the jobs allocated on each node.
	out = mustCtl(t, ep, "get", "nodes")
	if jv[0].Allocation != nil {
		for _, n := range jv[0].Allocation.Nodes {
			if !rowHas(out, n, "hog") {
				t.Errorf("get nodes: %s should list hog in JOBS:\n%s", n, out)
			}
		}
	}
	if strings.Count(out, "hog") != 2 || strings.Contains(out, "waiter") {
		t.Errorf("get nodes: hog holds exactly 2 nodes and waiter none:\n%s", out)
	}
	// describe node names the work placed on it.
	if jv[0].Allocation != nil {
		n := jv[0].Allocation.Nodes[0]
		if out := mustCtl(t, ep, "describe", "node", n); !regexp.MustCompile(`(?m)^Jobs:\s+hog \(team solo, 8 accelerator\(s\)\)$`).MatchString(out) {
			t.Errorf("describe node %s should list hog:\n%s", n, out)
		}
	}
}

func TestResizeMinAndNodes(t *testing.T) {
	ep, cli := startFleet(t, 4)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	startCoordinator(t, cli)
	mustCtl(t, ep, "submit", "-f", writeFile(t, "sweep.yaml", elasticJob))
	waitJobRow(t, ep, "sweep", "4", "1:4")
	st := fleet.New(cli, "")
	spec := func() fleet.JobSpec {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		j, err := st.Job(ctx, "sweep")
		if err != nil {
			t.Fatal(err)
		}
		return *j
	}
	resize := func(wantOut string, minN, maxN int, args ...string) {
		t.Helper()
		out := mustCtl(t, ep, append([]string{"resize", "job", "sweep"}, args...)...)
		if strings.TrimSpace(out) != wantOut {
			t.Errorf("resize %v printed %q, want %q", args, out, wantOut)
		}
		if j := spec(); j.MinNodes != minN || j.MaxNodes != maxN || !j.Elastic || j.Run.Script != "train.py" {
			t.Errorf("after resize %v the stored spec is %d..%d (elastic %v, script %q), want %d..%d", args, j.MinNodes, j.MaxNodes, j.Elastic, j.Run.Script, minN, maxN)
		}
	}
	resize("job/sweep resized to 2..4 nodes", 2, 4, "--min", "2")
	if out := mustCtl(t, ep, "get", "jobs", "-o", "json"); !strings.Contains(out, `"minNodes": 2`) || !strings.Contains(out, `"maxNodes": 4`) {
		t.Errorf("get jobs -o json after --min 2:\n%s", out)
	}

	// --nodes pins the job: min = max, and the coordinator shrinks it.
	resize("job/sweep resized to 3..3 nodes", 3, 3, "--nodes", "3")
	waitJobRow(t, ep, "sweep", "3", "3:3")
	if out := mustCtl(t, ep, "describe", "job", "sweep"); !strings.Contains(out, "Shrunk sweep 4 -> 3 nodes") {
		t.Errorf("describe job sweep lacks the shrink to the pinned size:\n%s", out)
	}

	// A --min above max is refused (exit 2) and leaves the spec alone.
	out, errs, code := ctl(t, ep, "resize", "job", "sweep", "--min", "4")
	if code != 2 || !strings.Contains(errs, "maxNodes: must be >= minNodes") || strings.Contains(out, "resized") {
		t.Errorf("resize --min 4 above max 3: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	if j := spec(); j.MinNodes != 3 || j.MaxNodes != 3 {
		t.Errorf("a refused resize changed the spec to %d..%d", j.MinNodes, j.MaxNodes)
	}

	// --nodes with --max: --max wins for the upper bound; the job grows back.
	resize("job/sweep resized to 2..4 nodes", 2, 4, "--nodes", "2", "--max", "4")
	waitJobRow(t, ep, "sweep", "4", "2:4")

	// --min alone raises the floor and keeps the max.
	resize("job/sweep resized to 4..4 nodes", 4, 4, "--min", "4")
	waitJobRow(t, ep, "sweep", "4", "4:4")

	if _, errs, code := ctl(t, ep, "resize", "job", "nope", "--nodes", "1"); code != 1 || !strings.Contains(errs, `job "nope"`) || !strings.Contains(errs, "not found") {
		t.Errorf("resize of a missing job: exit %d, stderr %q", code, errs)
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// follow runs "elasticctl events --follow ARGS" in the background until ctx
// is cancelled (as Ctrl-C would cancel it); the channel gets its result.
// urfave/cli mutates its global help flag while parsing, so no other
// command may start until the follower has printed something.
func follow(ctx context.Context, ep string, out *syncBuffer, args ...string) <-chan error {
	done := make(chan error, 1)
	go func() {
		app := newApp(out)
		app.ErrWriter = io.Discard
		done <- app.RunContext(ctx, interspersed(app, append([]string{"elasticctl", "--etcd-endpoints", ep, "events", "--follow"}, args...)))
	}()
	return done
}

func TestEventsFollow(t *testing.T) {
	ep, cli := startFleet(t, 4)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	startCoordinator(t, cli)
	job := func(name string) string {
		return fmt.Sprintf("name: %s\nteam: research\nflavor: nvidia-h100-80gb\nperNode: {accelerators: 8}\nrun: {script: a.py}\n", name)
	}
	for _, j := range []string{"first", "second"} {
		mustCtl(t, ep, "submit", "-f", writeFile(t, j+".yaml", job(j)))
		waitJobRow(t, ep, j, "Running", "1")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var all, second, asJSON syncBuffer
	// Each follower prints the existing history first (one at a time: see follow).
	historyLine := func(j string) *regexp.Regexp {
		return regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)  Admitted ` + j + ` 0 -> 1 nodes: `)
	}
	doneAll := follow(ctx, ep, &all)
	waitFor(t, "follow to print the existing history", func() (bool, string) {
		s := all.String()
		return historyLine("first").MatchString(s) && historyLine("second").MatchString(s), s
	})
	doneSecond := follow(ctx, ep, &second, "second")
	waitFor(t, "follow second to print second's history", func() (bool, string) {
		s := second.String()
		return historyLine("second").MatchString(s), s
	})
	if s := second.String(); strings.Contains(s, "first") {
		t.Errorf("events --follow second printed first's history:\n%s", s)
	}
	doneJSON := follow(ctx, ep, &asJSON, "-o", "json")
	waitFor(t, "follow -o json to print the existing history", func() (bool, string) {
		s := asJSON.String()
		return strings.Contains(s, `"job":"first"`) && strings.Contains(s, `"job":"second"`), s
	})

	var asYAML syncBuffer
	doneYAML := follow(ctx, ep, &asYAML, "-o", "yaml")
	waitFor(t, "follow -o yaml to print the existing history", func() (bool, string) {
		s := asYAML.String()
		return strings.Contains(s, "job: first") && strings.Contains(s, "job: second"), s
	})

	// New decisions are printed as they happen. The watch starts some time
	// after the history was printed, so keep making events for second
	// (suspend / resume, about once a second) until every follower has
	// printed a new one.
	liveSecond := regexp.MustCompile(`(?m)^\S+  (Admitted second 0 -> 1 nodes|Suspended second 1 -> 0 nodes)`)
	jsonSecond := regexp.MustCompile(`"job":"second","team":"research","kind":"(Admitted|Suspended)"`)
	suspended := false
	toggle := func() {
		t.Helper()
		suspended = !suspended
		if suspended {
			mustCtl(t, ep, "suspend", "second")
		} else {
			mustCtl(t, ep, "resume", "second")
		}
	}
	liveEvents := func(what string) {
		t.Helper()
		n1 := len(liveSecond.FindAllString(all.String(), -1))
		n2 := len(liveSecond.FindAllString(second.String(), -1))
		n3 := len(jsonSecond.FindAllString(asJSON.String(), -1))
		toggle()
		last := time.Now()
		waitFor(t, what, func() (bool, string) {
			if len(liveSecond.FindAllString(all.String(), -1)) > n1 && len(liveSecond.FindAllString(second.String(), -1)) > n2 &&
				len(jsonSecond.FindAllString(asJSON.String(), -1)) > n3 {
				return true, ""
			}
			if time.Since(last) > time.Second {
				toggle()
				last = time.Now()
			}
			return false, "all:\n" + all.String() + "\nsecond:\n" + second.String() + "\njson:\n" + asJSON.String()
		})
	}
	liveEvents("every follower to print second's new events live")

	// A follower of one job skips the others' events: third's admission is
	// written before the next event of second, so once the follower has
	// printed that one it has passed (and dropped) third's admission.
	mustCtl(t, ep, "submit", "-f", writeFile(t, "third.yaml", job("third")))
	waitFor(t, "third to be admitted", func() (bool, string) {
		out, _, _ := ctl(t, ep, "events", "third")
		return strings.Contains(out, "Admitted third"), out
	})
	liveEvents("every follower to print second's events after third's admission")
	if s := second.String(); strings.Contains(s, "first") || strings.Contains(s, "third") {
		t.Errorf("events --follow second printed other jobs' events:\n%s", s)
	}
	if s := all.String(); !strings.Contains(s, "Admitted third 0 -> 1 nodes") {
		t.Errorf("events --follow did not print third's admission:\n%s", s)
	}
	// -o json prints one event object a line.
	if s := asJSON.String(); !strings.Contains(s, `"job":"third","team":"research","kind":"Admitted"`) {
		t.Errorf("events --follow -o json did not print third's admission:\n%s", s)
	}
	for _, l := range strings.Split(strings.TrimSpace(asJSON.String()), "\n") {
		var e fleet.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.Job == "" || e.Kind == "" || e.Time.IsZero() {
			t.Errorf("events --follow -o json line %q: %v %+v", l, err, e)
		}
	}

	// -o yaml prints a YAML document per event.
	dec := yaml.NewDecoder(strings.NewReader(asYAML.String()))
	docs := 0
	for {
		var e struct{ Job, Kind string }
		if err := dec.Decode(&e); err == io.EOF {
			break
		} else if err != nil || e.Job == "" || e.Kind == "" {
			t.Fatalf("events --follow -o yaml document %d: %v %+v\n%s", docs, err, e, asYAML.String())
		}
		docs++
	}
	if docs < 3 {
		t.Errorf("events --follow -o yaml printed %d documents, want the history and the live events", docs)
	}

	// Cancelling (what Ctrl-C does) ends every follower cleanly.
	cancel()
	for name, done := range map[string]<-chan error{"all": doneAll, "second": doneSecond, "json": doneJSON, "yaml": doneYAML} {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("follower %s ended with %v, want a clean exit", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("follower %s did not stop after its context was cancelled", name)
		}
	}
}

// Jobs that leave out minNodes/maxNodes or give discrete sizes show their
// effective bounds, and resizing keeps the allowed sizes within the new
// bounds instead of dropping them; a size below 1 is refused.
func TestBoundsShownAndSizesKeptOnResize(t *testing.T) {
	ep, _ := startFleet(t, 4)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	mustCtl(t, ep, "submit", "-f", writeFile(t, "one.yaml", "name: one\nteam: research\nflavor: nvidia-h100-80gb\nperNode: {accelerators: 8}\nrun: {script: train.py}\n"))
	mustCtl(t, ep, "submit", "-f", writeFile(t, "pairs.yaml", "name: pairs\nteam: research\nflavor: nvidia-h100-80gb\nperNode: {accelerators: 8}\nelastic: true\nsizes: [2, 4]\nrun: {script: train.py}\n"))
	waitJobRow(t, ep, "one", "1:1")
	waitJobRow(t, ep, "pairs", "2:4")
	if out := mustCtl(t, ep, "describe", "job", "pairs"); !strings.Contains(out, "Size:       2..4 nodes, sizes [2 4]") {
		t.Errorf("describe job pairs:\n%s", out)
	}
	if out := mustCtl(t, ep, "resize", "job", "pairs", "--max", "2"); strings.TrimSpace(out) != "job/pairs resized to 2..2 nodes (sizes [2])" {
		t.Errorf("resize --max 2 printed %q", out)
	}
	waitJobRow(t, ep, "pairs", "2:2")
	if _, errs, code := ctl(t, ep, "resize", "job", "pairs", "--min", "3"); code != 2 || !strings.Contains(errs, "none of job pairs's allowed sizes [2] is within 3..2") {
		t.Errorf("resize --min 3 with sizes [2]: exit %d, %q", code, errs)
	}
	for _, f := range []string{"--nodes", "--min", "--max"} {
		if _, errs, code := ctl(t, ep, "resize", "job", "one", f, "0"); code != 2 || !strings.Contains(errs, f+" must be >= 1") {
			t.Errorf("resize %s 0: exit %d, %q", f, code, errs)
		}
	}
	waitJobRow(t, ep, "one", "1:1")

	// A team without a weight shows the weight the engine uses: 1.
	mustCtl(t, ep, "apply", "-f", writeFile(t, "plain.yaml", "teams:\n- name: plain\n  quotas:\n  - flavor: nvidia-h100-80gb\n    nominal: 8\n"))
	if out := mustCtl(t, ep, "describe", "team", "plain"); !regexp.MustCompile(`(?m)^Weight:\s+1$`).MatchString(out) {
		t.Errorf("describe team plain (no weight set):\n%s", out)
	}
	if out := mustCtl(t, ep, "get", "teams"); !regexp.MustCompile(`(?m)^plain\s+-\s+1\s`).MatchString(out) {
		t.Errorf("get teams (no weight set):\n%s", out)
	}
}

// A malformed record in etcd is reported on the command's error output,
// naming the key, and the rest is still listed.
func TestMalformedRecordsWarnOnErrorOutput(t *testing.T) {
	ep, cli := startFleet(t, 1)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	mustCtl(t, ep, "submit", "-f", writeFile(t, "sweep.yaml", elasticJob))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli.Put(ctx, "/hyperpodrun/specs/broken", "{not json")
	cli.Put(ctx, "/hyperpodrun/nodes/broken", "[]")
	for _, what := range []string{"jobs", "nodes"} {
		out, errs, code := ctl(t, ep, "get", what)
		if code != 0 || !strings.Contains(errs, "warning") || !strings.Contains(errs, "broken") {
			t.Errorf("get %s with a malformed record: exit %d, stderr %q", what, code, errs)
		}
		if strings.Contains(out, "warning") {
			t.Errorf("get %s printed the warning on standard output:\n%s", what, out)
		}
	}
	if out, _, _ := ctl(t, ep, "get", "jobs"); !strings.Contains(out, "sweep") {
		t.Errorf("get jobs lost the valid job:\n%s", out)
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
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
		inv := devices.Inventory{Node: fmt.Sprintf("node-%d", i), State: devices.StateReady, Flavor: "nvidia-h100-80gb", VCPUs: 96}
		for g := 0; g < 8; g++ {
			inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNVIDIA, Index: g, Flavor: "nvidia-h100-80gb", Healthy: true})
		}
		b, _ := json.Marshal(inv)
		cli.Put(ctx, "/hyperpodrun/nodes/"+inv.Node, string(b))
	}
	if out, errs, code := ctl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML)); code != 0 || !strings.Contains(out, "team/prod configured") {
		t.Fatalf("apply: %d %s %s", code, out, errs)
	}
	coord := coordinator.New(cli, coordinator.Config{Engine: policy.Config{MinStablePeriod: -1}, Resync: 100 * time.Millisecond})
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { coord.Run(cctx); close(done) }()
	defer func() { stop(); <-done }()

	waitJob := func(what string, cond func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			out, _, _ := ctl(t, ep, "get", "jobs")
			if cond(out) {
				return out
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s:\n%s", what, out)
			}
			time.Sleep(50 * time.Millisecond)
		}
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
		{"unknown.yaml", "name: x\nteam: t\nperNode: {accelerators: 1}\nmaxNode: 3\nrun: {script: a.py}\n", "unknown.yaml:4: field maxNode not found"},
		{"type.yaml", "name: x\nteam: t\nperNode:\n  accelerators: lots\nrun: {script: a.py}\n", "type.yaml:4: perNode.accelerators: cannot unmarshal"},
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

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// The common mistakes: exact messages and exit statuses, before any
// connection (the endpoint is unreachable).
func TestMistakesExactMessagesAndExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"gett", "jobs"}, 2, "elasticctl: unknown command \"gett\": did you mean 'get'?\nRun 'elasticctl --help' for usage.\n"},
		{[]string{"get", "jobs", "--tema", "x"}, 2, "elasticctl: unknown flag --tema: did you mean --team?\nRun 'elasticctl get --help' for usage.\n"},
		{[]string{"get", "jobs", "--sort", "age"}, 2, "elasticctl: unknown flag --sort: did you mean --sort-by?\nRun 'elasticctl get --help' for usage.\n"},
		{[]string{"--etcd-endpoint", "x", "get", "jobs"}, 2, "elasticctl: unknown flag --etcd-endpoint: did you mean --etcd-endpoints?\nRun 'elasticctl --help' for usage.\n"},
		{[]string{"get", "jbos"}, 2, "elasticctl: get \"jbos\": did you mean 'get jobs'?\nRun 'elasticctl get --help' for usage.\n"},
		{[]string{"get", "jobs", "-o", "xml"}, 2, "elasticctl: -o \"xml\": choose table, wide, name, json or yaml\nRun 'elasticctl get --help' for usage.\n"},
		{[]string{"get", "jobs", "-l", "tema=a"}, 2, "elasticctl: -l: unknown key \"tema\": did you mean \"team\"? (the keys are team, state, flavor, priority, priorityclass, elastic, reason, suspended)\nRun 'elasticctl get --help' for usage.\n"},
		{[]string{"get", "jobs", "--sort-by", "size"}, 2, "elasticctl: --sort-by \"size\": choose age, name, nodes, priority, reason, state, team\nRun 'elasticctl get --help' for usage.\n"},
		{[]string{"describe", "jobs", "x"}, 2, "elasticctl: describe \"jobs\": did you mean 'describe job'?\nRun 'elasticctl describe --help' for usage.\n"},
		{[]string{"events", "--since", "yesterday"}, 2, "elasticctl: --since \"yesterday\": want a duration (30s, 10m, 2h, 1d) or a time (2006-01-02T15:04:05Z)\nRun 'elasticctl events --help' for usage.\n"},
		{[]string{"delete"}, 2, "elasticctl: delete needs the job's name: elasticctl delete NAME\nRun 'elasticctl delete --help' for usage.\n"},
		{[]string{"completion", "tcsh"}, 2, "elasticctl: completion \"tcsh\": choose bash, zsh or fish\nRun 'elasticctl completion --help' for usage.\n"},
	} {
		out, errs, code := ctl(t, "127.0.0.1:1", tc.args...)
		if code != tc.code || errs != tc.want || out != "" {
			t.Errorf("%v: exit %d, stderr %q; want exit %d, stderr %q (stdout %q)", tc.args, code, errs, tc.code, tc.want, out)
		}
	}
}

func TestHelpDocumentsExitCodesAndExamples(t *testing.T) {
	out, _, code := ctl(t, "127.0.0.1:1", "--help")
	if code != 0 || !strings.Contains(out, "EXIT STATUS:\n   0  the command did what was asked\n   1  the operation failed") || !strings.Contains(out, "2  the command line is wrong") {
		t.Errorf("--help: exit %d\n%s", code, out)
	}
	// Every global flag says what it is for (the TLS ones had no text).
	for _, f := range globalFlags() {
		name := f.Names()[0]
		if !regexp.MustCompile(`(?m)^\s+--` + name + ` value\s+[^\s\[].{10,}`).MatchString(out) {
			t.Errorf("--help has no text for --%s:\n%s", name, out)
		}
	}
	for _, cmd := range newApp(&bytes.Buffer{}).Commands {
		out, _, code := ctl(t, "127.0.0.1:1", cmd.Name, "--help")
		if code != 0 || !regexp.MustCompile(`Examples:\n\s+(elasticctl|source) `).MatchString(out) || !strings.Contains(out, "EXIT STATUS:") {
			t.Errorf("%s --help has no examples or exit statuses: exit %d\n%s", cmd.Name, code, out)
		}
	}
}

func TestSubcommandHelpAfterArguments(t *testing.T) {
	for _, args := range [][]string{{"get", "jobs", "-h"}, {"get", "jobs", "sweep", "--help"}, {"describe", "job", "x", "-h"}} {
		out, errs, code := ctl(t, "127.0.0.1:1", args...)
		if code != 0 || !strings.Contains(out, "USAGE:\n   elasticctl "+args[0]) || errs != "" {
			t.Errorf("%v: exit %d, stderr %q\n%s", args, code, errs, out)
		}
	}
}

func TestTeamsFileErrorsNameLineAndPath(t *testing.T) {
	f := writeFile(t, "teams.yaml", "teams:\n- name: a\n  quotas:\n  - flavor: x\n    nominal: lots\n    borowingLimit: 3\n")
	_, errs, code := ctl(t, "127.0.0.1:1", "apply", "-f", f)
	errs = strings.ReplaceAll(errs, filepath.Dir(f)+"/", "")
	want := "elasticctl: teams.yaml:5: teams[0].quotas[0].nominal: want a whole number, got a string (lots)\n" +
		"teams.yaml:6: unknown field \"borowingLimit\": did you mean \"borrowingLimit\"?\n"
	if code != 1 || errs != want {
		t.Errorf("apply of a bad teams file: exit %d, stderr %q, want %q", code, errs, want)
	}
}

func TestVersionAndCompletion(t *testing.T) {
	out, _, code := ctl(t, "127.0.0.1:1", "version")
	if code != 0 || !strings.HasPrefix(out, "elasticctl ") {
		t.Errorf("version: %d %q", code, out)
	}
	for shell, want := range map[string]string{
		"bash": "complete -o default -F _elasticctl elasticctl",
		"zsh":  "compdef _elasticctl elasticctl",
		"fish": "complete -c elasticctl -n __fish_use_subcommand -a get",
	} {
		out, errs, code := ctl(t, "127.0.0.1:1", "completion", shell)
		if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "jobs") || !strings.Contains(out, "--sort-by") && shell != "fish" {
			t.Errorf("completion %s: exit %d %s\n%s", shell, code, errs, out)
		}
	}
}

// YAML mistakes name the file, the line and the field in YAML terms,
// never a Go type, and the whole file is checked before connecting.
func TestYAMLErrorsInTheUsersWords(t *testing.T) {
	body := "name: x\nteam: t\nperNode: 3\nmaxNode: 3\nrun: {script: a.py}\n---\n" +
		"name: y\nteam: t\nperNode: {accelerators: 1}\nrun: {script: a.py}\n---\n" +
		"name: y\nteam: t\nperNode: {accelerators: 1}\nrun: {script: a.py}\n"
	f := writeFile(t, "jobs.yaml", body)
	_, errs, code := ctl(t, "127.0.0.1:1", "submit", "-f", f)
	errs = strings.ReplaceAll(errs, filepath.Dir(f)+"/", "")
	want := "elasticctl: jobs.yaml:3: perNode: want a mapping with accelerators, vcpus and memory, got a number (3)\n" +
		"jobs.yaml:4: unknown field \"maxNode\": did you mean \"maxNodes\"?\n" +
		"jobs.yaml:12: name: job \"y\" is defined twice (first at line 7): names must be unique\n"
	if code != 1 || !strings.HasSuffix(errs, want) || strings.Contains(errs, "api.") || strings.Contains(errs, "policy.") {
		t.Errorf("submit of a bad file: exit %d, stderr %q; want exit 1, %q", code, errs, want)
	}
}

// Parsing is linear: 2,000 jobs parse well within a second (it took
// minutes when every document re-decoded the file from its start).
func TestParseManyJobsIsLinear(t *testing.T) {
	data := manyJobs(2000)
	start := time.Now()
	jobs, err := parseJobs(data, "many.yaml")
	took := time.Since(start)
	if err != nil || len(jobs) != 2000 {
		t.Fatalf("parse: %v (%d jobs)", err, len(jobs))
	}
	if took > 5*time.Second { // generous under -race on a shared machine
		t.Errorf("parsing 2,000 jobs took %v", took)
	}
	if jobs[1999].line != 1999*8+2 || jobs[1999].teamLine != 1999*8+3 {
		t.Errorf("the last job's lines: %d, %d", jobs[1999].line, jobs[1999].teamLine)
	}
}

// manyJobs is a file of n jobs, 8 lines each (the first a "---").
func manyJobs(n int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, "---\nname: job-%d\nteam: research\nflavor: nvidia-h100-80gb\nperNode: {accelerators: 8}\nmaxNodes: 1\nrun:\n  script: train.py\n", i)
	}
	return b.Bytes()
}

func TestExampleFilesAreValid(t *testing.T) {
	teams, err := loadTeams(filepath.Join("..", "..", "examples", "teams.yaml"))
	if err != nil || len(teams) < 2 {
		t.Errorf("examples/teams.yaml: %v (%d teams)", err, len(teams))
	}
	jobs, err := loadJobs(filepath.Join("..", "..", "examples", "job.yaml"))
	if err != nil || len(jobs) == 0 {
		t.Fatalf("examples/job.yaml: %v", err)
	}
	have := map[string]bool{}
	for _, tm := range teams {
		have[tm.Name] = true
	}
	for _, j := range jobs {
		if !have[j.Team] {
			t.Errorf("examples/job.yaml: job %s names team %s, which examples/teams.yaml lacks", j.Name, j.Team)
		}
	}
}

func TestSubmitChecksTeamAllOrNothingDryRunAndApply(t *testing.T) {
	ep, cli := startFleet(t, 4)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	// An unknown team: exit 1, file and line named, nothing written.
	f := writeFile(t, "j.yaml", strings.Replace(elasticJob, "team: research", "team: reserch", 1))
	_, errs, code := ctl(t, ep, "submit", "-f", f)
	errs = strings.ReplaceAll(errs, filepath.Dir(f)+"/", "")
	if code != 1 || errs != "elasticctl: j.yaml:2: team: team \"reserch\" does not exist: did you mean \"research\"?\nnothing was submitted\n" {
		t.Errorf("submit to an unknown team: exit %d, %q", code, errs)
	}
	// A file whose second job exists: nothing of it is written.
	mustCtl(t, ep, "submit", "-f", writeFile(t, "sweep.yaml", elasticJob))
	two := strings.Replace(elasticJob, "name: sweep", "name: other", 1) + "---\n" + elasticJob
	_, errs, code = ctl(t, ep, "submit", "-f", writeFile(t, "two.yaml", two))
	if code != 1 || !strings.Contains(errs, `job "sweep" already exist: nothing was submitted`) {
		t.Errorf("submit with an existing job: exit %d, %q", code, errs)
	}
	if _, errs, code := ctl(t, ep, "get", "jobs", "other"); code != 1 || errs != "elasticctl: job \"other\" not found: 'elasticctl get jobs' lists them\n" {
		t.Errorf("a partial submit was left: exit %d, %q", code, errs)
	}
	// 100 jobs (several transactions) in one go.
	var b strings.Builder
	for i := range 100 {
		fmt.Fprintf(&b, "---\nname: bulk-%d\nteam: prod\nperNode: {accelerators: 8}\nrun: {script: a.py}\n", i)
	}
	out := mustCtl(t, ep, "submit", "-f", writeFile(t, "bulk.yaml", b.String()))
	if strings.Count(out, "submitted") != 100 {
		t.Errorf("bulk submit printed:\n%s", out)
	}
	// Dry run: the engine's decision, nothing written.
	out = mustCtl(t, ep, "submit", "--dry-run", "-f", writeFile(t, "prod.yaml", prodJob))
	if !strings.HasPrefix(out, "Dry run: nothing was written.") || !regexp.MustCompile(`(?m)^serve-train\s+would (be admitted|wait)\s+\d+\s+\w+`).MatchString(out) {
		t.Errorf("dry run:\n%s", out)
	}
	if _, _, code := ctl(t, ep, "get", "jobs", "serve-train"); code != 1 {
		t.Errorf("the dry run wrote the job")
	}
	// apply -f of jobs: created, then unchanged, then configured.
	f = writeFile(t, "prod.yaml", prodJob)
	if out := mustCtl(t, ep, "apply", "-f", f); out != "job/serve-train created\n" {
		t.Errorf("first apply: %q", out)
	}
	if out := mustCtl(t, ep, "apply", "-f", f); out != "job/serve-train unchanged\n" {
		t.Errorf("second apply: %q", out)
	}
	if out := mustCtl(t, ep, "apply", "-f", writeFile(t, "prod2.yaml", strings.Replace(prodJob, "priorityClass: high", "priorityClass: normal", 1))); out != "job/serve-train configured\n" {
		t.Errorf("changed apply: %q", out)
	}
	j, err := fleet.New(cli, "").Job(context.Background(), "serve-train")
	if err != nil || j.PriorityClass != "normal" || j.SubmitTime.IsZero() {
		t.Errorf("after apply: %+v %v", j, err)
	}
}

func TestGetNamesFiltersSortOutputsAndWatch(t *testing.T) {
	ep, cli := startFleet(t, 4)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	startCoordinator(t, cli)
	mustCtl(t, ep, "submit", "-f", writeFile(t, "sweep.yaml", elasticJob))
	waitJobRow(t, ep, "sweep", "4", "1:4")
	mustCtl(t, ep, "submit", "-f", writeFile(t, "prod.yaml", prodJob))
	waitJobRow(t, ep, "serve-train", "2", "2:2")
	out := mustCtl(t, ep, "get", "jobs", "sweep")
	if !strings.HasPrefix(out, "NAME ") || !strings.Contains(out, " AGE") || strings.Contains(out, "serve-train") || !rowHas(out, "sweep", "research") {
		t.Errorf("get jobs sweep:\n%s", out)
	}
	// REASON is a short code in the table, the sentence in -o wide.
	// Which code depends on when the coordinator last resized sweep (growing
	// into idle capacity, or shrunk when serve-train came), so any of the
	// codes a running job can carry will do; a sentence or a blank will not.
	running := []string{"Reclaim", "WithinQuota", "Borrowing", "FairShare", "CohortExhausted", "BorrowingLimit", "NoCapacity", "Reserved", "AtMax", "StablePeriod", "PriorityPreemption"}
	if !slices.ContainsFunc(running, func(code string) bool { return rowHas(out, "sweep", code) }) {
		t.Errorf("get jobs sweep has no short reason code:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 120 {
			t.Errorf("table line of %d characters: %q", len(line), line)
		}
	}
	if wide := mustCtl(t, ep, "get", "jobs", "sweep", "-o", "wide"); !strings.Contains(wide, "MESSAGE") || len(strings.Split(wide, "\n")[1]) < len(strings.Split(out, "\n")[1]) {
		t.Errorf("-o wide:\n%s", wide)
	}
	if got := mustCtl(t, ep, "get", "jobs", "-o", "name", "--team", "prod"); got != "job/serve-train\n" {
		t.Errorf("--team prod -o name: %q", got)
	}
	if got := mustCtl(t, ep, "get", "jobs", "-o", "name", "-l", "elastic=true"); got != "job/sweep\n" {
		t.Errorf("-l elastic=true: %q", got)
	}
	if got := mustCtl(t, ep, "get", "jobs", "-o", "name", "-l", "team!=prod,state!=Pending"); got != "job/sweep\n" {
		t.Errorf("-l team!=prod: %q", got)
	}
	if got := mustCtl(t, ep, "get", "jobs", "-o", "name", "--sort-by", "priority"); got != "job/serve-train\njob/sweep\n" {
		t.Errorf("--sort-by priority: %q", got)
	}
	if got := mustCtl(t, ep, "get", "jobs", "-o", "name", "--state", "Suspended"); got != "" {
		t.Errorf("--state Suspended: %q", got)
	}
	if _, errs, code := ctl(t, ep, "get", "jobs", "sweep", "nope"); code != 1 || errs != "elasticctl: job \"nope\" not found: 'elasticctl get jobs' lists them\n" {
		t.Errorf("get jobs sweep nope: exit %d %q", code, errs)
	}
	if got := mustCtl(t, ep, "get", "nodes", "node-1", "-o", "name"); got != "node/node-1\n" {
		t.Errorf("get nodes node-1: %q", got)
	}
	if got := mustCtl(t, ep, "get", "teams", "prod", "-o", "name"); got != "team/prod\n" {
		t.Errorf("get teams prod: %q", got)
	}
	var vs []jobView
	if err := json.Unmarshal([]byte(mustCtl(t, ep, "get", "jobs", "sweep", "-o", "json")), &vs); err != nil || len(vs) != 1 {
		t.Errorf("get jobs sweep -o json: %v %+v", err, vs)
	}

	// -w prints the list, then the rows that change.
	ctx, cancel := context.WithCancel(context.Background())
	var w syncBuffer
	done := make(chan error, 1)
	go func() {
		app := newApp(&w)
		app.ErrWriter = &bytes.Buffer{}
		done <- app.RunContext(ctx, interspersed(app, []string{"elasticctl", "--etcd-endpoints", ep, "get", "jobs", "-w", "sweep"}))
	}()
	waitFor(t, "the watch to print the list", func() (bool, string) { return strings.Contains(w.String(), "sweep"), w.String() })
	mustCtl(t, ep, "suspend", "sweep")
	waitFor(t, "the watch to print sweep suspended", func() (bool, string) {
		return regexp.MustCompile(`(?m)^sweep\s+research\s+\d+\s+Suspended`).MatchString(w.String()), w.String()
	})
	if strings.Contains(w.String(), "serve-train") {
		t.Errorf("the watch of sweep printed another job:\n%s", w.String())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("watch ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not stop")
	}
}

func TestEventsSinceTailFor(t *testing.T) {
	ep, cli := startFleet(t, 0)
	st := fleet.New(cli, "")
	now := time.Now()
	for i := range 30 {
		job := "a"
		if i%3 == 0 {
			job = "b"
		}
		e := fleet.Event{Time: now.Add(time.Duration(i-30) * time.Minute), Reason: policy.Reason{Job: job, Kind: policy.KindPending, Message: fmt.Sprintf("m%d", i)}}
		if err := st.PutEvent(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	lines := func(s string) int { return strings.Count(s, "\n") }
	if out := mustCtl(t, ep, "events", "--tail", "5"); lines(out) != 5 || !strings.Contains(out, "m29") || strings.Contains(out, "m24") {
		t.Errorf("--tail 5:\n%s", out)
	}
	if out := mustCtl(t, ep, "events", "--since", "10m30s"); lines(out) != 10 || !strings.Contains(out, "m20") || strings.Contains(out, "m19") {
		t.Errorf("--since 10m:\n%s", out)
	}
	if out := mustCtl(t, ep, "events", "--for", "b", "--tail", "2"); lines(out) != 2 || !strings.Contains(out, "m27") || !strings.Contains(out, "m24") {
		t.Errorf("--for b --tail 2:\n%s", out)
	}
	if out := mustCtl(t, ep, "events", "b"); lines(out) != 10 {
		t.Errorf("events b:\n%s", out)
	}
}

func TestDescribeDedupQueueAndEstimate(t *testing.T) {
	ep, cli := startPendingFleet(t)
	// A second waiter, later: second in the team's queue.
	mustCtl(t, ep, "submit", "-f", writeFile(t, "w2.yaml", strings.Replace(waiterJob, "name: waiter", "name: waiter-2", 1)))
	waitJobRow(t, ep, "waiter-2", "Pending")
	st := fleet.New(cli, "")
	base := time.Now()
	for i := range 5 { // alternating reasons of one job
		code, msg := policy.CodeNoCapacity, "no nodes are free"
		if i%2 == 1 {
			code, msg = policy.CodeBorrowingLimit, "at its borrowing limit"
		}
		st.PutEvent(context.Background(), fleet.Event{Time: base.Add(time.Duration(i) * 10 * time.Second), Reason: policy.Reason{Job: "waiter-2", Kind: policy.KindPending, Code: code, Message: msg}})
	}
	// The problem record as the coordinator writes it from a node's
	// report (the job is placed nowhere, so a report would be ignored).
	pop, err := st.PutProblemOp(fleet.Problem{Job: "waiter-2", Node: "node-0", Message: "containerd is down", Time: base})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Do(context.Background(), pop); err != nil {
		t.Fatal(err)
	}
	out := mustCtl(t, ep, "describe", "job", "waiter-2")
	for _, re := range []string{
		`(?m)^Problem:\s+on node-0 since \S+: containerd is down$`,
		`(?m)^Queue:\s+2 of 2 pending in team solo; 2 of 2 pending in cohort -$`,
		`(?m)^Est\. wait:\s+about \d+s from submission \(an estimate, not a promise: the median time from submission to admission of the 1 most recently admitted jobs of team solo that are running now\)$`,
		`(?m)^  \d\d:\d\d:\d\d  Pending waiter-2: no nodes are free \(x3 over 40s, last at \d\d:\d\d:\d\d\)$`,
		`(?m)^  \d\d:\d\d:\d\d  Pending waiter-2: at its borrowing limit \(x2 over 20s, last at`,
		`(?m)^Reason:\s+BorrowingLimit$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("describe job waiter-2 does not match %s:\n%s", re, out)
		}
	}
	if out := mustCtl(t, ep, "describe", "job", "waiter"); !regexp.MustCompile(`(?m)^Queue:\s+1 of 2 pending in team solo`).MatchString(out) {
		t.Errorf("describe job waiter:\n%s", out)
	}
	if _, errs, code := ctl(t, ep, "describe", "team", "nope"); code != 1 || errs != "elasticctl: team \"nope\" not found: 'elasticctl get teams' lists them\n" {
		t.Errorf("describe team nope: %d %q", code, errs)
	}
	if _, errs, code := ctl(t, ep, "resize", "job", "nope", "--max", "2"); code != 1 || errs != "elasticctl: job \"nope\" not found: 'elasticctl get jobs' lists them\n" {
		t.Errorf("resize nope: %d %q", code, errs)
	}
}

func TestConfigContextsAndOverrides(t *testing.T) {
	ep, _ := startFleet(t, 1)
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	os.WriteFile(pw, []byte("secret\n"), 0o600)
	cfg := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("current-context: dead\ncontexts:\n- name: dead\n  endpoints: [127.0.0.1:1]\n- name: test\n  endpoints: [%s]\n", ep)), 0o600)
	run1 := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := run(append([]string{"elasticctl"}, args...), &out, &errb)
		return out.String(), errb.String(), code
	}
	if out, errs, code := run1("--config", cfg, "--context", "test", "get", "nodes", "-o", "name"); code != 0 || out != "node/node-0\n" {
		t.Errorf("--context test: %d %q %q", code, out, errs)
	}
	// A flag overrides the current context.
	if out, errs, code := run1("--config", cfg, "--etcd-endpoints", ep, "get", "nodes", "-o", "name"); code != 0 || out != "node/node-0\n" {
		t.Errorf("--etcd-endpoints over the context: %d %q %q", code, out, errs)
	}
	if _, errs, code := run1("--config", cfg, "--context", "tset", "get", "nodes"); code != 1 || !strings.Contains(errs, `no context named "tset": did you mean "test"?`) {
		t.Errorf("--context tset: %d %q", code, errs)
	}
	// An ELASTICCTL_* variable overrides the current context too, and a
	// flag overrides the variable.
	t.Setenv("ELASTICCTL_ETCD_ENDPOINTS", ep)
	if out, errs, code := run1("--config", cfg, "get", "nodes", "-o", "name"); code != 0 || out != "node/node-0\n" {
		t.Errorf("ELASTICCTL_ETCD_ENDPOINTS over the context: %d %q %q", code, out, errs)
	}
	if _, errs, code := run1("--config", cfg, "--etcd-endpoints", "127.0.0.1:1", "get", "nodes"); code != 1 || !strings.Contains(errs, "cannot reach etcd at http://127.0.0.1:1") {
		t.Errorf("--etcd-endpoints over ELASTICCTL_ETCD_ENDPOINTS: %d %q", code, errs)
	}
}

// events --follow no longer replays the whole history: the last 10, then
// new ones.
func TestEventsFollowStartsFromTheTail(t *testing.T) {
	ep, cli := startFleet(t, 0)
	st := fleet.New(cli, "")
	now := time.Now()
	for i := range 50 {
		st.PutEvent(context.Background(), fleet.Event{Time: now.Add(time.Duration(i-50) * time.Second), Reason: policy.Reason{Job: "a", Kind: policy.KindPending, Message: fmt.Sprintf("old-%02d", i)}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuffer
	done := follow(ctx, ep, &out)
	waitFor(t, "the last 10 events", func() (bool, string) { return strings.Contains(out.String(), "old-49"), out.String() })
	st.PutEvent(context.Background(), fleet.Event{Time: time.Now(), Reason: policy.Reason{Job: "a", Kind: policy.KindPending, Message: "new-event"}})
	waitFor(t, "the new event", func() (bool, string) { return strings.Contains(out.String(), "new-event"), out.String() })
	if s := out.String(); strings.Contains(s, "old-39") || !strings.Contains(s, "old-40") {
		t.Errorf("--follow printed more or less than the last 10:\n%s", s)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("follow: %v", err)
	}
}

func TestGetTeamsAndNodesSelectors(t *testing.T) {
	ep, _ := startFleet(t, 2)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", strings.Replace(teamsYAML, "- name: prod\n", "- name: prod\n  cohort: serving\n", 1)))
	if got := mustCtl(t, ep, "get", "teams", "-l", "cohort=serving", "-o", "name"); got != "team/prod\n" {
		t.Errorf("get teams -l cohort=serving: %q", got)
	}
	if got := mustCtl(t, ep, "get", "nodes", "-l", "flavor=nvidia-h100-80gb", "--sort-by", "name", "-o", "name"); got != "node/node-0\nnode/node-1\n" {
		t.Errorf("get nodes -l flavor: %q", got)
	}
	if _, errs, code := ctl(t, ep, "get", "teams", "nope"); code != 1 || errs != "elasticctl: team \"nope\" not found: 'elasticctl get teams' lists them\n" {
		t.Errorf("get teams nope: %d %q", code, errs)
	}
	if _, errs, code := ctl(t, ep, "describe", "node", "node-9"); code != 1 || !strings.Contains(errs, `node "node-9" not found`) || !strings.Contains(errs, `did you mean "node-0"?`) {
		t.Errorf("describe node node-9: %d %q", code, errs)
	}
}

// watchCtl runs "elasticctl ARGS" (a -w command) until ctx ends.
func watchCtl(ctx context.Context, ep string, out *syncBuffer, args ...string) <-chan error {
	done := make(chan error, 1)
	go func() {
		app := newApp(out)
		app.ErrWriter = &bytes.Buffer{}
		done <- app.RunContext(ctx, interspersed(app, append([]string{"elasticctl", "--etcd-endpoints", ep}, args...)))
	}()
	return done
}

func TestGetNodesAndTeamsWatch(t *testing.T) {
	ep, cli := startFleet(t, 1)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var nodes syncBuffer
	doneNodes := watchCtl(ctx, ep, &nodes, "get", "nodes", "-w")
	waitFor(t, "the node list", func() (bool, string) { return strings.Contains(nodes.String(), "node-0"), nodes.String() })
	var teams syncBuffer
	doneTeams := watchCtl(ctx, ep, &teams, "get", "teams", "-w")
	waitFor(t, "the team list", func() (bool, string) { return strings.Contains(teams.String(), "research"), teams.String() })
	putNode(t, cli, h100Node("node-7"))
	waitFor(t, "the new node", func() (bool, string) {
		return regexp.MustCompile(`(?m)^node-7\s+ready`).MatchString(strings.ToLower(nodes.String())), nodes.String()
	})
	mustCtl(t, ep, "apply", "-f", writeFile(t, "more.yaml", "teams:\n- name: extra\n  quotas:\n  - {flavor: nvidia-h100-80gb, nominal: 8}\n"))
	waitFor(t, "the new team", func() (bool, string) { return strings.Contains(teams.String(), "extra"), teams.String() })
	cancel()
	for _, d := range []<-chan error{doneNodes, doneTeams} {
		select {
		case err := <-d:
			if err != nil {
				t.Errorf("watch ended with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a watch did not stop")
		}
	}
}

// The jobs table's writer aligns as the tabwriter of the other tables
// does, byte for byte (wide cells, other scripts, empty cells).
func TestTableAlignsAsTabwriter(t *testing.T) {
	rows := [][]string{
		{"NAME", "TEAM", "STATE", "MESSAGE"},
		{"a", "research", "Running", "ok"},
		{"a-much-longer-name", "", "Pending", "wait: the team uses 800 of nominal 800"},
		{"größe", "équipe", "-", ""},
		{"x", "t", "Succeeded", "done"},
	}
	var want, got bytes.Buffer
	tw := newTab(&want)
	tb := newTable(4, len(rows))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
		tb.row(r...)
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := tb.write(&got); err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() {
		t.Errorf("table wrote\n%s\ntabwriter\n%s", got.String(), want.String())
	}
}

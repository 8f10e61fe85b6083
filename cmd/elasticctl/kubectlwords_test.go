package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// delete takes several names as kubectl delete does: each job named is
// deleted and printed; a missing name is an error (exit 1) that does not
// keep the others from going.
func TestDeleteSeveralJobs(t *testing.T) {
	ep, cli := startFleet(t, 1)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	for _, name := range []string{"a", "b", "c"} {
		mustCtl(t, ep, "submit", "-f", writeFile(t, name+".yaml", strings.Replace(elasticJob, "name: sweep", "name: "+name, 1)))
	}
	if out := mustCtl(t, ep, "delete", "a", "b"); out != "job/a deleted\njob/b deleted\n" {
		t.Errorf("delete a b printed %q", out)
	}
	out, errs, code := ctl(t, ep, "delete", "nosuch", "c")
	if code != 1 || out != "job/c deleted\n" || !strings.Contains(errs, `job "nosuch" not found`) {
		t.Errorf("delete nosuch c: exit %d, stdout %q, stderr %q; want 1, c deleted, nosuch not found", code, out, errs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for _, name := range []string{"a", "b", "c"} {
		if j, err := fleet.New(cli, "").Job(ctx, name); err == nil {
			t.Errorf("job %s is still there: %+v", name, j)
		}
	}
	if _, errs, code := ctl(t, ep, "delete", "ok", "../x"); code != 2 || !strings.Contains(errs, "DNS-1123") {
		t.Errorf("delete with a bad name: exit %d, %q; want 2 before anything is deleted", code, errs)
	}
}

// apply -f of teams says created for a new team, unchanged for the same
// one and configured for a changed one, as kubectl apply does.
func TestApplyTeamsCreatedUnchangedConfigured(t *testing.T) {
	ep, _ := startFleet(t, 0)
	f := writeFile(t, "teams.yaml", teamsYAML)
	if out := mustCtl(t, ep, "apply", "-f", f); out != "team/research created\nteam/prod created\n" {
		t.Errorf("first apply: %q", out)
	}
	if out := mustCtl(t, ep, "apply", "-f", f); out != "team/research unchanged\nteam/prod unchanged\n" {
		t.Errorf("second apply: %q", out)
	}
	changed := strings.Replace(teamsYAML, "  preemption: LowerPriority\n", "", 1)
	if out := mustCtl(t, ep, "apply", "-f", writeFile(t, "teams2.yaml", changed)); out != "team/research unchanged\nteam/prod configured\n" {
		t.Errorf("changed apply: %q", out)
	}
	if out := mustCtl(t, ep, "get", "teams", "prod", "-o", "yaml"); strings.Contains(out, "LowerPriority") {
		t.Errorf("the changed team was not written:\n%s", out)
	}
}

// get jobs with no jobs prints only "No jobs found." (on stderr), no
// header, as kubectl get does.
func TestGetNoJobsPrintsNoHeader(t *testing.T) {
	ep, _ := startFleet(t, 0)
	for _, args := range [][]string{{"get", "jobs"}, {"get", "jobs", "-o", "wide"}} {
		out, errs, code := ctl(t, ep, args...)
		if code != 0 || out != "" || errs != "No jobs found.\n" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 0, nothing, No jobs found.", args, code, out, errs)
		}
	}
	if out := mustCtl(t, ep, "get", "jobs", "-o", "json"); strings.TrimSpace(out) == "" {
		t.Errorf("get jobs -o json with no jobs printed nothing")
	}
}

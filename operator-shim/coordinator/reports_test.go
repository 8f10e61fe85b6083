package coordinator

import (
	"testing"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

func TestJudgeReport(t *testing.T) {
	prob := func(job, node string, cleared bool) *fleet.Problem {
		return &fleet.Problem{Job: job, Node: node, Message: "m", Cleared: cleared}
	}
	for _, c := range []struct {
		rule    string
		kind    string
		placed  bool
		decodes bool
		p       *fleet.Problem
		want    reportAction
	}{
		{rule: "a finish of a job placed on the node is copied", kind: fleet.ReportFinished, placed: true, decodes: true, want: reportFinish},
		{rule: "a finish of a job not placed on the node is ignored", kind: fleet.ReportFinished, decodes: true, want: reportDrop},
		{rule: "a malformed finish is ignored", kind: fleet.ReportFinished, placed: true, want: reportDrop},
		{rule: "a problem of a job placed on the node is copied", kind: fleet.ReportProblem, placed: true, p: prob("j", "n", false), want: reportProblem},
		{rule: "a problem of a job not placed on the node is ignored", kind: fleet.ReportProblem, p: prob("j", "n", false), want: reportDrop},
		{rule: "a problem naming another node is ignored", kind: fleet.ReportProblem, placed: true, p: prob("j", "other", false), want: reportDrop},
		{rule: "a problem naming another job is ignored", kind: fleet.ReportProblem, placed: true, p: prob("other", "n", false), want: reportDrop},
		{rule: "a cleared problem is applied even off the job", kind: fleet.ReportProblem, p: prob("j", "n", true), want: reportClear},
		{rule: "a malformed problem is ignored", kind: fleet.ReportProblem, placed: true, want: reportDrop},
		{rule: "an unknown kind is ignored", kind: "other", placed: true, decodes: true, want: reportDrop},
	} {
		t.Run(c.rule, func(t *testing.T) {
			got, why := judgeReport(c.kind, c.placed, c.decodes, c.p, "n", "j")
			if got != c.want || (got == reportDrop) != (why != "") {
				t.Errorf("judgeReport = %v (%q), want %v", got, why, c.want)
			}
		})
	}
}

package coordinator

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
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

// A node's junk reports (here finishes of a job not placed on it) are
// deleted in a few transactions, not one each: one transaction per report
// let a node hold up every decision (5,000 delayed an unrelated
// admission 4.6 s). etcd's revision counts the transactions.
func TestJunkReportsAreDeletedInBatches(t *testing.T) {
	cli, ctx := setup(t)
	st := fleet.New(cli, "")
	const junk = 600
	for i := 0; i < junk; i += 100 {
		var ops []clientv3.Op
		for j := i; j < i+100; j++ {
			ops = append(ops, clientv3.OpPut(st.Keys.FinishReport("node-x", fmt.Sprintf("not-here-%d", j)), `{"outcome":"failed"}`))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	r, err := cli.Get(ctx, "rev")
	if err != nil {
		t.Fatal(err)
	}
	before := r.Header.Revision
	c := New(cli, Config{Identity: "c", Engine: policy.Config{MinStablePeriod: -1}})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { c.Run(cctx); close(done) }()
	defer func() { cancel(); <-done }()
	eventually(t, 20*time.Second, "the junk reports deleted", func() (bool, string) {
		r, err := cli.Get(ctx, st.Keys.ReportsPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 0, fmt.Sprint(r.Count, err)
	})
	r, err = cli.Get(ctx, "rev")
	if err != nil {
		t.Fatal(err)
	}
	if n := r.Header.Revision - before; n > junk/10 {
		t.Errorf("deleting %d junk reports took %d etcd revisions; want a few batches", junk, n)
	}
}

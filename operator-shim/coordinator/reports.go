package coordinator

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// reportAction is what the coordinator does with one node's report.
type reportAction int

const (
	// reportDrop deletes the report and changes nothing else.
	reportDrop reportAction = iota
	// reportFinish copies a finish into finished/<job> (first wins).
	reportFinish
	// reportProblem copies a problem into problems/<job>/<node>.
	reportProblem
	// reportClear deletes problems/<job>/<node>.
	reportClear
)

// judgeReport decides what a node's report is worth: a finish or problem
// of a job counts only when the job is placed on that node (placed), and
// a problem only when it names that node and job; a cleared problem always
// counts (a node may only clear its own record, and one moved off the job
// must be able to). why says why a report is dropped ("" when it is not).
func judgeReport(kind string, placed bool, finishDecodes bool, p *fleet.Problem, node, job string) (act reportAction, why string) {
	switch kind {
	case fleet.ReportFinished:
		switch {
		case !finishDecodes:
			return reportDrop, "malformed finish report"
		case !placed:
			return reportDrop, "the job is not placed on the node that reports its finish"
		}
		return reportFinish, ""
	case fleet.ReportProblem:
		switch {
		case p == nil:
			return reportDrop, "malformed problem report"
		case p.Job != job || p.Node != node:
			return reportDrop, "the problem report names another job or node than its key"
		case p.Cleared:
			return reportClear, ""
		case !placed:
			return reportDrop, "the job is not placed on the node that reports a problem with it"
		}
		return reportProblem, ""
	}
	return reportDrop, "not a report key"
}

// placedOn reports whether job is placed on node: its current assignment
// there, or node among its desired record's nodes.
func (v *view) placedOn(job, node string) bool {
	if _, ok := v.assigned[job][node]; ok {
		return true
	}
	return slices.Contains(v.desired[job].Nodes, node)
}

// processReports applies the nodes' pending reports (reports/<node>/...):
// a finish or problem of a job placed on the reporting node is copied into
// finished/<job> (the first finish wins) or problems/<job>/<node>; any
// other is logged once and ignored (and deleted in batches:
// dropReports). Each report that counts is deleted in the transaction
// that applies it, guarded by its mod revision (a newer report
// of the same key is processed on its own) and by leadership.
func (c *Coordinator) processReports(ctx context.Context, leader clientv3.Cmp) {
	v := c.view
	c.reportsLeft = false
	if len(v.reports) == 0 {
		return
	}
	keys := make([]string, 0, len(v.reports))
	for k := range v.reports {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	k := c.store.Keys
	var drops []*mvccpb.KeyValue
	defer func() { c.dropReports(ctx, leader, drops) }()
	for _, key := range keys {
		if ctx.Err() != nil {
			c.reportsLeft = true
			return
		}
		kv := v.reports[key]
		rk, ok := k.ParseReportKey(key)
		node, kind, job := rk.Node, rk.Kind, rk.Job
		var f *fleet.Finish
		var p *fleet.Problem
		if ok && kind == fleet.ReportFinished {
			if x, err := fleet.DecodeFinish(key, kv.Value); err == nil {
				x.Node = node // a node speaks for itself only
				f = x
			}
		}
		if ok && kind == fleet.ReportProblem {
			var x fleet.Problem
			if json.Unmarshal(kv.Value, &x) == nil {
				p = &x
			}
		}
		act, why := reportDrop, "not a report key"
		if ok {
			act, why = judgeReport(kind, v.placedOn(job, node), f != nil, p, node, job)
		}
		if act == reportDrop {
			if lk := key + "\x00" + why; !c.ignored[lk] {
				if c.ignored == nil {
					c.ignored = map[string]bool{}
				}
				c.ignored[lk] = true
				c.log.Warn("ignoring a node's report", "why", why, "key", clipMsg(key))
			}
			drops = append(drops, kv)
			continue // deleted in batches: dropReports
		}
		mine := clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)
		drop := clientv3.OpDelete(key)
		var ops []clientv3.Op
		cmps := []clientv3.Cmp{leader, mine}
		switch act {
		case reportFinish:
			if _, done := v.finished[job]; !done {
				op, err := c.store.RecordFinishOp(job, *f)
				if err == nil {
					ops = append(ops, op)
					cmps = append(cmps, c.store.FinishAbsent(job))
				}
			}
		case reportProblem:
			if op, err := c.store.PutProblemOp(*p); err == nil {
				ops = append(ops, op)
			}
		case reportClear:
			ops = append(ops, c.store.DeleteProblemOp(job, node))
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := c.cli.Txn(wctx).If(cmps...).Then(append(ops, drop)...).Commit()
		if err == nil && !r.Succeeded && len(cmps) > 2 {
			// Finished already (the first finish wins): drop the report.
			r, err = c.cli.Txn(wctx).If(leader, mine).Then(drop).Commit()
			ops = nil
		}
		cancel()
		if err != nil {
			c.etcdError("write")
			c.log.Warn("cannot process a node's report yet", "key", clipMsg(key), "err", err)
			c.reportsLeft = true // the cycle's wake comes back for it (retryWake)
			continue
		}
		delete(v.reports, key)
		if !r.Succeeded {
			continue // a newer report of the key (processed on its own), or not the leader
		}
		c.observeRev(r.Header.Revision)
		if act == reportFinish && len(ops) > 0 {
			b, _ := json.Marshal(f)
			if v.putFinish(&mvccpb.KeyValue{Key: []byte(k.Finish(job)), Value: b}, c.cfg.Now()) {
				v.changed++
			}
			c.log.Info("a node reported the job finished", "job", job, "node", node, "outcome", f.Outcome)
		}
	}
	if len(c.ignored) > 10000 {
		clear(c.ignored) // bounded: a node sending endless junk is logged again
	}
}

// dropReports deletes the reports that count for nothing, up to maxTxnOps
// in one transaction guarded by leadership, each by its own nested
// transaction guarded by its mod revision (a newer report of the same key
// is processed on its own). One transaction per junk report let a node
// hold up every decision: 5,000 reports of jobs not placed on it delayed
// an unrelated admission by 4.6 s.
func (c *Coordinator) dropReports(ctx context.Context, leader clientv3.Cmp, drops []*mvccpb.KeyValue) {
	if len(drops) > 0 && ctx.Err() != nil {
		c.reportsLeft = true // the term or the cycle ended: the next one deletes them
		return
	}
	for len(drops) > 0 {
		batch := drops[:min(len(drops), maxTxnOps)]
		drops = drops[len(batch):]
		ops := make([]clientv3.Op, len(batch))
		for i, kv := range batch {
			key := string(kv.Key)
			mine := clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)
			ops[i] = clientv3.OpTxn([]clientv3.Cmp{mine}, []clientv3.Op{clientv3.OpDelete(key)}, nil)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := c.cli.Txn(wctx).If(leader).Then(ops...).Commit()
		cancel()
		if err != nil {
			c.etcdError("write")
			c.log.Warn("cannot delete ignored node reports yet", "count", len(batch)+len(drops), "err", err)
			c.reportsLeft = true // the cycle's wake comes back for them (retryWake)
			return
		}
		for _, kv := range batch {
			delete(c.view.reports, string(kv.Key))
		}
		if r.Succeeded {
			c.observeRev(r.Header.Revision)
		}
	}
}

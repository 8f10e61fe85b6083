package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxSummary bounds a failure summary kept in etcd (a report and the round
// records that carry it): a summary of thousands of ranks is clipped, not
// refused.
const maxSummary = 32 << 10

// clipSummary is s cut to maxSummary bytes, saying so.
func clipSummary(s string) string {
	if len(s) <= maxSummary {
		return s
	}
	return s[:maxSummary] + "\n<summary clipped>\n"
}

// FailJob ends the job for good: its restarts are spent (the agent's
// --max-restarts rule). The round record becomes a failed header carrying
// detail and summary, so every node waiting in Join returns a
// *JobFailedError at once and every node running a round sees it
// superseded (Next, reason JobFailed) and then fails Join, instead of
// waiting out the join timeout for nodes that will never come. The first
// node to fail the job wins: a record that is failed already is kept. The
// node stays registered; Leave it afterwards.
func (n *Node) FailJob(ctx context.Context, detail, summary string) error {
	summary = clipSummary(summary)
	for attempt := 0; attempt < 10; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, n.opTimeout())
		g, err := n.cli.Get(rctx, n.k.Head)
		cancel()
		if err != nil {
			return fmt.Errorf("rendezvous: job %q node %q: fail the job: read %s: %w", n.cfg.JobID, n.cfg.NodeID, n.k.Head, err)
		}
		h := header{V: formatVersion, Round: 1, State: stateFailed, Reason: JobFailed, Detail: detail, Summary: summary, Closer: n.cfg.NodeID}
		var rev int64
		if len(g.Kvs) > 0 {
			rev = g.Kvs[0].ModRevision
			if old, err := decodeHeader(n.k.Head, g.Kvs[0].Value); err == nil {
				if old.State == stateFailed {
					return nil
				}
				h.Round = old.Round + 1
			}
		}
		v, _ := json.Marshal(h) // plain fields: cannot fail
		wctx, cancel := context.WithTimeout(ctx, n.opTimeout())
		t, err := n.cli.Txn(wctx).If(clientv3.Compare(clientv3.ModRevision(n.k.Head), "=", rev)).
			Then(clientv3.OpPut(n.k.Head, string(v))).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("rendezvous: job %q node %q: fail the job: write %s: %w", n.cfg.JobID, n.cfg.NodeID, n.k.Head, err)
		}
		if t.Succeeded {
			n.log.Info("rendezvous: the job failed for good; every node ends", "round", h.Round, "detail", detail)
			return nil
		}
	}
	return fmt.Errorf("rendezvous: job %q node %q: fail the job: the round record kept changing", n.cfg.JobID, n.cfg.NodeID)
}

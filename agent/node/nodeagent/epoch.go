package nodeagent

import (
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// DataLossHandler is implemented by Workloads that can stop every job of
// the node at once. The agent calls StopAll when it finds that etcd lost
// its data (a wipe, a new cluster, an older snapshot restored): the jobs
// it runs are then unknown to the control plane, which would place other
// jobs on the node beside them.
type DataLossHandler interface {
	// StopAll stops every job of the node (gracefully: a checkpoint, then
	// their grace, then killed), releases what they held on the host and
	// returns the jobs it stopped once they are all gone. No job starts
	// again before the workloads have re-read the node's assignments from
	// etcd. why is logged and goes in the jobs' records.
	StopAll(ctx context.Context, why string) (stopped []string, err error)
}

// lossNoteFor is how long the node's record says that etcd lost its data
// (Inventory.Reasons, shown by elasticctl describe node).
const lossNoteFor = time.Hour

// dataLoss is what the agent remembers of the last time etcd lost its data.
type dataLoss struct {
	at   time.Time
	note string
}

// checkEtcd compares what etcd looks like now with what the agent
// remembers (fleet.EtcdDataLost) before each registration; on a loss it
// stops the node's jobs (before the node is registered free again: no job
// of the new epoch is started beside them) and says so. It fails only
// when etcd cannot be read.
func (a *Agent) checkEtcd(ctx context.Context) error {
	now, err := a.observe(ctx)
	if err != nil {
		return fmt.Errorf("etcd data check: %w", err)
	}
	a.mu.Lock()
	before := a.view
	a.mu.Unlock()
	rule := fleet.EtcdDataLost(before, now)
	if rule == fleet.LossNone {
		a.remember(before.Later(now))
		return nil
	}
	a.etcdDataLost(ctx, rule, before, now)
	a.remember(now)
	return nil
}

// observe writes the fleet's epoch record when etcd has none (a node
// agent may come up before any coordinator; with etcd auth on, its role
// may only read it, and the coordinator writes it) and reads what etcd
// looks like now.
func (a *Agent) observe(ctx context.Context) (fleet.EtcdView, error) {
	octx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	st := fleet.New(a.cli, a.cfg.Prefix)
	if _, created, err := st.EnsureEpoch(octx); err == nil && created {
		a.log.Info("wrote the fleet's epoch record: etcd had none (a new fleet, or etcd lost its data)")
	} else if err != nil && !fleet.IsPermissionDenied(err) {
		a.log.Debug("cannot write the fleet's epoch record", "err", err)
	}
	return st.ObserveEtcd(octx)
}

// learnEpoch reads the fleet's epoch while the agent knows none (it
// registered before any epoch record existed), so that a later wipe is
// found by the epoch and not only by the revision.
func (a *Agent) learnEpoch(ctx context.Context) {
	a.mu.Lock()
	known := a.view.Epoch != "" || a.view.Revision == 0 || !a.registered
	a.mu.Unlock()
	if known {
		return
	}
	now, err := a.observe(ctx)
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if fleet.EtcdDataLost(a.view, now) == fleet.LossNone {
		a.view = a.view.Later(now)
	}
}

// remember keeps v as the view the node is registered under.
func (a *Agent) remember(v fleet.EtcdView) {
	a.mu.Lock()
	a.view = v
	a.mu.Unlock()
}

// sawRevision raises the remembered revision to rev (a write's or a
// linearizable read's header).
func (a *Agent) sawRevision(rev int64) {
	a.mu.Lock()
	if a.view.Revision != 0 && rev > a.view.Revision {
		a.view.Revision = rev
	}
	a.mu.Unlock()
}

// keepAliveSuspect reports whether a keep-alive response's revision is
// lower than the highest the agent saw: etcd may have been restored to an
// older snapshot (its leases come back with it, so the keep-alive goes
// on). A member that lags behind the leader answers with a lower revision
// too, so this is only a suspicion: checkEtcd's linearizable read decides.
func (a *Agent) keepAliveSuspect(resp *clientv3.LeaseKeepAliveResponse) bool {
	if resp == nil || resp.ResponseHeader == nil {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.view.Revision != 0 && resp.Revision < a.view.Revision
}

// verifyEtcd confirms a suspicion with a linearizable read: on a loss the
// registration is dropped, and the next registration (checkEtcd) handles
// it.
func (a *Agent) verifyEtcd(ctx context.Context) {
	octx, cancel := context.WithTimeout(ctx, etcdTimeout)
	now, err := fleet.New(a.cli, a.cfg.Prefix).ObserveEtcd(octx)
	cancel()
	if err != nil {
		return // the keep-alive or the next check tells
	}
	a.mu.Lock()
	before := a.view
	a.mu.Unlock()
	if rule := fleet.EtcdDataLost(before, now); rule != fleet.LossNone {
		a.leaseLost(fmt.Errorf("etcd lost its data (%s): revision %d, the agent had seen %d", rule, now.Revision, before.Revision))
	}
}

// etcdDataLost stops the node's jobs and says loudly what happened: an
// error in the log, the metric, and a note in the node's record.
func (a *Agent) etcdDataLost(ctx context.Context, rule string, before, now fleet.EtcdView) {
	a.metrics.etcdDataLoss.Inc()
	what := map[string]string{
		fleet.LossClusterChanged:   "etcd is another cluster now",
		fleet.LossEpochChanged:     "the fleet's epoch record changed",
		fleet.LossEpochGone:        "the fleet's epoch record is gone",
		fleet.LossRevisionBackward: "etcd's revision went backwards",
	}[rule]
	why := fmt.Sprintf("etcd lost its data (%s): wiped, replaced or restored from an older snapshot", what)
	attrs := []any{"rule", rule, "epoch_before", before.Epoch, "epoch_now", now.Epoch,
		"revision_before", before.Revision, "revision_now", now.Revision,
		"cluster_before", fmt.Sprintf("%x", before.ClusterID), "cluster_now", fmt.Sprintf("%x", now.ClusterID)}
	var stopped []string
	if h, ok := a.cfg.Workloads.(DataLossHandler); ok {
		a.log.Error(why+": the jobs this node runs are unknown to the control plane now; stopping them (a checkpoint, "+
			"then their grace, then killed) before the node registers free", attrs...)
		var err error
		stopped, err = h.StopAll(ctx, why)
		if err != nil {
			a.log.Error("cannot stop every job of the node after etcd lost its data", "err", err)
		}
	}
	jobs := "none"
	if len(stopped) > 0 {
		jobs = strings.Join(stopped, ", ")
	}
	note := fmt.Sprintf("%s at %s; jobs stopped on this node: %s. Resubmit them (elasticctl submit); their checkpoint records went with the data: see docs/disaster-recovery.md",
		why, time.Now().UTC().Format(time.RFC3339), jobs)
	a.log.Error(why+": the node registers free; resubmit the jobs it ran (elasticctl submit); their checkpoint records went with etcd's data, "+
		"see docs/disaster-recovery.md", append(attrs, "stopped_jobs", jobs)...)
	a.mu.Lock()
	a.loss = &dataLoss{at: time.Now(), note: note}
	a.mu.Unlock()
}

// lossNote is the note on the node's record after a data loss, "" once
// lossNoteFor has passed.
func (a *Agent) lossNote() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.loss == nil || time.Since(a.loss.at) > lossNoteFor {
		return ""
	}
	return a.loss.note
}

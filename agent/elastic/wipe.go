package elastic

// The wipe guard (issue 24): when etcd loses its data (its data directory
// wiped, a new cluster, an older snapshot restored), the job's records go
// with it: a rejoining agent would find an empty rendezvous, form round 1
// with whoever is there and start the workers from step 0, beside a
// control plane that no longer knows the job. Before it starts workers
// for a round, the agent compares what it saw of etcd and of the job with
// what it sees now (dataLost); on a loss it starts nothing, says so and
// exits, so that the user resubmits the job.

import (
	"context"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// wipeState is what the agent remembers of etcd and of the job.
type wipeState struct {
	// etcd is the view of etcd at the last round this agent joined, its
	// revision raised by what the agent saw since.
	etcd fleet.EtcdView
	// round is the last round this agent joined (0: none yet).
	round int64
	// checkpointRev is the create revision of the job's checkpoint record
	// (0: none seen). The record is never deleted while the job runs: one
	// created again is one written into an etcd that lost the first.
	checkpointRev int64
}

// wipeView is the input of dataLost: what the agent remembers and what it
// sees as it joins a round.
type wipeView struct {
	Before wipeState
	// Etcd is etcd's view now, Round the round being joined and
	// CheckpointRev the checkpoint record's create revision (0: absent).
	Etcd          fleet.EtcdView
	Round         int64
	CheckpointRev int64
}

// wipeMemory guards wipeState: the loop reads and writes it at each join,
// the control channel's handler raises it at each committed checkpoint.
type wipeMemory struct {
	mu sync.Mutex
	s  wipeState
}

// Rules of dataLost (besides fleet.EtcdDataLost's, prefixed "etcd-").
const (
	ruleWipeNone            = ""
	ruleWipeRoundBackwards  = "round-went-backwards"
	ruleWipeCheckpointGone  = "checkpoint-record-gone"
	ruleWipeCheckpointNew   = "checkpoint-record-created-again"
	ruleWipeEtcdPrefix      = "etcd-"
	wipeAdvice              = "the job's records in etcd are gone; resubmit the job (its checkpoint files are where it wrote them)"
	wipeLogMessage          = fleet.JobRecordsLost + ": not starting workers; leaving the job"
	wipeErrorMessagePattern = fleet.JobRecordsLost + " (%s: %s); %s"
)

// dataLost decides whether etcd lost the job's data since the agent last
// joined a round: etcd itself says so (fleet.EtcdDataLost: another
// cluster, another or no fleet epoch, a lower revision), the job's rounds
// start over (a round number below the last one joined), or the
// committed checkpoint record it saw is gone or was created again (records
// are never deleted while the job runs; a worker still running when etcd
// was wiped may commit into the empty one). It returns the rule and what
// it saw.
func dataLost(v wipeView) (rule, detail string) {
	if rule := fleet.EtcdDataLost(v.Before.etcd, v.Etcd); rule != fleet.LossNone {
		return ruleWipeEtcdPrefix + rule, fmt.Sprintf("revision %d, %d before; epoch %q, %q before", v.Etcd.Revision, v.Before.etcd.Revision, v.Etcd.Epoch, v.Before.etcd.Epoch)
	}
	if v.Before.round > 0 && v.Round < v.Before.round {
		return ruleWipeRoundBackwards, fmt.Sprintf("round %d after round %d", v.Round, v.Before.round)
	}
	switch {
	case v.Before.checkpointRev != 0 && v.CheckpointRev == 0:
		return ruleWipeCheckpointGone, "a committed checkpoint was recorded, and the record is gone"
	case v.Before.checkpointRev != 0 && v.CheckpointRev != v.Before.checkpointRev:
		return ruleWipeCheckpointNew, fmt.Sprintf("the checkpoint record was created at revision %d, and again at %d", v.Before.checkpointRev, v.CheckpointRev)
	}
	return ruleWipeNone, ""
}

// wipeGuard checks round r, just joined (nil: before joining one),
// against what the agent saw before (dataLost) and remembers what it sees
// now. It returns an error
// to end the agent when etcd lost the job's data. It fails open: what it
// cannot read does not stop the job.
func (e *elastic) wipeGuard(ctx context.Context, r *rendezvous.Round) error {
	e.wipe.mu.Lock()
	before := e.wipe.s
	e.wipe.mu.Unlock()
	round := before.round // before a join: no round to compare
	if r != nil {
		round = r.Number
	}
	now := wipeView{Before: before, Round: round}
	octx, cancel := context.WithTimeout(ctx, e.opTimeout())
	defer cancel()
	view, err := fleet.New(e.cli, e.cfg.Prefix).ObserveEtcd(octx)
	if err != nil {
		e.log.Debug("wipe guard: cannot read etcd's epoch", "err", err)
		view = before.etcd
	}
	now.Etcd = view
	if now.CheckpointRev, err = e.checkpointRev(octx); err != nil {
		e.log.Debug("wipe guard: cannot read the checkpoint record", "err", err)
		now.CheckpointRev = before.checkpointRev
	}
	rule, detail := dataLost(now)
	if rule == ruleWipeNone {
		e.wipe.mu.Lock()
		e.wipe.s = wipeState{etcd: e.wipe.s.etcd.Later(view), round: round, checkpointRev: now.CheckpointRev}
		e.wipe.mu.Unlock()
		return nil
	}
	e.log.Error(wipeLogMessage, "rule", rule, "detail", detail, "round", round, "advice", wipeAdvice)
	e.node.Leave(detached(ctx))
	return &ExitError{1, fmt.Errorf(wipeErrorMessagePattern, rule, detail, wipeAdvice)}
}

// checkpointRev reads the create revision of the job's checkpoint record
// (0: none).
func (e *elastic) checkpointRev(ctx context.Context) (int64, error) {
	g, err := e.cli.Get(ctx, e.store.Key(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", e.store.Key(), err)
	}
	if len(g.Kvs) == 0 {
		return 0, nil
	}
	return g.Kvs[0].CreateRevision, nil
}

// sawCommit remembers, after a checkpoint report was committed, the
// record's create revision (the first time) and etcd's revision: a wipe
// before the next round is then found by both.
func (e *elastic) sawCommit(ctx context.Context, r control.Report) {
	if r.Type != control.ReportCheckpoint && r.Type != control.ReportCheckpointUpdate {
		return
	}
	octx, cancel := context.WithTimeout(ctx, e.opTimeout())
	defer cancel()
	g, err := e.cli.Get(octx, e.store.Key(), clientv3.WithKeysOnly())
	if err != nil || len(g.Kvs) == 0 {
		return
	}
	e.wipe.mu.Lock()
	defer e.wipe.mu.Unlock()
	if e.wipe.s.checkpointRev == 0 {
		e.wipe.s.checkpointRev = g.Kvs[0].CreateRevision
	}
	if e.wipe.s.etcd.Revision != 0 {
		e.wipe.s.etcd.Revision = max(e.wipe.s.etcd.Revision, g.Header.Revision)
	}
}

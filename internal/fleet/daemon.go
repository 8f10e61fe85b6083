package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/mirror"

	"github.com/hyperpodrun/hyperpodrun/api"
)

// Assignment is the per-node record of a job placed on a node
// (Keys.Assignment): the job and its desired record's generation. A node
// agent watches its node's assignments, not every desired record.
type Assignment struct {
	Job        string `json:"job"`
	Generation int64  `json:"generation"`
	// UID is the job's own uid (and gid) on every node, allocated by the
	// coordinator from its --job-uid-range (Desired.UID); 0 when none was.
	UID uint32 `json:"uid,omitempty"`
	// Creds are the job's etcd credentials, for this node's agent only
	// (assign/<node>/ is readable by that node's user alone); nil when
	// etcd auth is off.
	Creds *JobCreds `json:"creds,omitempty"`
}

// DecodeAssignment decodes and checks an assignment read from key.
func DecodeAssignment(key string, v []byte) (*Assignment, error) {
	var a Assignment
	if err := json.Unmarshal(v, &a); err != nil {
		return nil, fmt.Errorf("malformed assignment at %s: %w (value %q)", key, err, clip(v))
	}
	if a.Job == "" || path.Base(key) != a.Job {
		return nil, fmt.Errorf("malformed assignment at %s: its job name does not match its key (value %q)", key, clip(v))
	}
	return &a, nil
}

// PutAssignmentOp writes that d's job is placed on node, for the
// transaction that writes d.
func (s *Store) PutAssignmentOp(node string, d Desired) (clientv3.Op, error) {
	return putOp(s.Keys.Assignment(node, d.Job), Assignment{Job: d.Job, Generation: d.Generation, UID: d.UID})
}

// PutAssignmentRecordOp writes an assignment record whole (the
// coordinator's, with the job's uid and its credentials for that node).
func (s *Store) PutAssignmentRecordOp(node string, a Assignment) (clientv3.Op, error) {
	return putOp(s.Keys.Assignment(node, a.Job), a)
}

// DeleteAssignmentOp removes job's assignment to node, for a transaction.
func (s *Store) DeleteAssignmentOp(node, job string) clientv3.Op {
	return clientv3.OpDelete(s.Keys.Assignment(node, job))
}

// Assignments lists node's assignments, and the revision they were read
// at (to watch from the next one); malformed ones are problems.
func (s *Store) Assignments(ctx context.Context, node string) ([]Assignment, []error, int64, error) {
	p := s.Keys.NodeAssignments(node)
	r, err := s.Cli.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, 0, fmt.Errorf("list %s: %w", p, err)
	}
	var out []Assignment
	var bad []error
	for _, kv := range r.Kvs {
		a, err := DecodeAssignment(string(kv.Key), kv.Value)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		out = append(out, *a)
	}
	return out, bad, r.Header.Revision, nil
}

// CoordinatorSnapshot is everything the coordinator keeps in memory, read in one
// transaction (one revision) at start-up and after its watch broke: the
// raw records, decoded by the coordinator as it decodes watch events.
type CoordinatorSnapshot struct {
	// Rev is the revision read at: the coordinator watches from Rev+1.
	Rev                                 int64
	Nodes, Teams, Specs, Finished       []*mvccpb.KeyValue
	Desired, Statuses, Assigned, Events []*mvccpb.KeyValue
	Usage                               []*mvccpb.KeyValue
	// Reports are the nodes' reports not yet processed (reports/).
	Reports []*mvccpb.KeyValue
	// Alive are the nodes' alive keys (alive/).
	Alive []*mvccpb.KeyValue
}

// ReadSnapshot reads every prefix the coordinator keeps, at one revision.
//
// Each prefix is read in pages of 1,000 keys (etcd's client/v3/mirror) at
// the revision of the first read: at 20,000 nodes and 50,000 jobs the
// coordinator's records are about 80 MB, past the client's 64 MiB
// message limit, and one transaction of every prefix failed on every
// retry (a coordinator that had to read the fleet again never could).
func (s *Store) ReadSnapshot(ctx context.Context) (*CoordinatorSnapshot, error) {
	k := s.Keys
	u, err := s.Cli.Get(ctx, k.Usage())
	if err != nil {
		return nil, fmt.Errorf("read the coordinator's records: %w", err)
	}
	rev := u.Header.Revision
	prefixes := []string{k.NodesPrefix(), k.TeamsPrefix(), k.SpecsPrefix(), k.FinishedPrefix(), k.DesiredPrefix(),
		k.StatusPrefix(), k.AssignPrefix(), k.EventsPrefix(), k.ReportsPrefix(), k.AlivePrefix()}
	kvs := make([][]*mvccpb.KeyValue, len(prefixes))
	errs := make([]error, len(prefixes))
	var wg sync.WaitGroup
	for i, p := range prefixes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kvs[i], errs[i] = readPrefixAt(ctx, s.Cli, p, rev)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("read the coordinator's records at revision %d: %w", rev, err)
	}
	return &CoordinatorSnapshot{Rev: rev, Nodes: kvs[0], Teams: kvs[1], Specs: kvs[2], Finished: kvs[3],
		Desired: kvs[4], Statuses: kvs[5], Assigned: kvs[6], Events: kvs[7], Usage: u.Kvs, Reports: kvs[8], Alive: kvs[9]}, nil
}

// readPrefixAt reads every key under prefix at revision rev, in pages.
func readPrefixAt(ctx context.Context, cli *clientv3.Client, prefix string, rev int64) ([]*mvccpb.KeyValue, error) {
	pages, errc := mirror.NewSyncer(cli, prefix, rev).SyncBase(ctx)
	var kvs []*mvccpb.KeyValue
	for r := range pages {
		kvs = append(kvs, r.Kvs...)
	}
	if err := <-errc; err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	return kvs, nil
}

// DecodeSpec decodes and checks a job spec read from key (its name and
// team must match the key).
func DecodeSpec(k Keys, key string, v []byte) (*JobSpec, error) { return specDecoder(k)(key, v) }

// DecodeTeam decodes and checks a team read from key.
func DecodeTeam(key string, v []byte) (*api.Team, error) {
	return jsonNamed(func(t *api.Team) string { return t.Name }, func(t *api.Team) error { return t.Validate() })(key, v)
}

// DecodeStatus decodes a status read from key.
func DecodeStatus(key string, v []byte) (*Status, error) {
	return jsonNamed(func(x *Status) string { return x.Job }, nil)(key, v)
}

// DecodeFinish decodes a finish record read from key.
func DecodeFinish(key string, v []byte) (*Finish, error) {
	var f Finish
	if err := json.Unmarshal(v, &f); err != nil {
		return nil, fmt.Errorf("malformed finish record at %s: %w", ClipKey(key), err)
	}
	return &f, nil
}

// LastGood returns the newest earlier version of kv that dec accepts
// (etcd keeps them until it compacts), for a record that is malformed now.
func LastGood[T any](ctx context.Context, cli *clientv3.Client, kv *mvccpb.KeyValue, dec func(key string, v []byte) (*T, error)) (*T, int64) {
	return lastGood(ctx, cli, kv, decoder[T](dec))
}

// FinishOf reads one job's finish record (nil when it has none); a
// malformed record is a problem, returned beside a nil record.
func (s *Store) FinishOf(ctx context.Context, job string) (f *Finish, problem, err error) {
	key := s.Keys.Finish(job)
	r, err := s.Cli.Get(ctx, key)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", key, err)
	}
	if len(r.Kvs) == 0 {
		return nil, nil, nil
	}
	f, problem = DecodeFinish(key, r.Kvs[0].Value)
	return f, problem, nil
}

// PutEventAtOp writes e at an existing event key (a deduplicated event's
// new count), for a transaction.
func (s *Store) PutEventAtOp(key string, e Event) (clientv3.Op, error) { return putOp(key, e) }

// EventJob is the job an event key names ("" for any other key):
// ParseEventKey's job.
func (k Keys) EventJob(key string) string {
	e, _ := k.ParseEventKey(key)
	return e.Job
}

// ForgetJobOps delete a job whose spec the coordinator removed or never
// had: everything forgetOps deletes, its finish record, its spec (under
// team) and assignments (nodes), for a transaction.
func (s *Store) ForgetJobOps(job, team string) []clientv3.Op {
	ops := append(s.forgetOps(job), clientv3.OpDelete(s.Keys.Finish(job)))
	if team != "" {
		ops = append(ops, clientv3.OpDelete(s.Keys.Spec(team, job)))
	}
	return ops
}

// NoMembers holds while no node is in the job's rendezvous, for a
// transaction's guard.
func (s *Store) NoMembers(job string) clientv3.Cmp { return s.noMembers(job) }

// SpecAbsent holds while team has no spec of job.
func (s *Store) SpecAbsent(team, job string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(s.Keys.Spec(team, job)), "=", 0)
}

// Place writes a job's whole desired record and its per-node assignments
// in one transaction, as the coordinator does: assignments of nodes the
// previous record placed the job on and d does not are deleted, those of
// new nodes written (tests, and tools that stand in for the coordinator).
func (s *Store) Place(ctx context.Context, d Desired) error {
	prev, err := s.Desired(ctx, d.Job)
	if err != nil {
		return err
	}
	op, err := s.PutDesiredOp(d)
	if err != nil {
		return err
	}
	ops := []clientv3.Op{op}
	was := map[string]bool{}
	if prev.Running() {
		for _, n := range prev.Nodes {
			was[n] = true
		}
	}
	now := map[string]bool{}
	if d.Running() {
		for _, n := range d.Nodes {
			now[n] = true
			if !was[n] {
				op, err := s.PutAssignmentOp(n, d)
				if err != nil {
					return err
				}
				ops = append(ops, op)
			}
		}
	}
	for n := range was {
		if !now[n] {
			ops = append(ops, s.DeleteAssignmentOp(n, d.Job))
		}
	}
	if _, err := s.Cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		return fmt.Errorf("place job %s: %w", d.Job, err)
	}
	return nil
}

// TraceParentOrEmpty is the record's traceparent ("" for a nil record).
func (d *Desired) TraceParentOrEmpty() string {
	if d == nil {
		return ""
	}
	return d.TraceParent
}

// TookAway reports whether the record took the job off node: it stops
// the job, or places it on other nodes only. A drain of a node the record
// still places the job on is not the coordinator's (the node agent is
// leaving), so it is not traced under the record's decision.
func (d *Desired) TookAway(node string) bool {
	if d == nil {
		return false
	}
	return d.Stop != nil || !slices.Contains(d.Nodes, node)
}

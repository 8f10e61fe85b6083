package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
)

// The coordinator's other outputs (status, events, usage) and the nodes'
// inventories, as every reader reads them.

// PutStatusOp writes a job's status, for a transaction.
func (s *Store) PutStatusOp(st Status) (clientv3.Op, error) { return putOp(s.Keys.Status(st.Job), st) }

// DeleteStatusOp deletes a job's status, for a transaction.
func (s *Store) DeleteStatusOp(job string) clientv3.Op { return clientv3.OpDelete(s.Keys.Status(job)) }

// PutEventOp writes a decision event, for a transaction.
func (s *Store) PutEventOp(e Event) (clientv3.Op, error) {
	return putOp(s.Keys.Event(e.Time, e.Job), e)
}

// PutUsageOp writes the teams' usage, for a transaction.
func (s *Store) PutUsageOp(u []api.TeamUsage) (clientv3.Op, error) { return putOp(s.Keys.Usage(), u) }

// PutEvent writes one decision event.
func (s *Store) PutEvent(ctx context.Context, e Event) error {
	return s.put(ctx, s.Keys.Event(e.Time, e.Job), e)
}

// ImpliedStatus is the status a job's desired record stands for when the
// job has no status record. The coordinator writes no status while a job
// runs as its desired record places it with nothing more to explain
// (Running at the record's size: no resize under way, no capacity given
// to another job), and deletes the one it had when the job comes to that;
// a status record, when there is one, is the job's status. ok is false
// when the record does not run the job (absent, or a stop record).
func ImpliedStatus(d *Desired) (st Status, ok bool) {
	if !d.Running() {
		return Status{}, false
	}
	t := d.LastResize
	if t.IsZero() {
		t = d.Since
	}
	msg := d.Message
	if msg == "" {
		msg = fmt.Sprintf("running on %d node(s)", d.Size)
	}
	return Status{Reason: api.Reason{Job: d.Job, Team: d.Team, Kind: api.KindRunning, Message: msg, FromSize: d.Size, ToSize: d.Size},
		Time: t, Since: t}, true
}

// StatusOf is a job's status from its two records, as every reader reads
// it: st when the job has a status record, else the status its desired
// record implies (ImpliedStatus); nil when neither says anything.
func StatusOf(st *Status, d *Desired) *Status {
	if st != nil {
		return st
	}
	if s, ok := ImpliedStatus(d); ok {
		return &s
	}
	return nil
}

// Status reads the coordinator's latest decision for a job: its status
// record, or the status its desired record implies (StatusOf), both read
// at one revision. ErrNotFound when neither says anything.
func (s *Store) Status(ctx context.Context, job string) (*Status, error) {
	sk, dk := s.Keys.Status(job), s.Keys.Desired(job)
	r, err := s.Cli.Txn(ctx).Then(clientv3.OpGet(sk), clientv3.OpGet(dk)).Commit()
	if err != nil {
		return nil, fmt.Errorf("read %s and %s: %w", sk, dk, err)
	}
	if kvs := r.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		var st Status
		if err := json.Unmarshal(kvs[0].Value, &st); err != nil {
			return nil, fmt.Errorf("malformed value at %s: %w", ClipKey(sk), err)
		}
		return &st, nil
	}
	if kvs := r.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		d, err := DecodeDesired(dk, kvs[0].Value)
		if err != nil {
			return nil, err
		}
		if st := StatusOf(nil, d); st != nil {
			return st, nil
		}
	}
	return nil, fmt.Errorf("%s: %w", sk, ErrNotFound)
}

// StatusRecord reads a job's status record alone (nil when it has none),
// for a reader that holds the job's desired record already and applies
// StatusOf itself.
func (s *Store) StatusRecord(ctx context.Context, job string) (*Status, error) {
	st, err := getJSON[Status](ctx, s, s.Keys.Status(job))
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	return st, err
}

// Statuses lists every job's latest decision (StatusOf: the status
// records, and the statuses the desired records of the others imply), all
// read at one revision; malformed records are returned as problems.
func (s *Store) Statuses(ctx context.Context) (map[string]Status, []error, error) {
	sp, dp := s.Keys.StatusPrefix(), s.Keys.DesiredPrefix()
	r, err := s.Cli.Txn(ctx).Then(clientv3.OpGet(sp, clientv3.WithPrefix()), clientv3.OpGet(dp, clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, nil, fmt.Errorf("list %s and %s: %w", sp, dp, err)
	}
	st, bad := decodeRecords(ctx, s, r.Responses[0].GetResponseRange().Kvs, jsonNamed(func(x *Status) string { return x.Job }, nil))
	ds, dbad := decodeRecords(ctx, s, r.Responses[1].GetResponseRange().Kvs, DecodeDesired)
	out := make(map[string]Status, len(st)+len(ds))
	for _, x := range st {
		out[x.Job] = x
	}
	for i := range ds {
		if _, has := out[ds[i].Job]; !has {
			if x, ok := ImpliedStatus(&ds[i]); ok {
				out[x.Job] = x
			}
		}
	}
	return out, append(bad, dbad...), nil
}

// Usage reads the teams' usage from the last decision.
func (s *Store) Usage(ctx context.Context) ([]api.TeamUsage, error) {
	u, err := getJSON[[]api.TeamUsage](ctx, s, s.Keys.Usage())
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return *u, nil
}

// PutNodeOp writes a node's inventory, for a transaction (under the agent's
// lease).
func (s *Store) PutNodeOp(inv api.Inventory, opts ...clientv3.OpOption) (clientv3.Op, error) {
	b, err := json.Marshal(inv)
	if err != nil {
		return clientv3.Op{}, fmt.Errorf("encode inventory of %s: %w", inv.Node, err)
	}
	return clientv3.OpPut(s.Keys.Node(inv.Node), string(b), opts...), nil
}

// Nodes lists the node inventories the agents registered.
func (s *Store) Nodes(ctx context.Context) ([]api.Inventory, []error, error) {
	r, err := s.Cli.Get(ctx, s.Keys.NodesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("list nodes: %w", err)
	}
	out, bad := nodesFrom(r.Kvs)
	return out, bad, nil
}

// nodesFrom decodes node inventories; those without a lease or malformed
// are problems.
func nodesFrom(kvs []*mvccpb.KeyValue) ([]api.Inventory, []error) {
	var out []api.Inventory
	var bad []error
	for _, kv := range kvs {
		if kv.Lease == 0 {
			// An inventory counts only while its agent's lease proves the
			// agent alive; one without a lease would never expire.
			bad = append(bad, fmt.Errorf("ignoring %s: a node inventory must be written under its agent's lease", kv.Key))
			continue
		}
		inv, err := api.ParseInventory(string(kv.Key), kv.Value)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		out = append(out, *inv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, bad
}

// Events lists the decision events, oldest first; job "" means all.
// Malformed events are returned as problems.
func (s *Store) Events(ctx context.Context, job string) ([]Event, []error, error) {
	evs, bad, _, err := s.EventsAt(ctx, job)
	return evs, bad, err
}

// EventsAt is Events plus the etcd revision it read at: watching the events
// prefix from the revision after it misses none and repeats none.
func (s *Store) EventsAt(ctx context.Context, job string) ([]Event, []error, int64, error) {
	prefix := s.Keys.EventsPrefix()
	r, err := s.Cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, 0, fmt.Errorf("list %s: %w", prefix, err)
	}
	var out []Event
	var bad []error
	for _, kv := range r.Kvs {
		e, err := DecodeEvent(string(kv.Key), kv.Value)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		if e.Concerns(job) {
			out = append(out, *e)
		}
	}
	return out, bad, r.Header.Revision, nil
}

// DecodeEvent decodes an event read from key.
func DecodeEvent(key string, v []byte) (*Event, error) {
	var e Event
	if err := json.Unmarshal(v, &e); err != nil {
		return nil, fmt.Errorf("malformed event at %s: %w (value %q)", key, err, clip(v))
	}
	return &e, nil
}

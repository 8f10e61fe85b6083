package query

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// EventQuery selects decision events.
type EventQuery struct {
	// Job keeps the events about one job (its own, and those naming it
	// as the job capacity was taken for); "" keeps every job's.
	Job string
	// Since keeps the events at or after this time (zero: all).
	Since time.Time
	// Tail keeps only the newest Tail events (0: all).
	Tail int
}

// QueryEvents reads the events q selects, oldest first, and the revision
// it read at. It reads only what it returns, or little more: Since and an
// unfiltered Tail are key ranges (event keys sort by time); for one job
// the keys are listed without values, and only the job's own events and
// the events of the same decisions (the coordinator writes a decision's
// events with one time, so an event naming the job as the one capacity
// was taken for shares its time with the job's own) are read.
func (s *Store) QueryEvents(ctx context.Context, q EventQuery) ([]fleet.Event, []error, int64, error) {
	prefix := s.Keys.EventsPrefix()
	start := prefix
	if !q.Since.IsZero() {
		start = s.Keys.Event(q.Since, "")
		start = start[:len(start)-1] // drop the "-" so same-nanosecond events are kept
	}
	end := clientv3.GetPrefixRangeEnd(prefix)
	decodeAll := func(kvs []*mvccpb.KeyValue) ([]fleet.Event, []error) {
		var out []fleet.Event
		var bad []error
		for _, kv := range kvs {
			e, err := fleet.DecodeEvent(string(kv.Key), kv.Value)
			if err != nil {
				bad = append(bad, err)
				continue
			}
			if e.Concerns(q.Job) {
				out = append(out, *e)
			}
		}
		return out, bad
	}
	if q.Job == "" {
		opts := []clientv3.OpOption{clientv3.WithRange(end)}
		if q.Tail > 0 {
			opts = append(opts, clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(q.Tail)))
		}
		r, err := s.Cli.Get(ctx, start, opts...)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("list events: %w", err)
		}
		kvs := r.Kvs
		if q.Tail > 0 {
			slicesReverse(kvs)
		}
		out, bad := decodeAll(kvs)
		return out, bad, r.Header.Revision, nil
	}
	allKeys, rev, err := s.eventKeys(ctx, start, end)
	if err != nil {
		return nil, nil, 0, err
	}
	kvs, err := s.eventsOf(ctx, allKeys, rev, q.Job, "")
	if err != nil {
		return nil, nil, 0, err
	}
	out, bad := decodeAll(kvs)
	if q.Tail > 0 && len(out) > q.Tail {
		out = out[len(out)-q.Tail:]
	}
	return out, bad, rev, nil
}

// eventsOf reads, at revision rev, the events of keys (listed without
// values, in order) that are the job's own or of the same decisions (same
// time) and whose keys are not before from.
func (s *Store) eventsOf(ctx context.Context, keys []*mvccpb.KeyValue, rev int64, job, from string) ([]*mvccpb.KeyValue, error) {
	var ops []clientv3.Op
	for _, k := range s.eventKeysOf(keys, job, from) {
		ops = append(ops, clientv3.OpGet(k, clientv3.WithRev(rev)))
	}
	resps, err := s.readAll(ctx, ops)
	if err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	var kvs []*mvccpb.KeyValue
	for _, resp := range resps {
		kvs = append(kvs, resp.GetResponseRange().Kvs...)
	}
	return kvs, nil
}

// eventKeysOf picks, of the event keys listed (in order), those of job's
// own events and of the same decisions (same time), not before from.
func (s *Store) eventKeysOf(keys []*mvccpb.KeyValue, job, from string) []string {
	prefix := []byte(s.Keys.EventsPrefix())
	if from != "" {
		i, _ := slices.BinarySearchFunc(keys, from, func(kv *mvccpb.KeyValue, from string) int { return strings.Compare(string(kv.Key), from) })
		keys = keys[i:]
	}
	stamp := func(key []byte) []byte {
		ts, _, _ := bytes.Cut(bytes.TrimPrefix(key, prefix), []byte("-"))
		return ts
	}
	suffix := []byte("-" + job)
	times := map[string]bool{}
	for _, kv := range keys {
		if bytes.HasSuffix(kv.Key, suffix) {
			times[string(stamp(kv.Key))] = true
		}
	}
	var out []string
	for _, kv := range keys {
		if times[string(stamp(kv.Key))] {
			out = append(out, string(kv.Key))
		}
	}
	return out
}

// readAll runs reads in transactions of at most MaxTxnOps, in parallel,
// and returns their answers in order.
func (s *Store) readAll(ctx context.Context, ops []clientv3.Op) ([]*pb.ResponseOp, error) {
	n := (len(ops) + fleet.MaxTxnOps - 1) / fleet.MaxTxnOps
	parts := make([][]*pb.ResponseOp, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.Cli.Txn(ctx).Then(ops[i*fleet.MaxTxnOps : min(len(ops), (i+1)*fleet.MaxTxnOps)]...).Commit()
			if err != nil {
				errs[i] = err
				return
			}
			parts[i] = r.Responses
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return slices.Concat(parts...), nil
}

// JobDetail is what describing one job reads of etcd.
type JobDetail struct {
	JobRecord
	// History is the decision events about the job (as QueryEvents with
	// Job), oldest first.
	History []fleet.Event
}

// JobHistory reads what describing one job needs of etcd: its records
// (as JobRecords; nil when it has no spec), its problem records, and the
// decision events about it at or after since(its records), which leaves
// out an earlier namesake's history. It reads in two steps: the spec keys
// and the event keys are listed (keys only, at once), then the job's
// records, problems and the events of its decisions are read in one
// transaction (more only past MaxTxnOps events) at the newer listing's
// revision; the events before since are dropped after.
func (s *Store) JobHistory(ctx context.Context, name string, since func(JobRecord) time.Time) (*JobDetail, []error, error) {
	if err := api.ValidateName("job", name); err != nil {
		return nil, nil, err
	}
	var (
		specKeys         map[string]string
		keys             []*mvccpb.KeyValue
		specRev, keysRev int64
		specErr, keysErr error
		wg               sync.WaitGroup
	)
	wg.Add(2)
	go func() { defer wg.Done(); specKeys, specRev, specErr = s.specKeysOf(ctx, []string{name}) }()
	go func() {
		defer wg.Done()
		p := s.Keys.EventsPrefix()
		keys, keysRev, keysErr = s.eventKeys(ctx, p, clientv3.GetPrefixRangeEnd(p))
	}()
	wg.Wait()
	if err := errors.Join(specErr, keysErr); err != nil {
		return nil, nil, err
	}
	specKey, ok := specKeys[name]
	if !ok {
		return nil, nil, nil
	}
	rev := max(specRev, keysRev)
	evKeys := s.eventKeysOf(keys, name, "")
	read := func(opts ...clientv3.OpOption) ([]*pb.ResponseOp, error) {
		opts = append(opts, clientv3.WithRev(rev))
		ops := s.recordOps(name, specKey, opts...)
		for _, k := range evKeys {
			ops = append(ops, clientv3.OpGet(k, opts...))
		}
		return s.readAll(ctx, ops)
	}
	// A read at a revision the listings saw needs no consensus round; a
	// member that has not applied that revision yet refuses it, and the
	// read is made again linearizably (it then waits for that member).
	resps, err := read(clientv3.WithSerializable())
	if errors.Is(rpctypes.Error(err), rpctypes.ErrFutureRev) {
		resps, err = read()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read job %s: %w", name, err)
	}
	rec, ok, bad := s.decodeRecord(resps[:5])
	if !ok {
		return nil, bad, nil
	}
	d := &JobDetail{JobRecord: rec}
	from := ""
	if t := since(rec); !t.IsZero() {
		from = s.Keys.Event(t, "")
		from = from[:len(from)-1] // without the "-": same-nanosecond events are kept
	}
	for _, resp := range resps[5:] {
		for _, kv := range resp.GetResponseRange().Kvs {
			if string(kv.Key) < from {
				continue
			}
			e, err := fleet.DecodeEvent(string(kv.Key), kv.Value)
			if err != nil {
				bad = append(bad, err)
				continue
			}
			if e.Concerns(name) {
				d.History = append(d.History, *e)
			}
		}
	}
	return d, bad, nil
}

// eventKeys lists the keys (without values) of the events in [start, end).
func (s *Store) eventKeys(ctx context.Context, start, end string) ([]*mvccpb.KeyValue, int64, error) {
	kvs, rev, err := s.rangeAt(ctx, start, end, 0, true)
	if err != nil {
		return nil, 0, fmt.Errorf("list events: %w", err)
	}
	return kvs, rev, nil
}

func slicesReverse[T any](s []T) {
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
}

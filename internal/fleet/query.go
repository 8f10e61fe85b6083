package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdraw"
	"github.com/hyperpodrun/hyperpodrun/internal/jsonscan"
)

// MaxTxnOps is etcd's default --max-txn-ops: the most operations (and the
// most comparisons) one transaction may hold. Batched reads and writes stay
// within it.
const MaxTxnOps = 128

// JobRecord is everything elasticctl shows of one job: its spec, the
// coordinator's desired record and latest decision, and its finish record.
// Any but Spec may be nil.
type JobRecord struct {
	Spec     *JobSpec
	Desired  *Desired
	Status   *Status
	Finished *Finish
}

// Snapshot is every job's records read at one etcd revision: watching from
// Revision+1 misses no change and repeats none.
type Snapshot struct {
	// Jobs are sorted by name.
	Jobs    []*JobSpec
	Desired []*Desired
	// Statuses and Finished are by job name.
	Statuses map[string]*Status
	Finished map[string]*Finish
	// Problems are the nodes' problem records, by job name.
	Problems map[string][]Problem
	Revision int64
}

// JobsSnapshot reads every job's spec, desired record, status, finish
// record and the nodes' problem records at one revision. Malformed records are
// returned as problems, as Jobs, DesiredAll, Statuses and Finished do.
func (s *Store) JobsSnapshot(ctx context.Context) (*Snapshot, []error, error) {
	return s.jobsSnapshot(ctx, false)
}

func (s *Store) jobsSnapshot(ctx context.Context, lean bool) (*Snapshot, []error, error) {
	k := s.Keys
	snap := &Snapshot{}
	specDec := specDecoder(k)
	statDec := jsonNamed(func(x *Status) string { return x.Job }, nil)
	type keyedFinish struct {
		job string
		f   Finish
	}
	finDec := func(key string, v []byte) (*keyedFinish, error) {
		var f Finish
		if err := json.Unmarshal(v, &f); err != nil {
			return nil, fmt.Errorf("malformed finish record at %s: %w", ClipKey(key), err)
		}
		return &keyedFinish{strings.TrimPrefix(key, k.FinishedPrefix()), f}, nil
	}
	desDec := decoder[Desired](DecodeDesired)
	if lean {
		specDec = leanOr(leanSpec, func(key string, j *JobSpec) bool {
			team, job, ok := k.SpecOwner(key)
			return ok && job == j.Name && team == j.Team
		}, specDec)
		desDec = leanOr(leanDesired, desiredOK, desDec)
		statDec = leanOr(leanStatus, func(key string, st *Status) bool { return path.Base(key) == st.Job }, statDec)
		finDec = leanOr(func(v []byte) (*keyedFinish, error) {
			f, err := leanFinish(v)
			if err != nil {
				return nil, err
			}
			return &keyedFinish{f: *f}, nil
		}, func(key string, f *keyedFinish) bool {
			f.job = strings.TrimPrefix(key, k.FinishedPrefix())
			return true
		}, finDec)
	}
	// Each list decodes as soon as it is read (tens of thousands of
	// records), while the others are still being read.
	var badSpecs, badDesired, badStatus, badFinish, badProblems []error
	rev, err := s.prefixesAt(ctx, func(i int, kvs []*mvccpb.KeyValue) {
		switch i {
		case 0:
			owned, dup := ownedSpecs(k, kvs)
			snap.Jobs, badSpecs = decodeParallel(owned, specDec)
			badSpecs = append(dup, badSpecs...)
			slices.SortFunc(snap.Jobs, func(a, b *JobSpec) int { return strings.Compare(a.Name, b.Name) })
		case 1:
			snap.Desired, badDesired = decodeParallel(kvs, desDec)
		case 2:
			var statuses []*Status
			statuses, badStatus = decodeParallel(kvs, statDec)
			snap.Statuses = make(map[string]*Status, len(statuses))
			for _, x := range statuses {
				snap.Statuses[x.Job] = x
			}
		case 3:
			var finished []*keyedFinish
			finished, badFinish = decodeParallel(kvs, finDec)
			snap.Finished = make(map[string]*Finish, len(finished))
			for _, x := range finished {
				snap.Finished[x.job] = &x.f
			}
		case 4:
			// Few (a node's trouble with a job): decoded whole.
			snap.Problems, badProblems = map[string][]Problem{}, nil
			for _, kv := range kvs {
				var p Problem
				if err := json.Unmarshal(kv.Value, &p); err != nil {
					badProblems = append(badProblems, fmt.Errorf("malformed problem record at %s: %w", ClipKey(kv.Key), err))
					continue
				}
				snap.Problems[p.Job] = append(snap.Problems[p.Job], p)
			}
		}
	}, k.SpecsPrefix(), k.DesiredPrefix(), k.StatusPrefix(), k.FinishedPrefix(), k.ProblemsPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("list jobs: %w", err)
	}
	snap.Revision = rev
	return snap, append(append(append(append(badSpecs, badDesired...), badStatus...), badFinish...), badProblems...), nil
}

// prefixesAt reads every key under each prefix, all at one revision,
// which it returns, and hands each list to use (with the prefix's index)
// as soon as it is read. The reads run in parallel (etcd serves them on as
// many cores, where one transaction's reads run one after another); a
// read that answered at an older revision than another is read again at
// the newest, and its list handed to use again, after the first round's
// calls have returned.
func (s *Store) prefixesAt(ctx context.Context, use func(i int, kvs []*mvccpb.KeyValue), prefixes ...string) (int64, error) {
	revs := make([]int64, len(prefixes))
	read := func(which []int, at int64) error {
		errs := make([]error, len(prefixes))
		var wg sync.WaitGroup
		for _, i := range which {
			wg.Add(1)
			go func() {
				defer wg.Done()
				kvs, r, err := s.rangeRaw(ctx, prefixes[i], clientv3.GetPrefixRangeEnd(prefixes[i]), at, false)
				if err != nil {
					errs[i] = err
					return
				}
				revs[i] = r
				use(i, kvs)
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	all := make([]int, len(prefixes))
	for i := range all {
		all[i] = i
	}
	if err := read(all, 0); err != nil {
		return 0, err
	}
	rev := slices.Max(revs)
	var stale []int
	for i, r := range revs {
		if r != rev {
			stale = append(stale, i)
		}
	}
	if len(stale) > 0 {
		if err := read(stale, rev); err != nil {
			return 0, err
		}
	}
	return rev, nil
}

// decodeParallel decodes records in chunks on several goroutines, keeping
// their order; undecodable records are problems.
func decodeParallel[T any](kvs []*mvccpb.KeyValue, dec decoder[T]) ([]*T, []error) {
	n := len(kvs)
	workers := min(runtime.GOMAXPROCS(0), max(1, n/512))
	vals := make([]*T, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w * n / workers; i < (w+1)*n/workers; i++ {
				vals[i], errs[i] = dec(string(kvs[i].Key), kvs[i].Value)
			}
		}()
	}
	wg.Wait()
	out := vals[:0]
	var bad []error
	for i := range vals {
		if errs[i] != nil {
			bad = append(bad, errs[i])
			continue
		}
		out = append(out, vals[i])
	}
	return out, bad
}

// JobRecords reads the records of the named jobs only (four keys each, in
// transactions of at most MaxTxnOps reads), at one revision per batch. A
// job without a spec is absent from the map. Malformed records are
// returned as problems.
func (s *Store) JobRecords(ctx context.Context, names []string) (map[string]JobRecord, []error, int64, error) {
	out := make(map[string]JobRecord, len(names))
	var bad []error
	var rev int64
	for _, name := range names {
		if err := api.ValidateName("job", name); err != nil {
			return nil, nil, 0, err
		}
	}
	specKeys, _, err := s.specKeysOf(ctx, names)
	if err != nil {
		return nil, nil, 0, err
	}
	const per = 4
	for len(names) > 0 {
		n := min(len(names), MaxTxnOps/per)
		batch := names[:n]
		names = names[n:]
		var ops []clientv3.Op
		for _, name := range batch {
			ops = append(ops, s.recordOps(name, specKeys[name])...)
		}
		r, err := s.Cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, nil, 0, fmt.Errorf("read jobs: %w", err)
		}
		rev = r.Header.Revision
		for i, name := range batch {
			rec, ok, b := s.decodeRecord(r.Responses[i*per : (i+1)*per])
			bad = append(bad, b...)
			if ok {
				out[name] = rec
			}
		}
	}
	return out, bad, rev, nil
}

// recordOps are the reads of a job's records, in decodeRecord's order
// (an empty specKey reads nothing for the spec).
func (s *Store) recordOps(name, specKey string, opts ...clientv3.OpOption) []clientv3.Op {
	if specKey == "" {
		specKey = s.Keys.Spec("-", name) // no spec: read nothing
	}
	return []clientv3.Op{clientv3.OpGet(specKey, opts...), clientv3.OpGet(s.Keys.Desired(name), opts...),
		clientv3.OpGet(s.Keys.Status(name), opts...), clientv3.OpGet(s.Keys.Finish(name), opts...)}
}

// decodeRecord decodes the answers to recordOps; ok is false when the job
// has no (good) spec.
func (s *Store) decodeRecord(resps []*pb.ResponseOp) (rec JobRecord, ok bool, bad []error) {
	get := func(k int) *mvccpb.KeyValue {
		kvs := resps[k].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return nil
		}
		return kvs[0]
	}
	kv := get(0)
	if kv == nil {
		return rec, false, nil
	}
	spec, err := specDecoder(s.Keys)(string(kv.Key), kv.Value)
	if err != nil {
		return rec, false, []error{err}
	}
	rec.Spec = spec
	if kv := get(1); kv != nil {
		if d, err := DecodeDesired(string(kv.Key), kv.Value); err != nil {
			bad = append(bad, err)
		} else {
			rec.Desired = d
		}
	}
	if kv := get(2); kv != nil {
		if st, err := jsonNamed(func(x *Status) string { return x.Job }, nil)(string(kv.Key), kv.Value); err != nil {
			bad = append(bad, err)
		} else {
			rec.Status = st
		}
	}
	if kv := get(3); kv != nil {
		var f Finish
		if err := json.Unmarshal(kv.Value, &f); err != nil {
			bad = append(bad, fmt.Errorf("malformed finish record at %s: %w", ClipKey(kv.Key), err))
		} else {
			rec.Finished = &f
		}
	}
	return rec, true, bad
}

// specKeysOf is specKeys for a few names of many jobs: the keys-only
// listing is decoded by rangeRaw, and only the keys of the named jobs are
// looked at.
func (s *Store) specKeysOf(ctx context.Context, names []string) (map[string]string, int64, error) {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	p := s.Keys.SpecsPrefix()
	all, rev, err := s.rangeRaw(ctx, p, clientv3.GetPrefixRangeEnd(p), 0, true)
	if err != nil {
		return nil, 0, fmt.Errorf("list %s: %w", p, err)
	}
	var named []*mvccpb.KeyValue
	for _, kv := range all {
		if want[string(kv.Key[bytes.LastIndexByte(kv.Key, '/')+1:])] {
			named = append(named, kv)
		}
	}
	kvs, _ := ownedSpecs(s.Keys, named)
	out := make(map[string]string, len(names))
	for _, kv := range kvs {
		if _, job, ok := s.Keys.SpecOwner(string(kv.Key)); ok && want[job] {
			out[job] = string(kv.Key)
		}
	}
	return out, rev, nil
}

// JobOfKey names the job a spec, desired, status or finish record key
// belongs to ("" for any other key).
func (k Keys) JobOfKey(key string) string {
	if _, job, ok := k.SpecOwner(key); ok {
		return job
	}
	for _, p := range []string{k.DesiredPrefix(), k.StatusPrefix(), k.FinishedPrefix()} {
		if name, ok := strings.CutPrefix(key, p); ok && !strings.Contains(name, "/") {
			return name
		}
	}
	return ""
}

// WatchJobs reports, from revision rev on, the names of the jobs whose
// spec, desired record, status or finish record changed, one batch per
// etcd revision (names sorted, without repeats). The channel closes when
// ctx ends or a watch fails (the error is then sent on errc first).
func (s *Store) WatchJobs(ctx context.Context, rev int64) (<-chan []string, <-chan error) {
	return s.watchNames(ctx, rev, s.Keys.JobOfKey, s.Keys.SpecsPrefix(), s.Keys.DesiredPrefix(), s.Keys.StatusPrefix(), s.Keys.FinishedPrefix())
}

// WatchNodes reports, from revision rev on, the names of the nodes whose
// inventory was written or expired.
func (s *Store) WatchNodes(ctx context.Context, rev int64) (<-chan []string, <-chan error) {
	p := s.Keys.NodesPrefix()
	return s.watchNames(ctx, rev, func(key string) string { return strings.TrimPrefix(key, p) }, p)
}

// WatchTeams reports, from revision rev on, that a team record or the
// teams' usage changed (the names are those of changed teams; "" stands
// for the usage record).
func (s *Store) WatchTeams(ctx context.Context, rev int64) (<-chan []string, <-chan error) {
	p := s.Keys.TeamsPrefix()
	return s.watchNames(ctx, rev, func(key string) string { return strings.TrimPrefix(key, p) }, p, s.Keys.Usage())
}

func (s *Store) watchNames(ctx context.Context, rev int64, name func(string) string, prefixes ...string) (<-chan []string, <-chan error) {
	out := make(chan []string, 16)
	errc := make(chan error, 1)
	ctx, cancel := context.WithCancel(ctx)
	type batch struct {
		names []string
		err   error
	}
	in := make(chan batch)
	for _, p := range prefixes {
		w := s.Cli.Watch(clientv3.WithRequireLeader(ctx), p, clientv3.WithPrefix(), clientv3.WithRev(rev))
		go func() {
			for resp := range w {
				if err := resp.Err(); err != nil {
					select {
					case in <- batch{err: fmt.Errorf("watch: %w", err)}:
					case <-ctx.Done():
					}
					return
				}
				seen := map[string]bool{}
				var names []string
				for _, ev := range resp.Events {
					if n := name(string(ev.Kv.Key)); !seen[n] && (n != "" || p == s.Keys.Usage()) {
						seen[n] = true
						names = append(names, n)
					}
				}
				sort.Strings(names)
				if len(names) > 0 {
					select {
					case in <- batch{names: names}:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
	}
	go func() {
		defer close(out)
		defer cancel()
		for {
			select {
			case <-ctx.Done():
				return
			case b := <-in:
				if b.err != nil {
					errc <- b.err
					return
				}
				select {
				case out <- b.names:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, errc
}

// NodesAt is Nodes plus the revision it read at.
func (s *Store) NodesAt(ctx context.Context) ([]api.Inventory, []error, int64, error) {
	r, err := s.Cli.Get(ctx, s.Keys.NodesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, 0, fmt.Errorf("list nodes: %w", err)
	}
	nodes, bad := nodesFrom(r.Kvs)
	return nodes, bad, r.Header.Revision, nil
}

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
func (s *Store) QueryEvents(ctx context.Context, q EventQuery) ([]Event, []error, int64, error) {
	prefix := s.Keys.EventsPrefix()
	start := prefix
	if !q.Since.IsZero() {
		start = s.Keys.Event(q.Since, "")
		start = start[:len(start)-1] // drop the "-" so same-nanosecond events are kept
	}
	end := clientv3.GetPrefixRangeEnd(prefix)
	decodeAll := func(kvs []*mvccpb.KeyValue) ([]Event, []error) {
		var out []Event
		var bad []error
		for _, kv := range kvs {
			e, err := DecodeEvent(string(kv.Key), kv.Value)
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
	n := (len(ops) + MaxTxnOps - 1) / MaxTxnOps
	parts := make([][]*pb.ResponseOp, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.Cli.Txn(ctx).Then(ops[i*MaxTxnOps : min(len(ops), (i+1)*MaxTxnOps)]...).Commit()
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
	// Problems are the nodes' problem records of the job (as Problems).
	Problems []Problem
	// History is the decision events about the job (as QueryEvents with
	// Job), oldest first.
	History []Event
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
		ops := append(s.recordOps(name, specKey, opts...), clientv3.OpGet(s.Keys.Problems(name), append(opts, clientv3.WithPrefix())...))
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
	rec, ok, bad := s.decodeRecord(resps[:4])
	if !ok {
		return nil, bad, nil
	}
	d := &JobDetail{JobRecord: rec}
	for _, kv := range resps[4].GetResponseRange().Kvs {
		var p Problem
		if err := json.Unmarshal(kv.Value, &p); err != nil {
			bad = append(bad, fmt.Errorf("malformed problem record at %s: %w", ClipKey(kv.Key), err))
			continue
		}
		d.Problems = append(d.Problems, p)
	}
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
			e, err := DecodeEvent(string(kv.Key), kv.Value)
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
	kvs, rev, err := s.rangeRaw(ctx, start, end, 0, true)
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

// ErrJobsExist is returned (wrapped, naming the jobs) by SubmitJobs when
// a job of the batch exists already.
var ErrJobsExist = errors.New("already exist")

// SubmitJobs stores new jobs as SubmitJob does, all or none: when they fit
// one transaction (MaxTxnOps) they are written in one; a larger batch is
// written in consecutive transactions, and when one of those fails the
// jobs the earlier ones wrote are deleted again (unless changed since), so
// no partial batch stays. The jobs that exist already are named in the
// error, which wraps ErrJobsExist.
func (s *Store) SubmitJobs(ctx context.Context, jobs []JobSpec) error {
	type written struct {
		key string
		rev int64
	}
	var done []written
	rollback := func() {
		for _, w := range done {
			_, _ = s.Cli.Txn(context.WithoutCancel(ctx)).If(clientv3.Compare(clientv3.ModRevision(w.key), "=", w.rev)).
				Then(clientv3.OpDelete(w.key)).Commit()
		}
	}
	names := make([]string, len(jobs))
	for i, j := range jobs {
		if err := api.ValidateName("job", j.Name); err != nil {
			return err
		}
		if err := api.ValidateName("team", j.Team); err != nil {
			return fmt.Errorf("job %q: %w", j.Name, err)
		}
		names[i] = j.Name
	}
	// Names are unique across teams.
	owners, err := s.specKeys(ctx, names)
	if err != nil {
		return fmt.Errorf("submit jobs: %w", err)
	}
	var taken []string
	for _, j := range jobs {
		if key, ok := owners[j.Name]; ok {
			if t, _, _ := s.Keys.SpecOwner(key); t != j.Team {
				taken = append(taken, fmt.Sprintf("%q (team %q has it)", j.Name, t))
			}
		}
	}
	if len(taken) > 0 {
		return fmt.Errorf("job names are unique across teams and %s %s: nothing was submitted; choose other names: %w",
			strings.Join(taken, ", "), map[bool]string{true: "is taken", false: "are taken"}[len(taken) == 1], ErrJobsExist)
	}
	// wipe: also delete what earlier jobs of these names left, which a
	// team's role may not (auth on); then the batch waits for the
	// coordinator to have forgotten them instead.
	wipe := true
	for i := 0; i < len(jobs); {
		per := MaxTxnOps / (1 + len(s.forgetOps(""))) // put + forgetOps' deletes; or 4 compares
		if !wipe {
			per = MaxTxnOps / (1 + len(s.forgottenCmps("")))
		}
		batch := jobs[i:min(len(jobs), i+per)]
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for _, j := range batch {
			key := s.Keys.Spec(j.Team, j.Name)
			op, err := putOp(key, j)
			if err != nil {
				rollback()
				return err
			}
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
			ops = append(ops, op)
			if wipe {
				cmps = append(cmps, s.noMembers(j.Name))
				ops = append(ops, s.forgetOps(j.Name)...)
			} else {
				cmps = append(cmps, s.forgottenCmps(j.Name)...)
			}
		}
		r, err := s.Cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if wipe && IsPermissionDenied(err) {
			wipe = false
			continue
		}
		if err != nil {
			rollback()
			return fmt.Errorf("submit jobs: %w", err)
		}
		if !r.Succeeded {
			rollback()
			return s.whyNotSubmitted(ctx, jobs)
		}
		for _, j := range batch {
			done = append(done, written{s.Keys.Spec(j.Team, j.Name), r.Header.Revision})
		}
		i += len(batch)
	}
	return nil
}

// whyNotSubmitted names the jobs of a refused batch that exist, or those
// whose earlier namesake is still leaving its nodes.
func (s *Store) whyNotSubmitted(ctx context.Context, jobs []JobSpec) error {
	var exist, leaving []string
	for i := 0; i < len(jobs); i += MaxTxnOps / 2 {
		batch := jobs[i:min(len(jobs), i+MaxTxnOps/2)]
		var ops []clientv3.Op
		for _, j := range batch {
			ops = append(ops, clientv3.OpGet(s.Keys.Spec(j.Team, j.Name), clientv3.WithCountOnly()),
				clientv3.OpGet(s.Keys.Rdzv(j.Name).Members, clientv3.WithPrefix(), clientv3.WithCountOnly()))
		}
		r, err := s.Cli.Txn(ctx).Then(ops...).Commit()
		if IsPermissionDenied(err) {
			// A team's role may not read jobs/: an earlier job of the
			// name is leaving while the coordinator keeps its desired
			// record (it deletes it once no node is left).
			ops = ops[:0]
			for _, j := range batch {
				ops = append(ops, clientv3.OpGet(s.Keys.Spec(j.Team, j.Name), clientv3.WithCountOnly()),
					clientv3.OpGet(s.Keys.Desired(j.Name), clientv3.WithCountOnly()))
			}
			r, err = s.Cli.Txn(ctx).Then(ops...).Commit()
		}
		if err != nil {
			return fmt.Errorf("submit jobs: %w", err)
		}
		for k, j := range batch {
			switch {
			case r.Responses[2*k].GetResponseRange().Count > 0:
				exist = append(exist, j.Name)
			case r.Responses[2*k+1].GetResponseRange().Count > 0:
				leaving = append(leaving, j.Name)
			}
		}
	}
	if len(exist) > 0 {
		return fmt.Errorf("%s %w: nothing was submitted; delete them first, choose other names, or use 'elasticctl apply -f' to update them",
			jobList(exist), ErrJobsExist)
	}
	if len(leaving) > 0 {
		return fmt.Errorf("an earlier job named %s is still leaving its nodes: nothing was submitted; try again in a few seconds", strings.Join(quoteAll(leaving), ", "))
	}
	return errors.New("the jobs changed while they were submitted: nothing was submitted; try again")
}

func quoteAll(names []string) []string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return q
}

func jobList(names []string) string {
	if len(names) == 1 {
		return "job " + strconv.Quote(names[0])
	}
	const shown = 5
	q := quoteAll(names)
	if len(q) > shown {
		return fmt.Sprintf("jobs %s and %d more", strings.Join(q[:shown], ", "), len(q)-shown)
	}
	return "jobs " + strings.Join(q, ", ")
}

// ApplyResult is what ApplyJobs did to one job.
type ApplyResult string

// ApplyJobs results.
const (
	Created   ApplyResult = "created"
	Unchanged ApplyResult = "unchanged"
	Updated   ApplyResult = "configured"
)

// ApplyJobs creates the jobs that do not exist and updates those that do
// (keeping their submit time, so their place in the queue), leaving equal
// ones untouched: applying one file twice changes nothing the second time.
// Each job is written with a compare on its revision (a concurrent change
// is retried). A job's submit time, when the file leaves it out, is the
// stored one, or now for a new job.
func (s *Store) ApplyJobs(ctx context.Context, jobs []JobSpec, now time.Time) ([]ApplyResult, error) {
	res := make([]ApplyResult, len(jobs))
	for i, j := range jobs {
		for {
			if err := api.ValidateName("team", j.Team); err != nil {
				return res, fmt.Errorf("job %q: %w", j.Name, err)
			}
			key := s.Keys.Spec(j.Team, j.Name)
			r, err := s.Cli.Get(ctx, key)
			if err != nil {
				return res, fmt.Errorf("read job %q: %w", j.Name, err)
			}
			if len(r.Kvs) == 0 {
				if j.SubmitTime.IsZero() {
					j.SubmitTime = now
				}
				err := s.SubmitJob(ctx, j)
				if err != nil {
					return res, err
				}
				res[i] = Created
				break
			}
			var old JobSpec
			if err := json.Unmarshal(r.Kvs[0].Value, &old); err != nil {
				old = JobSpec{} // a malformed spec is replaced
			}
			if j.SubmitTime.IsZero() {
				j.SubmitTime = old.SubmitTime
			}
			a, _ := json.Marshal(old)
			b, _ := json.Marshal(j)
			if string(a) == string(b) {
				res[i] = Unchanged
				break
			}
			op, err := putOp(key, j)
			if err != nil {
				return res, err
			}
			tr, err := s.Cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", r.Kvs[0].ModRevision)).Then(op).Commit()
			if err != nil {
				return res, fmt.Errorf("write job %q: %w", j.Name, err)
			}
			if tr.Succeeded {
				res[i] = Updated
				break
			}
		}
	}
	return res, nil
}

// JobsListing is JobsSnapshot for a listing of jobs (elasticctl get jobs
// as a table): it decodes only the fields a listing shows, and returns
// records with every other field zero. A spec holds its name, team,
// priority, priority class, flavor, node bounds, sizes, elastic and
// suspended flags and submit time; a desired record its job, team, size,
// nodes, generation and stop; a status its job, team, kind, code,
// message, size (toSize) and since; a finish record its outcome, node and message. A record the
// lean reader (package jsonscan) cannot take (syntax, a listed field of the wrong type, an
// escaped member name) is decoded whole as JobsSnapshot does, so a
// malformed record is the same problem with the same words; only a field
// the listing does not read is not checked for its type (a spec whose
// run.args is a number is listed, where JobsSnapshot reports it). At
// 10,000 jobs this is a third of JobsSnapshot's decoding time.
func (s *Store) JobsListing(ctx context.Context) (*Snapshot, []error, error) {
	return s.jobsSnapshot(ctx, true)
}

// leanOr decodes with lean where it can and the record passes ok (the
// checks of full, which words the problem where one fails), else with
// full.
func leanOr[T any](lean func(v []byte) (*T, error), ok func(key string, x *T) bool, full decoder[T]) decoder[T] {
	return func(key string, v []byte) (*T, error) {
		if x, err := lean(v); err == nil && ok(key, x) {
			return x, nil
		}
		return full(key, v)
	}
}

// desiredOK is whether DecodeDesired would accept d read from key.
func desiredOK(key string, d *Desired) bool {
	switch {
	case d.Job == "" || path.Base(key) != d.Job, d.Generation < 0:
		return false
	case d.Stop != nil:
		return d.Size == 0 && len(d.Nodes) == 0 && (d.Stop.Kind == StopPreemption || d.Stop.Kind == StopShutdown)
	}
	return d.Size >= 1 && (len(d.Nodes) == 0 || len(d.Nodes) == d.Size)
}

// leanSpec reads a spec's listing fields.
func leanSpec(v []byte) (*JobSpec, error) {
	var j JobSpec
	err := jsonscan.Members(v, func(name, raw []byte) error {
		switch string(name) {
		case "name":
			return jsonscan.String(raw, &j.Name)
		case "team":
			return jsonscan.String(raw, &j.Team)
		case "priority":
			if string(raw) == "null" {
				j.Priority = nil
				return nil
			}
			p := new(int)
			j.Priority = p
			return jsonscan.Int(raw, p)
		case "priorityClass":
			return jsonscan.String(raw, &j.PriorityClass)
		case "flavor":
			return jsonscan.String(raw, &j.Flavor)
		case "minNodes":
			return jsonscan.Int(raw, &j.MinNodes)
		case "maxNodes":
			return jsonscan.Int(raw, &j.MaxNodes)
		case "sizes":
			return jsonscan.JSON(raw, &j.Sizes)
		case "elastic":
			return jsonscan.Bool(raw, &j.Elastic)
		case "suspended":
			return jsonscan.Bool(raw, &j.Suspended)
		case "submitTime":
			return j.SubmitTime.UnmarshalJSON(raw)
		}
		return jsonscan.NotFolded(name, "name", "team", "priority", "priorityClass", "flavor", "minNodes", "maxNodes", "sizes", "elastic", "suspended", "submitTime")
	})
	return &j, err
}

// leanDesired reads a desired record's listing fields (and those its
// checks need).
func leanDesired(v []byte) (*Desired, error) {
	var d Desired
	err := jsonscan.Members(v, func(name, raw []byte) error {
		switch string(name) {
		case "job":
			return jsonscan.String(raw, &d.Job)
		case "team":
			return jsonscan.String(raw, &d.Team)
		case "size":
			return jsonscan.Int(raw, &d.Size)
		case "nodes":
			return jsonscan.Strings(raw, &d.Nodes)
		case "generation":
			var g int
			err := jsonscan.Int(raw, &g)
			d.Generation = int64(g)
			return err
		case "stop":
			return jsonscan.JSON(raw, &d.Stop)
		}
		return jsonscan.NotFolded(name, "job", "team", "size", "nodes", "generation", "stop")
	})
	return &d, err
}

// leanStatus reads a status's listing fields.
func leanStatus(v []byte) (*Status, error) {
	var st Status
	err := jsonscan.Members(v, func(name, raw []byte) error {
		switch string(name) {
		case "job":
			return jsonscan.String(raw, &st.Job)
		case "team":
			return jsonscan.String(raw, &st.Team)
		case "kind":
			return jsonscan.String(raw, (*string)(&st.Kind))
		case "code":
			return jsonscan.String(raw, (*string)(&st.Code))
		case "message":
			return jsonscan.String(raw, &st.Message)
		case "toSize":
			return jsonscan.Int(raw, &st.ToSize)
		case "since":
			return st.Since.UnmarshalJSON(raw)
		}
		return jsonscan.NotFolded(name, "job", "team", "kind", "code", "message", "toSize", "since")
	})
	return &st, err
}

// leanFinish reads a finish record's listing fields.
func leanFinish(v []byte) (*Finish, error) {
	var f Finish
	err := jsonscan.Members(v, func(name, raw []byte) error {
		switch string(name) {
		case "outcome":
			return jsonscan.String(raw, &f.Outcome)
		case "node":
			return jsonscan.String(raw, &f.Node)
		case "message":
			return jsonscan.String(raw, &f.Message)
		}
		return jsonscan.NotFolded(name, "outcome", "node", "message")
	})
	return &f, err
}

// rangeRaw is Get for the large reads of elasticctl (every job's records,
// every event key), decoded without copying by package etcdraw. The call
// goes through the client's connection, so its interceptors
// (authentication token, retries) and call options apply.
func (s *Store) rangeRaw(ctx context.Context, key, end string, rev int64, keysOnly bool) ([]*mvccpb.KeyValue, int64, error) {
	req := &pb.RangeRequest{Key: []byte(key), RangeEnd: []byte(end), Revision: rev, KeysOnly: keysOnly}
	return etcdraw.Range(ctx, s.Cli.ActiveConnection(), req)
}

// QueueState is what finding a pending job's place in the queues reads:
// every job's status (its listing fields, as JobsListing decodes them)
// and every job's spec, undecoded until Specs asks for some, at one
// revision.
type QueueState struct {
	Statuses map[string]*Status
	Revision int64
	specs    map[string]*mvccpb.KeyValue
	dec      decoder[JobSpec]
}

// QueueState reads the statuses and specs of every job at one revision
// (in parallel); malformed statuses and specs under a younger namesake's
// key are problems.
func (s *Store) QueueState(ctx context.Context) (*QueueState, []error, error) {
	k := s.Keys
	q := &QueueState{dec: specDecoder(k)}
	statDec := leanOr(leanStatus, func(key string, st *Status) bool { return path.Base(key) == st.Job },
		jsonNamed(func(x *Status) string { return x.Job }, nil))
	var badStatus, badSpecs []error
	rev, err := s.prefixesAt(ctx, func(i int, kvs []*mvccpb.KeyValue) {
		switch i {
		case 0:
			var list []*Status
			list, badStatus = decodeParallel(kvs, statDec)
			q.Statuses = make(map[string]*Status, len(list))
			for _, x := range list {
				q.Statuses[x.Job] = x
			}
		case 1:
			owned, dup := ownedSpecs(k, kvs)
			badSpecs = dup
			q.specs = make(map[string]*mvccpb.KeyValue, len(owned))
			for _, kv := range owned {
				if _, job, ok := k.SpecOwner(string(kv.Key)); ok {
					q.specs[job] = kv
				}
			}
		}
	}, k.StatusPrefix(), k.SpecsPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("read the queues: %w", err)
	}
	q.Revision = rev
	return q, append(badStatus, badSpecs...), nil
}

// Specs decodes the specs of the named jobs (in parallel); a job without
// a spec is left out, a malformed spec is a problem.
func (q *QueueState) Specs(names []string) (map[string]*JobSpec, []error) {
	var kvs []*mvccpb.KeyValue
	for _, n := range names {
		if kv, ok := q.specs[n]; ok {
			kvs = append(kvs, kv)
		}
	}
	list, bad := decodeParallel(kvs, q.dec)
	out := make(map[string]*JobSpec, len(list))
	for _, j := range list {
		out[j.Name] = j
	}
	return out, bad
}

// DesiredAt reads the desired records of the named jobs at revision rev,
// serializably (a member that has not applied rev yet refuses, and the
// read is made again linearizably). Jobs without one are left out;
// malformed ones are problems.
func (s *Store) DesiredAt(ctx context.Context, names []string, rev int64) (map[string]*Desired, []error, error) {
	read := func(opts ...clientv3.OpOption) ([]*pb.ResponseOp, error) {
		ops := make([]clientv3.Op, len(names))
		for i, n := range names {
			ops[i] = clientv3.OpGet(s.Keys.Desired(n), append(opts, clientv3.WithRev(rev))...)
		}
		return s.readAll(ctx, ops)
	}
	resps, err := read(clientv3.WithSerializable())
	if errors.Is(rpctypes.Error(err), rpctypes.ErrFutureRev) {
		resps, err = read()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read desired records: %w", err)
	}
	out := make(map[string]*Desired, len(names))
	var bad []error
	for _, r := range resps {
		for _, kv := range r.GetResponseRange().Kvs {
			d, err := DecodeDesired(string(kv.Key), kv.Value)
			if err != nil {
				bad = append(bad, err)
				continue
			}
			out[d.Job] = d
		}
	}
	return out, bad, nil
}

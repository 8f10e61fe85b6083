// Package query is elasticctl's reading of the fleet: every job's records
// at one revision (and their lean listing), a few jobs' records, a job's
// history, the decision events, the queues' state, and watches that name
// what changed. It reads etcd through package fleet's layout (Keys) and
// decoders; the writes other programs share stay in fleet. It lives under
// cmd/elasticctl because elasticctl is its only user.
package query

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// Store reads the fleet for elasticctl: a fleet.Store (its layout, reads
// and writes) with elasticctl's queries.
type Store struct {
	*fleet.Store
}

// New returns the queries over st.
func New(st *fleet.Store) *Store { return &Store{Store: st} }

// decoder decodes and checks one record read from key.
type decoder[T any] func(key string, v []byte) (*T, error)

// specDecoder is fleet.DecodeSpec for the keys k.
func specDecoder(k fleet.Keys) decoder[fleet.JobSpec] {
	return func(key string, v []byte) (*fleet.JobSpec, error) { return fleet.DecodeSpec(k, key, v) }
}

// JobRecord is everything elasticctl shows of one job: its spec, the
// coordinator's desired record and latest decision, and its finish record.
// Any but Spec may be nil.
type JobRecord struct {
	Spec     *fleet.JobSpec
	Desired  *fleet.Desired
	Status   *fleet.Status
	Finished *fleet.Finish
	// Problems are the nodes' problem records of the job (a node that
	// cannot start it, or whose hyperpodrun keeps failing: Restarting).
	Problems []fleet.Problem
}

// Snapshot is every job's records read at one etcd revision: watching from
// Revision+1 misses no change and repeats none.
type Snapshot struct {
	// Jobs are sorted by name.
	Jobs    []*fleet.JobSpec
	Desired []*fleet.Desired
	// Statuses and Finished are by job name.
	Statuses map[string]*fleet.Status
	Finished map[string]*fleet.Finish
	// Problems are the nodes' problem records, by job name.
	Problems map[string][]fleet.Problem
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
	specDec, desDec, statDec, finDec := specDecoder(k), decoder[fleet.Desired](fleet.DecodeDesired), decoder[fleet.Status](fleet.DecodeStatus), decodeFinish
	if lean {
		specDec, desDec, statDec = leanSpecDecoder(k), leanDesiredDecoder(), leanStatusDecoder()
		finDec = leanOr(leanFinish, func(string, *fleet.Finish) bool { return true }, finDec)
	}
	// Each list decodes as soon as it is read (tens of thousands of
	// records), while the others are still being read.
	var badSpecs, badDesired, badStatus, badFinish, badProblems []error
	rev, err := s.prefixesAt(ctx, func(i int, kvs []*mvccpb.KeyValue) {
		switch i {
		case 0:
			owned, dup := k.OwnedSpecs(kvs)
			snap.Jobs, badSpecs = decodeParallel(owned, specDec)
			badSpecs = append(dup, badSpecs...)
			slices.SortFunc(snap.Jobs, func(a, b *fleet.JobSpec) int { return strings.Compare(a.Name, b.Name) })
		case 1:
			snap.Desired, badDesired = decodeParallel(kvs, desDec)
		case 2:
			snap.Statuses, badStatus = byName(kvs, statDec, func(_ string, st *fleet.Status) string { return st.Job })
		case 3:
			snap.Finished, badFinish = byName(kvs, finDec, func(key string, _ *fleet.Finish) string { return strings.TrimPrefix(key, k.FinishedPrefix()) })
		case 4:
			// Few (a node's trouble with a job): decoded whole.
			var problems []fleet.Problem
			problems, badProblems = decodeProblems(kvs)
			snap.Problems = map[string][]fleet.Problem{}
			for _, p := range problems {
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
				kvs, r, err := s.rangeAt(ctx, prefixes[i], clientv3.GetPrefixRangeEnd(prefixes[i]), at, false)
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

// byName decodes records as decodeParallel does, into a map by the name
// each one's key and record give.
func byName[T any](kvs []*mvccpb.KeyValue, dec decoder[T], name func(key string, x *T) string) (map[string]*T, []error) {
	keyed := func(key string, v []byte) (*keyed[T], error) {
		x, err := dec(key, v)
		if err != nil {
			return nil, err
		}
		return &keyed[T]{name(key, x), x}, nil
	}
	list, bad := decodeParallel(kvs, keyed)
	out := make(map[string]*T, len(list))
	for _, x := range list {
		out[x.name] = x.x
	}
	return out, bad
}

// keyed is a decoded record and its name.
type keyed[T any] struct {
	name string
	x    *T
}

// decodeFinish decodes a finish record read from key.
func decodeFinish(key string, v []byte) (*fleet.Finish, error) {
	var f fleet.Finish
	if err := json.Unmarshal(v, &f); err != nil {
		return nil, fmt.Errorf("malformed finish record at %s: %w", fleet.ClipKey(key), err)
	}
	return &f, nil
}

// decodeProblems decodes problem records, in order; malformed ones are
// problems of their own.
func decodeProblems(kvs []*mvccpb.KeyValue) ([]fleet.Problem, []error) {
	var out []fleet.Problem
	var bad []error
	for _, kv := range kvs {
		var p fleet.Problem
		if err := json.Unmarshal(kv.Value, &p); err != nil {
			bad = append(bad, fmt.Errorf("malformed problem record at %s: %w", fleet.ClipKey(kv.Key), err))
			continue
		}
		out = append(out, p)
	}
	return out, bad
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

// JobRecords reads the records of the named jobs only (four keys and the
// problem records each, in transactions of at most MaxTxnOps reads), at one
// revision per batch. A job without a spec is absent from the map.
// Malformed records are returned as problems.
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
	const per = 5
	for len(names) > 0 {
		n := min(len(names), fleet.MaxTxnOps/per)
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
		clientv3.OpGet(s.Keys.Status(name), opts...), clientv3.OpGet(s.Keys.Finish(name), opts...),
		clientv3.OpGet(s.Keys.Problems(name), append(opts[:len(opts):len(opts)], clientv3.WithPrefix())...)}
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
	bad = decodeInto(get(1), fleet.DecodeDesired, &rec.Desired, bad)
	bad = decodeInto(get(2), fleet.DecodeStatus, &rec.Status, bad)
	bad = decodeInto(get(3), decodeFinish, &rec.Finished, bad)
	problems, pbad := decodeProblems(resps[4].GetResponseRange().Kvs)
	rec.Problems = problems
	return rec, true, append(bad, pbad...)
}

// decodeInto decodes kv (nil: absent, nothing to do) into *to, or adds
// its problem to bad.
func decodeInto[T any](kv *mvccpb.KeyValue, dec decoder[T], to **T, bad []error) []error {
	if kv == nil {
		return bad
	}
	x, err := dec(string(kv.Key), kv.Value)
	if err != nil {
		return append(bad, err)
	}
	*to = x
	return bad
}

// specKeysOf is specKeys for a few names of many jobs: the keys-only
// listing is read once, and only the keys of the named jobs are
// looked at.
func (s *Store) specKeysOf(ctx context.Context, names []string) (map[string]string, int64, error) {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	p := s.Keys.SpecsPrefix()
	all, rev, err := s.rangeAt(ctx, p, clientv3.GetPrefixRangeEnd(p), 0, true)
	if err != nil {
		return nil, 0, fmt.Errorf("list %s: %w", p, err)
	}
	var named []*mvccpb.KeyValue
	for _, kv := range all {
		if want[string(kv.Key[bytes.LastIndexByte(kv.Key, '/')+1:])] {
			named = append(named, kv)
		}
	}
	kvs, _ := s.Keys.OwnedSpecs(named)
	out := make(map[string]string, len(names))
	for _, kv := range kvs {
		if _, job, ok := s.Keys.SpecOwner(string(kv.Key)); ok && want[job] {
			out[job] = string(kv.Key)
		}
	}
	return out, rev, nil
}

// WatchJobs reports, from revision rev on, the names of the jobs whose
// spec, desired record, status, finish record or problem records changed,
// one batch per etcd revision (names sorted, without repeats). The channel
// closes when ctx ends or a watch fails (the error is then sent on errc
// first).
func (s *Store) WatchJobs(ctx context.Context, rev int64) (<-chan []string, <-chan error) {
	return s.watchNames(ctx, rev, s.Keys.JobOfKey, s.Keys.SpecsPrefix(), s.Keys.DesiredPrefix(), s.Keys.StatusPrefix(), s.Keys.FinishedPrefix(), s.Keys.ProblemsPrefix())
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
	nodes, bad := fleet.DecodeNodes(r.Kvs)
	return nodes, bad, r.Header.Revision, nil
}

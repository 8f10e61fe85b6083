package query

import (
	"context"
	"errors"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// QueueState is what finding a pending job's place in the queues reads:
// every job's status (its listing fields, as JobsListing decodes them)
// and every job's spec, undecoded until Specs asks for some, at one
// revision.
type QueueState struct {
	Statuses map[string]*fleet.Status
	Revision int64
	specs    map[string]*mvccpb.KeyValue
	dec      decoder[fleet.JobSpec]
}

// QueueState reads the statuses, specs and desired records of every job
// at one revision (in parallel): a job with no status record has the
// status its desired record implies. Malformed statuses and desired
// records, and specs under a younger namesake's key, are problems.
func (s *Store) QueueState(ctx context.Context) (*QueueState, []error, error) {
	k := s.Keys
	q := &QueueState{dec: specDecoder(k)}
	statDec, desDec := leanStatusDecoder(), leanDesiredDecoder()
	var badStatus, badSpecs, badDesired []error
	var desired []*fleet.Desired
	rev, err := s.prefixesAt(ctx, func(i int, kvs []*mvccpb.KeyValue) {
		switch i {
		case 0:
			q.Statuses, badStatus = byName(kvs, statDec, func(_ string, st *fleet.Status) string { return st.Job })
		case 2:
			desired, badDesired = decodeParallel(kvs, desDec)
		case 1:
			owned, dup := k.OwnedSpecs(kvs)
			badSpecs = dup
			q.specs = make(map[string]*mvccpb.KeyValue, len(owned))
			for _, kv := range owned {
				if _, job, ok := k.SpecOwner(string(kv.Key)); ok {
					q.specs[job] = kv
				}
			}
		}
	}, k.StatusPrefix(), k.SpecsPrefix(), k.DesiredPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("read the queues: %w", err)
	}
	// A job running as admitted has no status record: its desired
	// record's implied status (fleet.StatusOf).
	for _, d := range desired {
		if _, has := q.Statuses[d.Job]; !has {
			if st := fleet.StatusOf(nil, d); st != nil {
				q.Statuses[d.Job] = st
			}
		}
	}
	q.Revision = rev
	return q, append(append(badStatus, badSpecs...), badDesired...), nil
}

// Specs decodes the specs of the named jobs (in parallel); a job without
// a spec is left out, a malformed spec is a problem.
func (q *QueueState) Specs(names []string) (map[string]*fleet.JobSpec, []error) {
	var kvs []*mvccpb.KeyValue
	for _, n := range names {
		if kv, ok := q.specs[n]; ok {
			kvs = append(kvs, kv)
		}
	}
	list, bad := decodeParallel(kvs, q.dec)
	out := make(map[string]*fleet.JobSpec, len(list))
	for _, j := range list {
		out[j.Name] = j
	}
	return out, bad
}

// DesiredAt reads the desired records of the named jobs at revision rev,
// serializably (a member that has not applied rev yet refuses, and the
// read is made again linearizably). Jobs without one are left out;
// malformed ones are problems.
func (s *Store) DesiredAt(ctx context.Context, names []string, rev int64) (map[string]*fleet.Desired, []error, error) {
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
	out := make(map[string]*fleet.Desired, len(names))
	var bad []error
	for _, r := range resps {
		for _, kv := range r.GetResponseRange().Kvs {
			d, err := fleet.DecodeDesired(string(kv.Key), kv.Value)
			if err != nil {
				bad = append(bad, err)
				continue
			}
			out[d.Job] = d
		}
	}
	return out, bad, nil
}

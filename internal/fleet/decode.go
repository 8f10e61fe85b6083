package fleet

import (
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/hyperpodrun/hyperpodrun/api"
)

// JobOfKey names the job a spec, desired, status, finish or problem
// record key belongs to ("" for any other key).
func (k Keys) JobOfKey(key string) string {
	if _, job, ok := k.SpecOwner(key); ok {
		return job
	}
	if p, ok := k.ParseProblemKey(key); ok {
		return p.Job
	}
	for _, p := range []string{k.DesiredPrefix(), k.StatusPrefix(), k.FinishedPrefix()} {
		if name, ok := oneSegment(key, p, anyName); ok {
			return name
		}
	}
	return ""
}

// OwnedSpecs keeps, for every job name, the oldest spec key (lowest create
// revision) and reports every younger namesake as a problem (the rule every
// reader of specs applies). It keeps the order of kvs.
func (k Keys) OwnedSpecs(kvs []*mvccpb.KeyValue) ([]*mvccpb.KeyValue, []error) {
	return ownedSpecs(k, kvs)
}

// DecodeNodes decodes node inventories, sorted by node; those without a
// lease or malformed are problems.
func DecodeNodes(kvs []*mvccpb.KeyValue) ([]api.Inventory, []error) { return nodesFrom(kvs) }

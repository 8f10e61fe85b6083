package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/hyperpodrun/hyperpodrun/api"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Job specs live under their team, specs/<team>/<job>, so that a team's
// etcd role can own its jobs with one prefix permission. Job names stay
// unique across the fleet: when two teams' specs name one job (two submits
// raced, or one team wrote under its own prefix a name another team holds),
// the older spec owns the name and the younger is reported and ignored.

// specDecoder decodes a spec and checks that its key names its own team
// and job: a spec stored under another team's prefix, or under another
// name, is a problem, never a job.
func specDecoder(k Keys) decoder[JobSpec] {
	return func(key string, v []byte) (*JobSpec, error) {
		var j JobSpec
		if err := json.Unmarshal(v, &j); err != nil {
			return nil, fmt.Errorf("malformed value at %s: %w (value %q)", ClipKey(key), err, clip(v))
		}
		team, job, ok := k.SpecOwner(key)
		switch {
		case !ok:
			return nil, fmt.Errorf("ignoring %s: a job spec belongs at %s", ClipKey(key), k.Spec("<team>", "<job>"))
		case job != j.Name:
			return nil, fmt.Errorf("ignoring %s: it names job %q, which does not match its key", ClipKey(key), ClipKey(j.Name))
		case team != j.Team:
			return nil, fmt.Errorf("ignoring %s: it names team %q, but it is stored under team %q's prefix", ClipKey(key), ClipKey(j.Team), team)
		}
		return &j, nil
	}
}

// ownedSpecs keeps, for every job name, the oldest spec key (lowest create
// revision) and reports every younger namesake as a problem. It keeps the
// order of kvs.
func ownedSpecs(k Keys, kvs []*mvccpb.KeyValue) ([]*mvccpb.KeyValue, []error) {
	owner := make(map[string]*mvccpb.KeyValue, len(kvs))
	for _, kv := range kvs {
		_, job, ok := k.SpecOwner(string(kv.Key))
		if !ok {
			continue
		}
		if cur, seen := owner[job]; !seen || kv.CreateRevision < cur.CreateRevision {
			owner[job] = kv
		}
	}
	out := make([]*mvccpb.KeyValue, 0, len(kvs))
	var bad []error
	for _, kv := range kvs {
		_, job, ok := k.SpecOwner(string(kv.Key))
		if ok && owner[job] != kv {
			t, _, _ := k.SpecOwner(string(owner[job].Key))
			bad = append(bad, fmt.Errorf("ignoring %s: job name %q belongs to team %q's older job; rename this one", ClipKey(kv.Key), job, t))
			continue
		}
		out = append(out, kv)
	}
	return out, bad
}

// specKeys finds the spec key of each named job with one keys-only read of
// specs/ (names without a spec are absent from the map).
func (s *Store) specKeys(ctx context.Context, names []string) (map[string]string, error) {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	p := s.Keys.SpecsPrefix()
	r, err := s.Cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", p, err)
	}
	kvs, _ := ownedSpecs(s.Keys, r.Kvs)
	out := make(map[string]string, len(names))
	for _, kv := range kvs {
		if _, job, ok := s.Keys.SpecOwner(string(kv.Key)); ok && want[job] {
			out[job] = string(kv.Key)
		}
	}
	return out, nil
}

// SpecKey returns the key of the named job's spec, whichever team owns
// it; the error wraps ErrNotFound when there is none.
func (s *Store) SpecKey(ctx context.Context, name string) (string, error) {
	if err := api.ValidateName("job", name); err != nil {
		return "", err
	}
	m, err := s.specKeys(ctx, []string{name})
	if err != nil {
		return "", err
	}
	key, ok := m[name]
	if !ok {
		return "", fmt.Errorf("job %q: %w", name, ErrNotFound)
	}
	return key, nil
}

// nameTakenBy returns the team whose spec holds name, other than team
// ("" when none does).
func (s *Store) nameTakenBy(ctx context.Context, team, name string) (string, error) {
	m, err := s.specKeys(ctx, []string{name})
	if err != nil {
		return "", err
	}
	if key, ok := m[name]; ok {
		if t, _, _ := s.Keys.SpecOwner(key); t != team {
			return t, nil
		}
	}
	return "", nil
}

// JobTeams maps every job name that has a spec to its owning team.
func (s *Store) JobTeams(ctx context.Context) (map[string]string, error) {
	p := s.Keys.SpecsPrefix()
	r, err := s.Cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", p, err)
	}
	kvs, _ := ownedSpecs(s.Keys, r.Kvs)
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		if t, job, ok := s.Keys.SpecOwner(string(kv.Key)); ok {
			out[job] = t
		}
	}
	return out, nil
}

func sortSpecs(js []JobSpec) {
	sort.Slice(js, func(i, j int) bool { return js[i].Name < js[j].Name })
}

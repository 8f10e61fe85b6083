// Package fleet is the typed etcd layout shared by the coordinator,
// elasticctl and the node agents: teams, job specs, allocations, decision
// status and events (docs/internals.md lists the keys).
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/devices"
)

// DefaultPrefix is the etcd prefix of every hyperpodrun key.
const DefaultPrefix = "/hyperpodrun"

// RunSpec says what a job runs on each of its nodes: hyperpodrun's
// training script and options. The node agent turns it into a hyperpodrun
// command line.
type RunSpec struct {
	// Script is the training script (or module with Module, or program with NoPython).
	Script string `json:"script" yaml:"script"`
	// Args are passed to the script.
	Args []string `json:"args,omitempty" yaml:"args,omitempty"`
	// Module runs Script as "python -m".
	Module bool `json:"module,omitempty" yaml:"module,omitempty"`
	// NoPython runs Script directly.
	NoPython bool `json:"noPython,omitempty" yaml:"noPython,omitempty"`
	// NProcPerNode is hyperpodrun's --nproc-per-node (default "1").
	NProcPerNode string `json:"nprocPerNode,omitempty" yaml:"nprocPerNode,omitempty"`
	// Python is the interpreter (PYTHON_EXEC).
	Python string `json:"python,omitempty" yaml:"python,omitempty"`
	// Env is extra environment for the workers.
	Env map[string]string `json:"env,omitempty" yaml:"env,omitempty"`
	// MaxRestarts is hyperpodrun's --max-restarts.
	MaxRestarts int `json:"maxRestarts,omitempty" yaml:"maxRestarts,omitempty"`
	// GracefulTimeoutSeconds is hyperpodrun's --graceful-timeout.
	GracefulTimeoutSeconds float64 `json:"gracefulTimeoutSeconds,omitempty" yaml:"gracefulTimeoutSeconds,omitempty"`
	// WorkDir is the workers' working directory.
	WorkDir string `json:"workDir,omitempty" yaml:"workDir,omitempty"`
}

// JobSpec is a submitted job: the engine's view of it plus what it runs.
type JobSpec struct {
	api.Job `yaml:",inline"`
	Run     RunSpec `json:"run" yaml:"run"`
}

// Status is the coordinator's latest decision for a job.
type Status struct {
	api.Reason
	// Time is when the coordinator decided it.
	Time time.Time `json:"time" yaml:"time"`
	// Since is when the job entered this kind/code.
	Since time.Time `json:"since" yaml:"since"`
}

// Event is one decision that changed a job's state (for describe/events).
type Event struct {
	Time time.Time `json:"time" yaml:"time"`
	api.Reason
}

// Store reads and writes the layout under a prefix.
type Store struct {
	Cli    *clientv3.Client
	Prefix string
}

// New returns a Store; prefix "" is DefaultPrefix.
func New(cli *clientv3.Client, prefix string) *Store {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Store{Cli: cli, Prefix: strings.TrimSuffix(prefix, "/")}
}

// Key builds a key under the prefix.
func (s *Store) Key(parts ...string) string {
	return s.Prefix + "/" + path.Join(parts...)
}

// TeamKey, SpecKey, AllocationKey, StatusKey, TargetKey, PlacementKey and
// NodesPrefix name the keys of docs/internals.md.
func (s *Store) TeamKey(t string) string       { return s.Key("teams", t) }
func (s *Store) SpecKey(j string) string       { return s.Key("specs", j) }
func (s *Store) AllocationKey(j string) string { return s.Key("allocations", j) }
func (s *Store) StatusKey(j string) string     { return s.Key("status", j) }
func (s *Store) TargetKey(j string) string     { return s.Key("jobs", j, "target") }
func (s *Store) PlacementKey(j string) string  { return s.Key("jobs", j, "placement") }
func (s *Store) NodesPrefix() string           { return s.Key("nodes") + "/" }
func (s *Store) EventsPrefix() string          { return s.Key("events") + "/" }

// ErrNotFound is returned for a missing job, team or allocation.
var ErrNotFound = errors.New("not found")

func getJSON[T any](ctx context.Context, s *Store, key string) (*T, error) {
	r, err := s.Cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if len(r.Kvs) == 0 {
		return nil, fmt.Errorf("%s: %w", key, ErrNotFound)
	}
	var v T
	if err := json.Unmarshal(r.Kvs[0].Value, &v); err != nil {
		return nil, fmt.Errorf("malformed value at %s: %w", key, err)
	}
	return &v, nil
}

// listJSON decodes every value under prefix; malformed values are returned
// as problems, not errors, so one bad key cannot stop the fleet.
func listJSON[T any](ctx context.Context, s *Store, prefix string) ([]T, []error, error) {
	r, err := s.Cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	var out []T
	var bad []error
	for _, kv := range r.Kvs {
		var v T
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			bad = append(bad, fmt.Errorf("malformed value at %s: %w", kv.Key, err))
			continue
		}
		out = append(out, v)
	}
	return out, bad, nil
}

func (s *Store) putJSON(ctx context.Context, key string, v any, opts ...clientv3.OpOption) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := s.Cli.Put(ctx, key, string(b), opts...); err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	return nil
}

// PutTeam creates or replaces a team.
func (s *Store) PutTeam(ctx context.Context, t api.Team) error {
	return s.putJSON(ctx, s.TeamKey(t.Name), t)
}

// Teams lists the teams.
func (s *Store) Teams(ctx context.Context) ([]api.Team, []error, error) {
	ts, bad, err := listJSON[api.Team](ctx, s, s.Key("teams")+"/")
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return ts, bad, err
}

// Team reads one team.
func (s *Store) Team(ctx context.Context, name string) (*api.Team, error) {
	return getJSON[api.Team](ctx, s, s.TeamKey(name))
}

// SubmitJob stores a new job; it fails if the job exists.
func (s *Store) SubmitJob(ctx context.Context, j JobSpec) error {
	b, err := json.Marshal(j)
	if err != nil {
		return err
	}
	key := s.SpecKey(j.Name)
	r, err := s.Cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	if !r.Succeeded {
		return fmt.Errorf("job %q already exists: delete it first, or choose another name", j.Name)
	}
	return nil
}

// UpdateJob applies f to a stored job atomically (retrying on conflicts).
func (s *Store) UpdateJob(ctx context.Context, name string, f func(*JobSpec) error) (*JobSpec, error) {
	key := s.SpecKey(name)
	for {
		r, err := s.Cli.Get(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", key, err)
		}
		if len(r.Kvs) == 0 {
			return nil, fmt.Errorf("job %q: %w", name, ErrNotFound)
		}
		var j JobSpec
		if err := json.Unmarshal(r.Kvs[0].Value, &j); err != nil {
			return nil, fmt.Errorf("malformed value at %s: %w", key, err)
		}
		if err := f(&j); err != nil {
			return nil, err
		}
		b, _ := json.Marshal(j)
		tr, err := s.Cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", r.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(key, string(b))).Commit()
		if err != nil {
			return nil, fmt.Errorf("write %s: %w", key, err)
		}
		if tr.Succeeded {
			return &j, nil
		}
	}
}

// DeleteJob removes a job's spec (the coordinator then releases it).
func (s *Store) DeleteJob(ctx context.Context, name string) error {
	// The finish record goes with the spec: a job submitted again under
	// the same name runs again.
	r, err := s.Cli.Txn(ctx).Then(clientv3.OpDelete(s.SpecKey(name)), clientv3.OpDelete(s.FinishKey(name))).Commit()
	if err != nil {
		return fmt.Errorf("delete job %q: %w", name, err)
	}
	if r.Responses[0].GetResponseDeleteRange().Deleted == 0 {
		return fmt.Errorf("job %q: %w", name, ErrNotFound)
	}
	return nil
}

// Jobs lists the job specs.
func (s *Store) Jobs(ctx context.Context) ([]JobSpec, []error, error) {
	js, bad, err := listJSON[JobSpec](ctx, s, s.Key("specs")+"/")
	sort.Slice(js, func(i, j int) bool { return js[i].Name < js[j].Name })
	return js, bad, err
}

// Job reads one job spec.
func (s *Store) Job(ctx context.Context, name string) (*JobSpec, error) {
	return getJSON[JobSpec](ctx, s, s.SpecKey(name))
}

// Allocations lists the current allocations.
func (s *Store) Allocations(ctx context.Context) ([]api.Allocation, []error, error) {
	as, bad, err := listJSON[api.Allocation](ctx, s, s.Key("allocations")+"/")
	sort.Slice(as, func(i, j int) bool { return as[i].Job < as[j].Job })
	return as, bad, err
}

// Allocation reads one allocation.
func (s *Store) Allocation(ctx context.Context, job string) (*api.Allocation, error) {
	return getJSON[api.Allocation](ctx, s, s.AllocationKey(job))
}

// Status reads the coordinator's latest decision for a job.
func (s *Store) Status(ctx context.Context, job string) (*Status, error) {
	return getJSON[Status](ctx, s, s.StatusKey(job))
}

// Statuses lists every job's latest decision.
func (s *Store) Statuses(ctx context.Context) (map[string]Status, error) {
	st, _, err := listJSON[Status](ctx, s, s.Key("status")+"/")
	out := map[string]Status{}
	for _, x := range st {
		out[x.Job] = x
	}
	return out, err
}

// Usage reads the teams' usage from the last decision.
func (s *Store) Usage(ctx context.Context) ([]api.TeamUsage, error) {
	u, err := getJSON[[]api.TeamUsage](ctx, s, s.Key("coordinator", "usage"))
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return *u, nil
}

// Nodes lists the node inventories the agents registered.
func (s *Store) Nodes(ctx context.Context) ([]devices.Inventory, []error, error) {
	r, err := s.Cli.Get(ctx, s.NodesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("list nodes: %w", err)
	}
	var out []devices.Inventory
	var bad []error
	for _, kv := range r.Kvs {
		inv, err := devices.ParseInventory(string(kv.Key), kv.Value)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		out = append(out, *inv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, bad, nil
}

// Target reads a job's target node count (0: none).
func (s *Store) Target(ctx context.Context, job string) (int, error) {
	r, err := s.Cli.Get(ctx, s.TargetKey(job))
	if err != nil || len(r.Kvs) == 0 {
		return 0, err
	}
	n, err := strconv.Atoi(string(r.Kvs[0].Value))
	if err != nil {
		return 0, fmt.Errorf("malformed target at %s: %q", s.TargetKey(job), r.Kvs[0].Value)
	}
	return n, nil
}

// Events lists the decision events, oldest first; job "" means all.
func (s *Store) Events(ctx context.Context, job string) ([]Event, error) {
	evs, _, err := s.EventsAt(ctx, job)
	return evs, err
}

// EventsAt is Events plus the etcd revision it read at: watching the events
// prefix from the revision after it misses none and repeats none.
func (s *Store) EventsAt(ctx context.Context, job string) ([]Event, int64, error) {
	r, err := s.Cli.Get(ctx, s.EventsPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("list %s: %w", s.EventsPrefix(), err)
	}
	var out []Event
	for _, kv := range r.Kvs {
		var e Event
		if json.Unmarshal(kv.Value, &e) == nil && e.Concerns(job) {
			out = append(out, e)
		}
	}
	return out, r.Header.Revision, nil
}

// Concerns reports whether the event is about job ("" means every job):
// its own, or one that names job as the job capacity was taken for.
func (e Event) Concerns(job string) bool {
	return job == "" || e.Job == job || contains(e.For, job)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// EventKey names an event's key: time-ordered.
func (s *Store) EventKey(e Event) string {
	return s.EventsPrefix() + fmt.Sprintf("%020d-%s", e.Time.UnixNano(), e.Job)
}

// Finish records how a job ended on the nodes (written by node agents).
type Finish struct {
	Outcome string    `json:"outcome" yaml:"outcome"` // Succeeded or Failed
	Node    string    `json:"node" yaml:"node"`
	Message string    `json:"message,omitempty" yaml:"message,omitempty"`
	Time    time.Time `json:"time" yaml:"time"`
}

// Finish outcomes.
const (
	Succeeded = "Succeeded"
	Failed    = "Failed"
)

// Stop says why the coordinator took a job's whole allocation away, so its
// hyperpodruns can tell their workers (written in the same transaction that
// deletes the allocation; deleted when the job is admitted again).
type Stop struct {
	// Kind is a checkpoint event kind: "preemption" (requeued for another
	// job) or "shutdown" (suspended, deleted or invalid).
	Kind string `json:"kind"`
	// Reason is the coordinator's explanation, e.g. "preempted: team a
	// reclaimed its nominal quota for j2 while team b was borrowing".
	Reason string `json:"reason,omitempty"`
}

// Stop kinds (they match checkpoint.EventKind values).
const (
	StopPreemption = "preemption"
	StopShutdown   = "shutdown"
)

// StopKey names the record of why a job's allocation was taken away.
func (s *Store) StopKey(j string) string { return s.Key("jobs", j, "stopped") }

// FinishKey names a job's finish record. Finish records have a prefix of
// their own: the coordinator lists them every cycle, and under jobs/ it
// would read every running job's rendezvous keys too.
func (s *Store) FinishKey(j string) string { return s.Key("finished", j) }

// FinishedPrefix is the prefix of every finish record.
func (s *Store) FinishedPrefix() string { return s.Key("finished") + "/" }

// MarkFinished records the first finish of a job (later ones are ignored).
func (s *Store) MarkFinished(ctx context.Context, job string, f Finish) error {
	b, _ := json.Marshal(f)
	key := s.FinishKey(job)
	_, err := s.Cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	return nil
}

// Finished returns the finish record of every finished job.
func (s *Store) Finished(ctx context.Context) (map[string]Finish, error) {
	r, err := s.Cli.Get(ctx, s.FinishedPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list finished jobs: %w", err)
	}
	out := map[string]Finish{}
	for _, kv := range r.Kvs {
		var f Finish
		if json.Unmarshal(kv.Value, &f) != nil {
			continue
		}
		out[strings.TrimPrefix(string(kv.Key), s.FinishedPrefix())] = f
	}
	return out, nil
}

// Package fleet owns the etcd layout: every key (Keys) and every record's
// value, with a typed read and write for each, shared by the coordinator,
// elasticctl, the node agents, hyperpodrun's elastic agent, the rendezvous
// and the checkpoint store (docs/internals.md lists them, and a test keeps
// that table and this package in step). No other package formats a key.
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/distribution/reference"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
)

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
	// InProcessResize is hyperpodrun's --inprocess-resize (issue 14): the
	// workers of nodes that stay keep their processes through a resize.
	InProcessResize bool `json:"inprocessResize,omitempty" yaml:"inprocessResize,omitempty"`
	// WorkDir is the workers' working directory.
	WorkDir string `json:"workDir,omitempty" yaml:"workDir,omitempty"`
	// Image runs the job's hyperpodrun in a container of this image on
	// each node (hyperpod-agent --runtime containerd); "" runs it as a host
	// process.
	Image string `json:"image,omitempty" yaml:"image,omitempty"`
	// Command is the launcher inside the image, e.g.
	// ["/usr/local/bin/hyperpodrun"]; hyperpodrun's flags, the script and
	// Args follow it. Default: the agent's static hyperpodrun, mounted
	// read-only into the container. With Image only.
	Command []string `json:"command,omitempty" yaml:"command,omitempty"`
	// Mounts are host paths bind-mounted into the container (e.g. a
	// checkpoint directory). With Image only.
	Mounts []Mount `json:"mounts,omitempty" yaml:"mounts,omitempty"`
	// ShmSize is the container's /dev/shm (default 64Mi; DataLoader
	// workers and NCCL want more). With Image only.
	ShmSize api.ByteSize `json:"shmSize,omitempty" yaml:"shmSize,omitempty"`
}

// Mount is a host path bind-mounted into a job's container.
type Mount struct {
	// Source is the host path (absolute).
	Source string `json:"source" yaml:"source"`
	// Target is the path inside the container (absolute).
	Target string `json:"target" yaml:"target"`
	// ReadOnly mounts it read-only.
	ReadOnly bool `json:"readOnly,omitempty" yaml:"readOnly,omitempty"`
}

// reservedTargets are the container paths the agent mounts itself.
var reservedTargets = []string{"/.hyperpodrun", "/run/hyperpodrun", "/var/log/hyperpodrun", "/proc", "/sys", "/dev"}

// validateContainer checks the container fields of a run spec.
func (r RunSpec) validateContainer() error {
	if r.Image == "" {
		switch {
		case len(r.Command) > 0:
			return errors.New("run.command: needs run.image (it names the launcher inside the image)")
		case len(r.Mounts) > 0:
			return errors.New("run.mounts: needs run.image (host processes see the host's paths already)")
		case r.ShmSize != 0:
			return errors.New("run.shmSize: needs run.image")
		}
		return nil
	}
	if _, err := reference.ParseDockerRef(r.Image); err != nil {
		return fmt.Errorf("run.image: %q is not an image reference (%v): want e.g. registry.example.com/team/train:v3", r.Image, err)
	}
	if r.ShmSize < 0 {
		return fmt.Errorf("run.shmSize: must be positive (got %d)", r.ShmSize)
	}
	if len(r.Command) > 0 && r.Command[0] == "" {
		return errors.New("run.command: its first element is the launcher's path inside the image; it is empty")
	}
	for i, m := range r.Mounts {
		for _, p := range []struct{ name, v string }{{"source", m.Source}, {"target", m.Target}} {
			if !path.IsAbs(p.v) || path.Clean(p.v) != p.v || strings.ContainsRune(p.v, 0) {
				return fmt.Errorf("run.mounts[%d].%s: %q must be a clean absolute path", i, p.name, p.v)
			}
		}
		if m.Target == "/" {
			return fmt.Errorf("run.mounts[%d].target: cannot mount over the container's root", i)
		}
		if why := api.DangerousMountSource(m.Source); why != "" {
			return fmt.Errorf("run.mounts[%d].source: %s is %s: no node lets a job mount it; mount a data or checkpoint directory instead (a node admin allows those with hyperpod-agent --allow-mount-source)", i, m.Source, why)
		}
		for _, r := range reservedTargets {
			if m.Target == r || strings.HasPrefix(m.Target, r+"/") || strings.HasPrefix(r, m.Target+"/") {
				return fmt.Errorf("run.mounts[%d].target: %s is the agent's (%s); pick another path", i, m.Target, r)
			}
		}
	}
	return nil
}

// MaxGracefulTimeout bounds RunSpec.GracefulTimeoutSeconds.
const MaxGracefulTimeout = 24 * time.Hour

// Validate checks what a job runs, naming the field and the fix.
func (r RunSpec) Validate() error {
	switch {
	case r.Script == "":
		return errors.New("run.script: must be set: the training script each node runs under hyperpodrun")
	case math.IsNaN(r.GracefulTimeoutSeconds) || math.IsInf(r.GracefulTimeoutSeconds, 0) ||
		r.GracefulTimeoutSeconds < 0 || r.GracefulTimeoutSeconds > MaxGracefulTimeout.Seconds():
		return fmt.Errorf("run.gracefulTimeoutSeconds: must be a number of seconds between 0 and %.0f (got %v)", MaxGracefulTimeout.Seconds(), r.GracefulTimeoutSeconds)
	case r.MaxRestarts < 0:
		return fmt.Errorf("run.maxRestarts: must be >= 0 (got %d)", r.MaxRestarts)
	}
	for k := range r.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("run.env: %q is not a variable name", k)
		}
	}
	return r.validateContainer()
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
// Like a Kubernetes Event it is deduplicated: the same decision about the
// same job again (same kind, code, sizes and beneficiaries) updates the
// existing record, counting it, rather than adding one. Records written
// before deduplication have no Count (read it as 1).
type Event struct {
	// Time is when the event was first seen (the key's time).
	Time time.Time `json:"time" yaml:"time"`
	api.Reason
	// Count is how often the decision was made (omitted: once).
	Count int `json:"count,omitempty" yaml:"count,omitempty"`
	// FirstSeen and LastSeen are the first and latest time it was made
	// (omitted: Time).
	FirstSeen time.Time `json:"firstSeen,omitzero" yaml:"firstSeen,omitempty"`
	LastSeen  time.Time `json:"lastSeen,omitzero" yaml:"lastSeen,omitempty"`
}

// Times is how often the event was seen (at least 1).
func (e Event) Times() int { return max(1, e.Count) }

// Concerns reports whether the event is about job ("" means every job):
// its own, or one that names job as the job capacity was taken for.
func (e Event) Concerns(job string) bool {
	return job == "" || e.Job == job || slices.Contains(e.For, job)
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
// hyperpodruns can tell their workers.
type Stop struct {
	// Kind is a checkpoint event kind: "preemption" (requeued for another
	// job) or "shutdown" (suspended, deleted or invalid).
	Kind string `json:"kind"`
	// Reason is the coordinator's explanation, e.g. "preempted: team a
	// reclaimed its nominal quota for j2 while team b was borrowing".
	Reason string `json:"reason,omitempty"`
}

// Stop kinds (they match control.EventKind values).
const (
	StopPreemption = "preemption"
	StopShutdown   = "shutdown"
)

// Desired is the coordinator's one record of what it wants of a job, at
// <prefix>/desired/<job>, always written whole in one put: the size and
// placement (the embedded allocation), or, when the job's whole allocation
// was taken away, why (Stop, with Size 0 and no nodes). The rendezvous
// closer, the elastic agent and the node agent's runner read this record and
// nothing else. Generation grows by one with every change.
type Desired struct {
	api.Allocation
	// Generation numbers the coordinator's changes of this record (1, 2, ...).
	Generation int64 `json:"generation"`
	// Stop is set when the job holds no allocation any more.
	Stop *Stop `json:"stop,omitempty"`
	// TraceParent is the W3C traceparent of the coordinator's decision
	// span that wrote this record: the root of the scale event's trace,
	// under which the agents' spans hang. "" when tracing is off.
	TraceParent string `json:"traceparent,omitempty"`
	// UID is the job's own uid and gid on every node it runs on, unique in
	// the fleet while the job lives (the coordinator's --job-uid-range);
	// 0 when the coordinator allocates none.
	UID uint32 `json:"uid,omitempty"`
	// Message is the admission's explanation ("" after a resize, a move
	// or a repair, whose status records explain them). While the job runs
	// as this record places it, the coordinator writes no status record,
	// and this is the message of the status the record implies
	// (ImpliedStatus: "running on N node(s)" when empty).
	Message string `json:"message,omitempty"`
}

// Target is the node count the rendezvous should size the job to. 0 means
// no target: the record is absent (nil), or the job was stopped.
func (d *Desired) Target() int {
	if d == nil || d.Stop != nil {
		return 0
	}
	return d.Size
}

// Running reports whether the record places the job on nodes.
func (d *Desired) Running() bool { return d != nil && d.Stop == nil && d.Size > 0 }

// DecodeDesired decodes and checks a desired record read from key; the
// error names the key and what is wrong.
func DecodeDesired(key string, v []byte) (*Desired, error) {
	var d Desired
	if err := json.Unmarshal(v, &d); err != nil {
		return nil, fmt.Errorf("malformed desired record at %s: %w (value %q)", key, err, clip(v))
	}
	bad := func(why string) error {
		return fmt.Errorf("malformed desired record at %s: %s (value %q)", key, why, clip(v))
	}
	switch {
	case d.Job == "" || path.Base(key) != d.Job:
		return nil, bad("its job name does not match its key")
	case d.Generation < 0:
		return nil, bad("negative generation")
	case d.Stop != nil && (d.Size != 0 || len(d.Nodes) != 0):
		return nil, bad("a stopped job holds no nodes")
	case d.Stop != nil && d.Stop.Kind != StopPreemption && d.Stop.Kind != StopShutdown:
		return nil, bad(fmt.Sprintf("unknown stop kind %q", d.Stop.Kind))
	case d.Stop == nil && d.Size < 1:
		return nil, bad("size must be at least 1 unless the job is stopped")
	case len(d.Nodes) != 0 && len(d.Nodes) != d.Size:
		return nil, bad(fmt.Sprintf("%d nodes for size %d", len(d.Nodes), d.Size))
	}
	return &d, nil
}

// ParseCount decodes the decimal counters of the layout (a job's restarts
// and the round they were last counted for); the error names the key.
func ParseCount(key string, v []byte, what string, minimum int64) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
	if err != nil || n < minimum {
		return 0, fmt.Errorf("malformed %s at %s: %q is not a decimal integer >= %d", what, key, clip(v), minimum)
	}
	return n, nil
}

// Counter reads the counter at key (a job's restarts, or the round they
// were last counted for): its value and mod revision, both 0 when absent.
// A malformed value never stops a job: it is reported as problem and
// replaced by its last good value, or 0 where none exists.
func (s *Store) Counter(ctx context.Context, key, what string) (value, modRev int64, problem, err error) {
	r, err := s.Cli.Get(ctx, key)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("read %s: %w", key, err)
	}
	if len(r.Kvs) == 0 {
		return 0, 0, nil, nil
	}
	kv := r.Kvs[0]
	dec := func(key string, v []byte) (*int64, error) {
		n, err := ParseCount(key, v, what, 0)
		return &n, err
	}
	n, problem := dec(string(kv.Key), kv.Value)
	if problem == nil {
		return *n, kv.ModRevision, nil, nil
	}
	if good, rev := lastGood(ctx, s.Cli, kv, dec); good != nil {
		return *good, kv.ModRevision, fmt.Errorf("%w; using its last good value %d (revision %d)", problem, *good, rev), nil
	}
	return 0, kv.ModRevision, fmt.Errorf("%w; counting from 0", problem), nil
}

// FormatCount encodes a counter as ParseCount reads it.
func FormatCount(n int64) string { return strconv.FormatInt(n, 10) }

func clip(v []byte) string {
	if len(v) > 120 {
		return string(v[:120]) + "..."
	}
	return string(v)
}

// ErrNotFound is returned for a missing job, team or record.
var ErrNotFound = errors.New("not found")

// Store reads and writes the layout under a prefix.
type Store struct {
	Cli  *clientv3.Client
	Keys Keys
}

// New returns a Store; prefix "" is DefaultPrefix.
func New(cli *clientv3.Client, prefix string) *Store {
	return &Store{Cli: cli, Keys: NewKeys(prefix)}
}

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
		return nil, fmt.Errorf("malformed value at %s: %w", ClipKey(key), err)
	}
	return &v, nil
}

// decoder decodes and checks one record read from key.
type decoder[T any] func(key string, v []byte) (*T, error)

// jsonNamed decodes a JSON record whose name must match its key's last
// segment and that must pass check (when set).
func jsonNamed[T any](name func(*T) string, check func(*T) error) decoder[T] {
	return func(key string, v []byte) (*T, error) {
		var x T
		if err := json.Unmarshal(v, &x); err != nil {
			return nil, fmt.Errorf("malformed value at %s: %w (value %q)", key, err, clip(v))
		}
		if n := name(&x); path.Base(key) != n {
			return nil, fmt.Errorf("ignoring %s: it names %q, which does not match its key", key, n)
		}
		if check != nil {
			if err := check(&x); err != nil {
				return nil, fmt.Errorf("invalid value at %s: %w", ClipKey(key), err)
			}
		}
		return &x, nil
	}
}

// ReadRecord reads the record at key with dec. A malformed value never
// stops its reader: it is reported as problem, and its last good value (an
// earlier revision etcd still holds) is returned in its place, or nil when
// none exists. modRev is the key's current mod revision (0 when absent),
// for a compare-and-swap that replaces the bad value.
func ReadRecord[T any](ctx context.Context, cli *clientv3.Client, key string, dec func(key string, v []byte) (*T, error)) (v *T, modRev int64, problem, err error) {
	r, err := cli.Get(ctx, key)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("read %s: %w", key, err)
	}
	if len(r.Kvs) == 0 {
		return nil, 0, nil, nil
	}
	kv := r.Kvs[0]
	v, problem = dec(key, kv.Value)
	if problem == nil {
		return v, kv.ModRevision, nil, nil
	}
	if good, rev := lastGood(ctx, cli, kv, decoder[T](dec)); good != nil {
		return good, kv.ModRevision, fmt.Errorf("%w; using its last good value (revision %d)", problem, rev), nil
	}
	return nil, kv.ModRevision, fmt.Errorf("%w; no good value to fall back on", problem), nil
}

// lastGoodDepth bounds how many earlier versions of a malformed record are
// tried for its last good value.
const lastGoodDepth = 3

// listRecords decodes every record under prefix. A malformed record is a
// problem, never an error, so one bad key cannot stop the fleet; where the
// record had a good value before (etcd still holds earlier revisions until
// it compacts them), that last good value is used in its place.
func listRecords[T any](ctx context.Context, s *Store, prefix string, dec decoder[T]) ([]T, []error, error) {
	r, err := s.Cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	out, bad := decodeRecords(ctx, s, r.Kvs, dec)
	return out, bad, nil
}

// decodeRecords decodes kvs as listRecords does.
func decodeRecords[T any](ctx context.Context, s *Store, kvs []*mvccpb.KeyValue, dec decoder[T]) ([]T, []error) {
	var out []T
	var bad []error
	for _, kv := range kvs {
		v, err := dec(string(kv.Key), kv.Value)
		if err == nil {
			out = append(out, *v)
			continue
		}
		if good, rev := lastGood(ctx, s.Cli, kv, dec); good != nil {
			out = append(out, *good)
			bad = append(bad, fmt.Errorf("%w; using its last good value (revision %d)", err, rev))
			continue
		}
		bad = append(bad, err)
	}
	return out, bad
}

// lastGood reads the versions of kv before its current one, newest first,
// and returns the first that decodes.
func lastGood[T any](ctx context.Context, cli *clientv3.Client, kv *mvccpb.KeyValue, dec decoder[T]) (*T, int64) {
	rev := kv.ModRevision
	for range lastGoodDepth {
		if rev <= kv.CreateRevision {
			return nil, 0 // no earlier version of this key's life
		}
		r, err := cli.Get(ctx, string(kv.Key), clientv3.WithRev(rev-1))
		if err != nil || len(r.Kvs) == 0 {
			return nil, 0 // compacted, or gone
		}
		old := r.Kvs[0]
		if v, err := dec(string(old.Key), old.Value); err == nil {
			return v, old.ModRevision
		}
		rev = old.ModRevision
	}
	return nil, 0
}

// putOp encodes v as the JSON value of key. Encoding fails only on values
// JSON cannot hold (a NaN weight or timeout): the error names the key.
func putOp(key string, v any) (clientv3.Op, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return clientv3.Op{}, fmt.Errorf("encode %s: %w", key, err)
	}
	return clientv3.OpPut(key, string(b)), nil
}

func (s *Store) put(ctx context.Context, key string, v any) error {
	op, err := putOp(key, v)
	if err != nil {
		return err
	}
	if _, err := s.Cli.Do(ctx, op); err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	return nil
}

// PutTeam creates or replaces a team.
func (s *Store) PutTeam(ctx context.Context, t api.Team) error {
	if err := api.ValidateName("team", t.Name); err != nil {
		return err
	}
	return s.put(ctx, s.Keys.Team(t.Name), t)
}

// Teams lists the teams.
func (s *Store) Teams(ctx context.Context) ([]api.Team, []error, error) {
	ts, bad, err := listRecords(ctx, s, s.Keys.TeamsPrefix(), jsonNamed(func(t *api.Team) string { return t.Name }, func(t *api.Team) error { return t.Validate() }))
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return ts, bad, err
}

// Team reads one team.
func (s *Store) Team(ctx context.Context, name string) (*api.Team, error) {
	if err := api.ValidateName("team", name); err != nil {
		return nil, err
	}
	return getJSON[api.Team](ctx, s, s.Keys.Team(name))
}

// SubmitJob stores a new job under its team; it fails if a job of that
// name exists (in any team), or if an earlier job of the same name still
// has nodes in its rendezvous. Whatever an earlier job of that name left
// (restart count, checkpoint record, desired record, status) goes in the
// same transaction: a new job starts afresh. A client whose etcd role may
// write only its team's specs (auth on: docs/security.md) cannot delete
// those records; its submit then waits for the coordinator to have
// forgotten them (see Forget) and says so.
func (s *Store) SubmitJob(ctx context.Context, j JobSpec) error {
	if err := api.ValidateName("job", j.Name); err != nil {
		return err
	}
	if err := api.ValidateName("team", j.Team); err != nil {
		return fmt.Errorf("job %q: %w", j.Name, err)
	}
	if t, err := s.nameTakenBy(ctx, j.Team, j.Name); err != nil {
		return err
	} else if t != "" {
		return fmt.Errorf("job %q already exists in team %q: job names are unique across teams; choose another name", j.Name, t)
	}
	key := s.Keys.Spec(j.Team, j.Name)
	op, err := putOp(key, j)
	if err != nil {
		return err
	}
	r, err := s.Cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), s.noMembers(j.Name)).
		Then(append([]clientv3.Op{op}, s.forgetOps(j.Name)...)...).Commit()
	if IsPermissionDenied(err) {
		r, err = s.Cli.Txn(ctx).If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}, s.forgottenCmps(j.Name)...)...).
			Then(op).Commit()
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	if r.Succeeded {
		return nil
	}
	if g, err := s.Cli.Get(ctx, key, clientv3.WithCountOnly()); err == nil && g.Count == 0 {
		return fmt.Errorf("job %q: an earlier job of that name is still leaving its nodes: try again in a few seconds, or choose another name", j.Name)
	}
	return fmt.Errorf("job %q already exists: delete it first, or choose another name", j.Name)
}

// forgottenCmps hold once the coordinator has forgotten an earlier job of
// that name: its desired record, status and finish record are gone. They
// read no key under jobs/, which a team's etcd role may not read (its
// lease ids are the job's alone): the coordinator deletes a job's jobs/
// keys in the transaction that deletes its desired record, once no node is
// left in its rendezvous (Forget, and the coordinator's forgetting of
// deleted and expired jobs).
func (s *Store) forgottenCmps(job string) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(s.Keys.Desired(job)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(s.Keys.Status(job)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(s.Keys.Finish(job)), "=", 0),
	}
}

// IsPermissionDenied reports whether err is etcd refusing the operation to
// this client's user (auth on, and its role does not cover a key).
func IsPermissionDenied(err error) bool {
	return err != nil && errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied)
}

// noMembers holds while no node is a member of the job's rendezvous.
func (s *Store) noMembers(job string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(s.Keys.Rdzv(job).Members), "=", 0).WithPrefix()
}

// forgetOps delete everything a job keeps besides its spec and finish
// record: its rendezvous, restart count, checkpoint record, barriers,
// desired record and status.
func (s *Store) forgetOps(job string) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpDelete(s.Keys.Job(job), clientv3.WithPrefix()),
		clientv3.OpDelete(s.Keys.Desired(job)),
		clientv3.OpDelete(s.Keys.Status(job)),
		clientv3.OpDelete(s.Keys.Problems(job), clientv3.WithPrefix()),
	}
}

// Forget removes what a deleted job left behind (see forgetOps, and its
// finish record) once none of its nodes is left in its rendezvous and no
// team has a spec of that name; it reports whether it did.
func (s *Store) Forget(ctx context.Context, job string) (bool, error) {
	if _, err := s.SpecKey(ctx, job); err == nil {
		return false, nil
	} else if !errors.Is(err, ErrNotFound) {
		return false, fmt.Errorf("forget job %q: %w", job, err)
	}
	cmps := []clientv3.Cmp{s.noMembers(job)}
	r, err := s.Cli.Txn(ctx).If(cmps...).
		Then(append(s.forgetOps(job), clientv3.OpDelete(s.Keys.Finish(job)))...).Commit()
	if err != nil {
		return false, fmt.Errorf("forget job %q: %w", job, err)
	}
	return r.Succeeded, nil
}

// PruneEvents deletes the oldest events beyond perJob events of one job
// and beyond total events in all; it returns how many it deleted.
func (s *Store) PruneEvents(ctx context.Context, perJob, total int) (int, error) {
	prefix := s.Keys.EventsPrefix()
	r, err := s.Cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", prefix, err)
	}
	keep := make([]bool, len(r.Kvs))
	perJobCount := map[string]int{}
	kept := 0
	for i := len(r.Kvs) - 1; i >= 0; i-- { // newest first
		_, job, _ := strings.Cut(strings.TrimPrefix(string(r.Kvs[i].Key), prefix), "-")
		perJobCount[job]++
		if perJobCount[job] <= perJob && kept < total {
			keep[i] = true
			kept++
		}
	}
	var ops []clientv3.Op
	for i, kv := range r.Kvs {
		if !keep[i] {
			ops = append(ops, clientv3.OpDelete(string(kv.Key)))
		}
	}
	deleted := 0
	for len(ops) > 0 {
		n := min(len(ops), 100)
		if _, err := s.Cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			return deleted, fmt.Errorf("prune events: %w", err)
		}
		deleted += n
		ops = ops[n:]
	}
	return deleted, nil
}

// UpdateJob applies f to a stored job atomically (retrying on conflicts).
// f may not move the job to another team.
func (s *Store) UpdateJob(ctx context.Context, name string, f func(*JobSpec) error) (*JobSpec, error) {
	key, err := s.SpecKey(ctx, name)
	if err != nil {
		return nil, err
	}
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
			return nil, fmt.Errorf("job %q: its stored spec is malformed (%v): delete it and submit it again", name, err)
		}
		team := j.Team
		if err := f(&j); err != nil {
			return nil, err
		}
		if j.Team != team {
			return nil, fmt.Errorf("job %q: a job cannot move from team %q to team %q: delete it and submit it to the other team", name, team, j.Team)
		}
		op, err := putOp(key, j)
		if err != nil {
			return nil, err
		}
		tr, err := s.Cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", r.Kvs[0].ModRevision)).Then(op).Commit()
		if err != nil {
			return nil, fmt.Errorf("write job %q: %w", name, err)
		}
		if tr.Succeeded {
			return &j, nil
		}
	}
}

// DeleteJob removes a job's spec (the coordinator then releases it) and,
// where this client may, its finish record; otherwise the coordinator
// removes that once the job's nodes have left (Forget).
func (s *Store) DeleteJob(ctx context.Context, name string) error {
	key, err := s.SpecKey(ctx, name)
	if err != nil {
		return err
	}
	// The finish record goes with the spec: a job submitted again under
	// the same name runs again.
	r, err := s.Cli.Txn(ctx).Then(clientv3.OpDelete(key), clientv3.OpDelete(s.Keys.Finish(name))).Commit()
	if IsPermissionDenied(err) {
		r, err = s.Cli.Txn(ctx).Then(clientv3.OpDelete(key)).Commit()
	}
	if err != nil {
		return fmt.Errorf("delete job %q: %w", name, err)
	}
	if r.Responses[0].GetResponseDeleteRange().Deleted == 0 {
		return fmt.Errorf("job %q: %w", name, ErrNotFound)
	}
	return nil
}

// Jobs lists the job specs. A spec whose name or team disagrees with its
// key is a problem, never a job, and so is a spec whose name an older spec
// of another team holds.
func (s *Store) Jobs(ctx context.Context) ([]JobSpec, []error, error) {
	p := s.Keys.SpecsPrefix()
	r, err := s.Cli.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("list %s: %w", p, err)
	}
	kvs, bad := ownedSpecs(s.Keys, r.Kvs)
	js, bad2 := decodeRecords(ctx, s, kvs, specDecoder(s.Keys))
	sortSpecs(js)
	return js, append(bad, bad2...), nil
}

// Job reads one job spec, whichever team owns it.
func (s *Store) Job(ctx context.Context, name string) (*JobSpec, error) {
	key, err := s.SpecKey(ctx, name)
	if err != nil {
		return nil, err
	}
	return getJSON[JobSpec](ctx, s, key)
}

// Desired reads a job's desired record (nil, nil when there is none).
func (s *Store) Desired(ctx context.Context, job string) (*Desired, error) {
	key := s.Keys.Desired(job)
	r, err := s.Cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if len(r.Kvs) == 0 {
		return nil, nil
	}
	return DecodeDesired(key, r.Kvs[0].Value)
}

// Restarts reads a job's global failure-restart count (0 when there is no
// record), the count hyperpodrun holds against --max-restarts. A malformed
// record is read as its last good value (or 0), as Counter does, and the
// problem returned beside it for the caller to log.
func (s *Store) Restarts(ctx context.Context, job string) (n int64, problem, err error) {
	n, _, problem, err = s.Counter(ctx, s.Keys.Restarts(job), "restart count")
	return n, problem, err
}

// Members counts the nodes still in a job's rendezvous (their member keys
// live under their leases).
func (s *Store) Members(ctx context.Context, job string) (int64, error) {
	prefix := s.Keys.Rdzv(job).Members
	r, err := s.Cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("count %s: %w", prefix, err)
	}
	return r.Count, nil
}

// DesiredAll lists every job's desired record; malformed records are
// returned as problems (with their last good value used where one exists).
func (s *Store) DesiredAll(ctx context.Context) ([]Desired, []error, error) {
	return listRecords(ctx, s, s.Keys.DesiredPrefix(), DecodeDesired)
}

// PutDesiredOp is the write of a job's whole desired record, for a
// transaction.
func (s *Store) PutDesiredOp(d Desired) (clientv3.Op, error) { return putOp(s.Keys.Desired(d.Job), d) }

// SetTarget sets a job's target size without a placement (tests, and
// rendezvous without a coordinator); the generation grows by one.
func (s *Store) SetTarget(ctx context.Context, job string, size int) error {
	key := s.Keys.Desired(job)
	for {
		r, err := s.Cli.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("read %s: %w", key, err)
		}
		d, rev := &Desired{Allocation: api.Allocation{Job: job}}, int64(0)
		if len(r.Kvs) > 0 {
			rev = r.Kvs[0].ModRevision
			if old, err := DecodeDesired(key, r.Kvs[0].Value); err == nil {
				d = old
			}
		}
		d.Generation++
		d.Size, d.Nodes, d.Stop = size, nil, nil
		op, err := putOp(key, d)
		if err != nil {
			return err
		}
		tr, err := s.Cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(op).Commit()
		if err != nil {
			return fmt.Errorf("write %s: %w", key, err)
		}
		if tr.Succeeded {
			return nil
		}
	}
}

// Allocations lists the jobs the desired records place on nodes.
func (s *Store) Allocations(ctx context.Context) ([]api.Allocation, []error, error) {
	ds, bad, err := s.DesiredAll(ctx)
	as := []api.Allocation{}
	for _, d := range ds {
		if d.Running() {
			as = append(as, d.Allocation)
		}
	}
	sort.Slice(as, func(i, j int) bool { return as[i].Job < as[j].Job })
	return as, bad, err
}

// Allocation reads one job's allocation (ErrNotFound when it holds none).
func (s *Store) Allocation(ctx context.Context, job string) (*api.Allocation, error) {
	d, err := s.Desired(ctx, job)
	if err != nil {
		return nil, err
	}
	if !d.Running() {
		return nil, fmt.Errorf("allocation of %q: %w", job, ErrNotFound)
	}
	return &d.Allocation, nil
}

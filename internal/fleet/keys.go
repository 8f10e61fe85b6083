package fleet

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// DefaultPrefix is the etcd prefix of every hyperpodrun key. It is defined
// here and nowhere else.
const DefaultPrefix = "/hyperpodrun"

// Keys names every key of the etcd layout (docs/internals.md) under one
// prefix. It is the only place a key is formatted: every other package asks
// it for the keys it reads and writes. The zero value uses DefaultPrefix.
type Keys struct {
	prefix string
}

// NewKeys returns the layout under prefix ("" means DefaultPrefix; a
// trailing slash is dropped).
func NewKeys(prefix string) Keys {
	return Keys{prefix: NormalizePrefix(prefix)}
}

// NormalizePrefix applies the default and drops a trailing slash.
func NormalizePrefix(prefix string) string {
	prefix = strings.TrimRight(prefix, "/")
	if prefix == "" {
		return DefaultPrefix
	}
	return prefix
}

// Prefix is the layout's prefix, without a trailing slash.
func (k Keys) Prefix() string {
	if k.prefix == "" {
		return DefaultPrefix
	}
	return k.prefix
}

func (k Keys) under(dir string) string { return k.Prefix() + "/" + dir + "/" }

// Root is the prefix of every key of the layout ("<prefix>/").
func (k Keys) Root() string { return k.Prefix() + "/" }

// TeamsPrefix is the prefix of every team record.
func (k Keys) TeamsPrefix() string { return k.under("teams") }

// Team is a team's record: api.Team.
func (k Keys) Team(team string) string { return k.TeamsPrefix() + team }

// SpecsPrefix is the prefix of every job spec.
func (k Keys) SpecsPrefix() string { return k.under("specs") }

// TeamSpecs is the prefix of one team's job specs: a team's etcd role
// may write under it and nowhere else (docs/security.md).
func (k Keys) TeamSpecs(team string) string { return k.SpecsPrefix() + team + "/" }

// Spec is a job's spec (JobSpec), under its team's prefix. Job names are
// unique across teams; when two teams' specs name one job, the older spec
// (lower create revision) owns the name and the other is ignored.
func (k Keys) Spec(team, job string) string { return k.TeamSpecs(team) + job }

// SpecOwner splits a spec key into its team and job; ok is false for any
// other key.
//
// Unlike ParseSpecKey it takes any non-empty names up to MaxReadName
// bytes: a spec whose name is no DNS-1123 label is read, for the engine to
// report it invalid. A longer name is not read at all: the coordinator
// keys the job's status and events by it, and a transaction carrying a
// 600 KB name three times was refused, with the decisions of every job
// that shared it, cycle after cycle.
func (k Keys) SpecOwner(key string) (team, job string, ok bool) {
	s, ok := segments(key, k.SpecsPrefix(), 2)
	if !ok || len(s[0]) > MaxReadName || len(s[1]) > MaxReadName {
		return "", "", false
	}
	return s[0], s[1], true
}

// MaxReadName is the longest team or job name of a spec key that is read
// (253, a DNS subdomain's bound; a valid name is a DNS-1123 label of at
// most 63).
const MaxReadName = 253

// CredsPrefix is the prefix of the per-job etcd credentials the
// coordinator mints when auth is on; only the coordinator and the node
// agents may read them.
func (k Keys) CredsPrefix() string { return k.under("creds") }

// Creds is a job's etcd credentials: JobCreds.
func (k Keys) Creds(job string) string { return k.CredsPrefix() + job }

// TeamCredsPrefix is the prefix of the team users' credentials the
// coordinator created (etcd auth on): root's to read.
func (k Keys) TeamCredsPrefix() string { return k.under("team-creds") }

// TeamCreds is the etcd credentials of the user the coordinator created
// for a team applied after elasticctl auth bootstrap: TeamCreds.
func (k Keys) TeamCreds(team string) string { return k.TeamCredsPrefix() + team }

// DesiredPrefix is the prefix of every desired record.
func (k Keys) DesiredPrefix() string { return k.under("desired") }

// Desired is the coordinator's one record of what it wants of a job:
// Desired (size, nodes, stop, generation).
func (k Keys) Desired(job string) string { return k.DesiredPrefix() + job }

// AssignPrefix is the prefix of every per-node assignment.
func (k Keys) AssignPrefix() string { return k.under("assign") }

// NodeAssignments is the prefix of one node's assignments: its agent
// watches this prefix and nothing else of the coordinator's, so a decision
// costs one watch event per node it touches.
func (k Keys) NodeAssignments(node string) string { return k.AssignPrefix() + node + "/" }

// Assignment says job is placed on node: Assignment. The coordinator
// writes it in the transaction that writes the job's desired record, and
// deletes it in the one that takes the node away.
func (k Keys) Assignment(node, job string) string { return k.NodeAssignments(node) + job }

// AssignmentOwner splits an assignment key into its node and job; ok is
// false for any other key.
//
// Unlike ParseAssignmentKey it takes any non-empty names.
func (k Keys) AssignmentOwner(key string) (node, job string, ok bool) {
	s, ok := segments(key, k.AssignPrefix(), 2)
	if !ok {
		return "", "", false
	}
	return s[0], s[1], true
}

// StatusPrefix is the prefix of every status record.
func (k Keys) StatusPrefix() string { return k.under("status") }

// Status is a job's latest decision: Status.
func (k Keys) Status(job string) string { return k.StatusPrefix() + job }

// EventsPrefix is the prefix of the decision events, in time order.
func (k Keys) EventsPrefix() string { return k.under("events") }

// Event names a decision event: time-ordered.
func (k Keys) Event(t time.Time, job string) string {
	return k.EventsPrefix() + fmt.Sprintf("%020d-%s", t.UnixNano(), job)
}

// NodesPrefix is the prefix of every node inventory.
func (k Keys) NodesPrefix() string { return k.under("nodes") }

// Node is a node's inventory (api.Inventory), under its agent's lease.
func (k Keys) Node(node string) string { return k.NodesPrefix() + node }

// FinishedPrefix is the prefix of every finish record. Finish records have
// a prefix of their own: the coordinator lists them every cycle, and under
// jobs/ it would read every running job's rendezvous keys too.
func (k Keys) FinishedPrefix() string { return k.under("finished") }

// Finish is a job's finish record: Finish.
func (k Keys) Finish(job string) string { return k.FinishedPrefix() + job }

// ProblemsPrefix holds what node agents found wrong when starting jobs.
func (k Keys) ProblemsPrefix() string { return k.under("problems") }

// Problems is the prefix of a job's problem records, one per node.
func (k Keys) Problems(job string) string { return k.ProblemsPrefix() + job + "/" }

// Problem is a node's problem record of a job.
func (k Keys) Problem(job, node string) string { return k.Problems(job) + node }

// AlivePrefix is the prefix of the nodes' liveness keys.
func (k Keys) AlivePrefix() string { return k.under("alive") }

// Alive is a node's liveness key: written by that node's own etcd user
// under a lease only it knows, read by the coordinator (docs/security.md).
func (k Keys) Alive(node string) string { return k.AlivePrefix() + node }

// ReportsPrefix is the prefix of what node agents report about the jobs
// placed on them: a node's etcd role writes only its own reports/<node>/,
// and the coordinator copies a report into finished/ or problems/ only
// when the job is placed on that node.
func (k Keys) ReportsPrefix() string { return k.under("reports") }

// NodeReports is the prefix of one node's reports.
func (k Keys) NodeReports(node string) string { return k.ReportsPrefix() + node + "/" }

// Report kinds: the segment after reports/<node>/.
const (
	ReportFinished = "finished"
	ReportProblem  = "problems"
)

// FinishReport is node's report that job finished there: Finish.
func (k Keys) FinishReport(node, job string) string {
	return k.NodeReports(node) + ReportFinished + "/" + job
}

// ProblemReport is node's report of a problem with job: Problem.
func (k Keys) ProblemReport(node, job string) string {
	return k.NodeReports(node) + ReportProblem + "/" + job
}

// ReportOwner splits a report key into its node, kind (ReportFinished or
// ReportProblem) and job; ok is false for any other key.
//
// Unlike ParseReportKey it takes any non-empty node and job names.
func (k Keys) ReportOwner(key string) (node, kind, job string, ok bool) {
	s, ok := segments(key, k.ReportsPrefix(), 3)
	if !ok || (s[1] != ReportFinished && s[1] != ReportProblem) {
		return "", "", "", false
	}
	return s[0], s[1], s[2], true
}

// EnrollPrefix holds the node agents' enrollment requests (Kubernetes):
// enroll/<node> is a pod's ServiceAccount token and a public key, written
// by the shared enrollment user, which may write nothing else.
func (k Keys) EnrollPrefix() string { return k.under("enroll") }

// Enroll is node's enrollment request.
func (k Keys) Enroll(node string) string { return k.EnrollPrefix() + node }

// EnrollApprovedPrefix holds the enrollments hyperpod-kube-controller
// approved (the token was a pod of the agent's DaemonSet on that node):
// only it and the coordinator write there.
func (k Keys) EnrollApprovedPrefix() string { return k.under("enroll-approved") }

// EnrollApproved is node's approved enrollment.
func (k Keys) EnrollApproved(node string) string { return k.EnrollApprovedPrefix() + node }

// EnrollRepliesPrefix holds the coordinator's replies: node's etcd
// password sealed to the request's public key.
func (k Keys) EnrollRepliesPrefix() string { return k.under("enroll-replies") }

// EnrollReply is node's enrollment reply.
func (k Keys) EnrollReply(node string) string { return k.EnrollRepliesPrefix() + node }

// CoordinatorPrefix is the prefix of the coordinators' own records (usage,
// leader election).
func (k Keys) CoordinatorPrefix() string { return k.under("coordinator") }

// JobsPrefix is the prefix of every running job's keys (Job).
func (k Keys) JobsPrefix() string { return k.under("jobs") }

// Usage is the teams' usage of the last decision: []api.TeamUsage.
func (k Keys) Usage() string { return k.CoordinatorPrefix() + "usage" }

// Leader is the coordinators' concurrency.Election prefix.
func (k Keys) Leader() string { return k.CoordinatorPrefix() + "leader" }

// Epoch is the fleet's epoch record (Epoch): written once by the
// coordinator when absent, so a new one means etcd lost its data (a wipe,
// or a new cluster). Under coordinator/ so that every role may read it.
func (k Keys) Epoch() string { return k.CoordinatorPrefix() + "epoch" }

// Job is the prefix of everything a running job keeps: its rendezvous,
// restart count, checkpoint record and ready barriers.
func (k Keys) Job(job string) string { return k.JobsPrefix() + job + "/" }

// Restarts is a job's global failure-restart count: a decimal (Count).
func (k Keys) Restarts(job string) string { return k.Job(job) + "restarts" }

// RestartsCounted is the last round whose failure was counted in Restarts:
// a decimal (Count). It is written with Restarts in one transaction so a
// round's failure is counted once however many closers see it.
func (k Keys) RestartsCounted(job string) string { return k.Job(job) + "restarts-counted" }

// Checkpoint is a job's latest committed checkpoint (checkpoint.Record).
func (k Keys) Checkpoint(job string) string { return k.Job(job) + "checkpoint" }

// CheckpointFailed is the last planned change of a job whose checkpoint
// could not be saved (CheckpointFailure): what it cost, for elasticctl
// describe.
func (k Keys) CheckpointFailed(job string) string { return k.Job(job) + "checkpoint-failed" }

// ReadyPrefix is the prefix of a job's ready barriers.
func (k Keys) ReadyPrefix(job string) string { return k.Job(job) + "ready/" }

// ReadyRound is the prefix of round's ready barrier; keys under it sort by
// round, so every older round's barrier lies before ReadyRound(job, round).
func (k Keys) ReadyRound(job string, round int64) string {
	return k.ReadyPrefix(job) + Hex16(round) + "/"
}

// Ready marks node ready for round: its previous workers are gone.
func (k Keys) Ready(job string, round int64, node string) string {
	return k.ReadyRound(job, round) + node
}

// RunningPrefix is the prefix of a job's running-workers markers.
func (k Keys) RunningPrefix(job string) string { return k.Job(job) + "running/" }

// Running marks that node's workers of a round are (or may be) alive: the
// round number (Hex16), under the node's rendezvous lease, written before
// they start and deleted once they are gone. A round's workers start only
// when no node holds a marker of an older round (a node leaving the job
// may still be checkpointing).
func (k Keys) Running(job, node string) string { return k.RunningPrefix(job) + node }

// Rdzv is the key layout of a job's rendezvous.
func (k Keys) Rdzv(job string) RdzvKeys {
	r := k.Job(job) + "rdzv/"
	return RdzvKeys{
		Base:     r,
		Nodes:    r + "n/",
		Members:  r + "n/m/",
		Queue:    r + "q/",
		Acks:     r + "n/a/",
		Failures: r + "n/f/",
		Done:     r + "n/d/",
		Head:     r + "r/head",
		Chunks:   r + "r/c/",
	}
}

// RdzvKeys is the layout of one job's rendezvous; its records are private
// to package rendezvous.
//
//	rdzv/n/m/<node>             member record, JSON, under the node's lease
//	rdzv/q/<inverted rev>/...   queue entry -> node id, under the node's lease (rendezvous/election.go)
//	rdzv/n/a/<node>             the node's acknowledgement of a proposal, under its lease
//	rdzv/n/f/<round>            first failure report of a round (no lease)
//	rdzv/n/d/<round>            first node that finished a round (no lease)
//	rdzv/r/head                 round header, JSON; written only by the closer
//	rdzv/r/c/<round>/<nonce>/<i> member chunks of a round; written only by the closer
//
// Nodes write only keys that name themselves (m, q, a) or a round (f, d,
// guarded by create-revision 0); the closer alone writes under r/. The
// closer watches n/ (not q/, which only orders the closer election).
type RdzvKeys struct {
	Base                 string // prefix of the whole rendezvous
	Nodes                string // prefix of everything nodes write
	Members, Queue, Acks string
	Failures, Done       string
	Head, Chunks         string
}

// Member is a node's member record.
func (k RdzvKeys) Member(node string) string { return k.Members + node }

// Ack is a node's acknowledgement of a proposal.
func (k RdzvKeys) Ack(node string) string { return k.Acks + node }

// QueueKey sorts queue entries newest first: the first key after a node's
// own entry is its predecessor (the youngest older node), found with a plain
// ascending range of limit 1 (etcd can push the limit down only for
// ascending key order; sorting by create revision reads the whole prefix).
func (k RdzvKeys) QueueKey(rev int64) string {
	return k.Queue + fmt.Sprintf("%016x", uint64(math.MaxInt64-rev))
}

// Failure is the first failure report of round.
func (k RdzvKeys) Failure(round int64) string { return k.Failures + Hex16(round) }

// DoneKey is the first node that finished round.
func (k RdzvKeys) DoneKey(round int64) string { return k.Done + Hex16(round) }

// RoundChunks is the prefix of every member chunk of round; keys under
// Chunks sort by round.
func (k RdzvKeys) RoundChunks(round int64) string { return k.Chunks + Hex16(round) + "/" }

// ChunkPrefix is the prefix of round's member chunks under its nonce.
func (k RdzvKeys) ChunkPrefix(round int64, nonce string) string {
	return k.RoundChunks(round) + nonce + "/"
}

// Chunk is one member chunk of a round.
func (k RdzvKeys) Chunk(round int64, nonce string, i int) string {
	return fmt.Sprintf("%s%06d", k.ChunkPrefix(round, nonce), i)
}

// Hex16 renders a round number as the fixed-width segment that makes keys
// sort by round.
func Hex16(n int64) string { return fmt.Sprintf("%016x", uint64(n)) }

// ParseRound reads a round number written by Hex16 (16 hex digits, at most
// math.MaxInt64); ok is false for anything else.
func ParseRound(seg string) (round int64, ok bool) {
	if len(seg) != 16 {
		return 0, false
	}
	n, err := strconv.ParseUint(seg, 16, 63)
	if err != nil {
		return 0, false
	}
	return int64(n), true
}

// FailureRound is the round a failure report's key (RdzvKeys.Failure)
// names; ok is false for a key that is not one.
func (k RdzvKeys) FailureRound(key string) (int64, bool) {
	seg, ok := strings.CutPrefix(key, k.Failures)
	if !ok {
		return 0, false
	}
	return ParseRound(seg)
}

// DoneRound is the round a finish marker's key (RdzvKeys.DoneKey) names;
// ok is false for a key that is not one.
func (k RdzvKeys) DoneRound(key string) (int64, bool) {
	seg, ok := strings.CutPrefix(key, k.Done)
	if !ok {
		return 0, false
	}
	return ParseRound(seg)
}

// Documented lists every key of the layout, with placeholders (<job>,
// <team>, <node>, <round>, <unix-nanos>), as docs/internals.md's table
// does; a test keeps the two in step.
func (k Keys) Documented() []string {
	return []string{
		k.Rdzv("<job>").Base + "...",
		k.Restarts("<job>"),
		k.RestartsCounted("<job>"),
		k.Checkpoint("<job>"),
		k.CheckpointFailed("<job>"),
		k.ReadyPrefix("<job>") + "<round>/<node>",
		k.Running("<job>", "<node>"),
		k.Desired("<job>"),
		k.Assignment("<node>", "<job>"),
		k.Finish("<job>"),
		k.Problem("<job>", "<node>"),
		k.Node("<node>"),
		k.Alive("<node>"),
		k.FinishReport("<node>", "<job>"),
		k.ProblemReport("<node>", "<job>"),
		k.Team("<team>"),
		k.Spec("<team>", "<job>"),
		k.Creds("<job>"),
		k.TeamCreds("<team>"),
		k.Status("<job>"),
		k.Usage(),
		k.EventsPrefix() + "<unix-nanos>-<job>",
		k.Leader(),
		k.Epoch(),
		k.Enroll("<node>"),
		k.EnrollApproved("<node>"),
		k.EnrollReply("<node>"),
	}
}

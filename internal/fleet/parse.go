package fleet

import (
	"strings"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
)

// The parsers below are the inverse of the formatters in keys.go: every
// package that reads a key back into its names asks them, and none strips
// a prefix by hand. Each checks the whole key: the layout's prefix, the
// directory, the number of segments and every name in it (a job or team
// is a DNS-1123 label, a node a node name), so a key written by hand under
// another prefix, with an extra segment, an empty or a ".." segment is
// refused rather than read as a name.

// ParseNodeKey is the node a node inventory key (Keys.Node) names.
func (k Keys) ParseNodeKey(key string) (node string, ok bool) {
	return oneSegment(key, k.NodesPrefix(), ValidNodeName)
}

// ParseAliveKey is the node a liveness key (Keys.Alive) names.
func (k Keys) ParseAliveKey(key string) (node string, ok bool) {
	return oneSegment(key, k.AlivePrefix(), ValidNodeName)
}

// ParseTeamKey is the team a team record's key (Keys.Team) names.
func (k Keys) ParseTeamKey(key string) (team string, ok bool) {
	return oneSegment(key, k.TeamsPrefix(), validLabel)
}

// ParseFinishKey is the job a finish record's key (Keys.Finish) names.
func (k Keys) ParseFinishKey(key string) (job string, ok bool) {
	return oneSegment(key, k.FinishedPrefix(), validLabel)
}

// ParseDesiredKey is the job a desired record's key (Keys.Desired) names.
func (k Keys) ParseDesiredKey(key string) (job string, ok bool) {
	return oneSegment(key, k.DesiredPrefix(), validLabel)
}

// ParseStatusKey is the job a status record's key (Keys.Status) names.
func (k Keys) ParseStatusKey(key string) (job string, ok bool) {
	return oneSegment(key, k.StatusPrefix(), validLabel)
}

// SpecKey is what a job spec's key (Keys.Spec) names.
type SpecKey struct {
	Team, Job string
}

// ParseSpecKey splits a job spec's key into its team and job, both
// DNS-1123 labels. The engine's input reads specs with SpecOwner instead,
// which takes any job segment: a spec whose name is no label is read so
// that the engine can report it invalid.
func (k Keys) ParseSpecKey(key string) (SpecKey, bool) {
	s, ok := segments(key, k.SpecsPrefix(), 2)
	if !ok || !validLabel(s[0]) || !validLabel(s[1]) {
		return SpecKey{}, false
	}
	return SpecKey{Team: s[0], Job: s[1]}, true
}

// AssignmentKey is what an assignment's key (Keys.Assignment) names.
type AssignmentKey struct {
	Node, Job string
}

// ParseAssignmentKey splits an assignment's key into its node and job.
func (k Keys) ParseAssignmentKey(key string) (AssignmentKey, bool) {
	s, ok := segments(key, k.AssignPrefix(), 2)
	if !ok || !ValidNodeName(s[0]) || !validLabel(s[1]) {
		return AssignmentKey{}, false
	}
	return AssignmentKey{Node: s[0], Job: s[1]}, true
}

// ReportKey is what a node's report key (Keys.FinishReport,
// Keys.ProblemReport) names: Kind is ReportFinished or ReportProblem.
type ReportKey struct {
	Node, Kind, Job string
}

// ParseReportKey splits a report's key into its node, kind and job.
func (k Keys) ParseReportKey(key string) (ReportKey, bool) {
	s, ok := segments(key, k.ReportsPrefix(), 3)
	if !ok || !ValidNodeName(s[0]) || (s[1] != ReportFinished && s[1] != ReportProblem) || !validLabel(s[2]) {
		return ReportKey{}, false
	}
	return ReportKey{Node: s[0], Kind: s[1], Job: s[2]}, true
}

// ProblemKey is what a problem record's key (Keys.Problem) names.
type ProblemKey struct {
	Job, Node string
}

// ParseProblemKey splits a problem record's key into its job and node.
func (k Keys) ParseProblemKey(key string) (ProblemKey, bool) {
	s, ok := segments(key, k.ProblemsPrefix(), 2)
	if !ok || !validLabel(s[0]) || !ValidNodeName(s[1]) {
		return ProblemKey{}, false
	}
	return ProblemKey{Job: s[0], Node: s[1]}, true
}

// EventKey is what a decision event's key (Keys.Event) names.
type EventKey struct {
	Time time.Time
	Job  string
}

// ParseEventKey splits an event's key into its time and job.
func (k Keys) ParseEventKey(key string) (EventKey, bool) {
	rest, ok := strings.CutPrefix(key, k.EventsPrefix())
	if !ok || len(rest) < 22 || rest[20] != '-' {
		return EventKey{}, false
	}
	var nanos int64
	for _, c := range rest[:20] {
		if c < '0' || c > '9' || nanos > (1<<63-1-9)/10 {
			return EventKey{}, false
		}
		nanos = nanos*10 + int64(c-'0')
	}
	job := rest[21:]
	if !validLabel(job) {
		return EventKey{}, false
	}
	return EventKey{Time: time.Unix(0, nanos), Job: job}, true
}

// RunningKey is what a running-workers marker's key (Keys.Running) names.
type RunningKey struct {
	Job, Node string
}

// ParseRunningKey splits a running-workers marker's key into its job and
// node.
func (k Keys) ParseRunningKey(key string) (RunningKey, bool) {
	s, ok := segments(key, k.JobsPrefix(), 3)
	if !ok || s[1] != "running" || !validLabel(s[0]) || !ValidNodeName(s[2]) {
		return RunningKey{}, false
	}
	return RunningKey{Job: s[0], Node: s[2]}, true
}

// ReadyKey is what a ready barrier's key (Keys.Ready) names.
type ReadyKey struct {
	Job   string
	Round int64
	Node  string
}

// ParseReadyKey splits a ready barrier's key into its job, round (Hex16)
// and node.
func (k Keys) ParseReadyKey(key string) (ReadyKey, bool) {
	s, ok := segments(key, k.JobsPrefix(), 4)
	if !ok || s[1] != "ready" || !validLabel(s[0]) || !ValidNodeName(s[3]) {
		return ReadyKey{}, false
	}
	round, ok := ParseRound(s[2])
	if !ok {
		return ReadyKey{}, false
	}
	return ReadyKey{Job: s[0], Round: round, Node: s[3]}, true
}

// anyName accepts every non-empty segment: the lenient readers
// (SpecOwner, AssignmentOwner, JobOfKey) check a key's shape, not its
// names.
func anyName(string) bool { return true }

// oneSegment is the one name under dir in key, when valid accepts it.
func oneSegment(key, dir string, valid func(string) bool) (string, bool) {
	s, ok := segments(key, dir, 1)
	if !ok || !valid(s[0]) {
		return "", false
	}
	return s[0], true
}

// segments splits what follows dir in key into exactly n non-empty
// segments.
func segments(key, dir string, n int) ([]string, bool) {
	rest, ok := strings.CutPrefix(key, dir)
	if !ok {
		return nil, false
	}
	s := strings.SplitN(rest, "/", n+1)
	if len(s) != n {
		return nil, false
	}
	for _, seg := range s {
		if seg == "" {
			return nil, false
		}
	}
	return s, true
}

// validLabel accepts a job or team name: a DNS-1123 label (api.ValidateName).
func validLabel(s string) bool { return api.ValidateName("name", s) == nil }

// ValidNodeName reports whether name can be a node's key segment: 1 to 253
// letters, digits, '.', '_' or '-', starting and ending with a letter or
// digit (every Kubernetes node name qualifies), so neither "." nor ".."
// nor anything with a '/'.
func ValidNodeName(name string) bool {
	if len(name) == 0 || len(name) > 253 || !alnum(name[0]) || !alnum(name[len(name)-1]) {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !alnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func alnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

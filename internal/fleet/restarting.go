package fleet

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// RestartingWindow is how long after hyperpodrun's last restart of a
// job's workers (a worker failure inside the restart budget, a hang) the
// job shows Restarting (elasticctl get jobs' STATE, the ElasticJob's
// reason), unless it committed a checkpoint since: a crash loop (issue
// 24's job restarted every 3 s) shows Restarting throughout, and a job
// that failed once shows Running again five minutes later, or at its next
// checkpoint. Five minutes is kubectl's longest CrashLoopBackOff.
const RestartingWindow = 5 * time.Minute

// Rules of WorkerRestarts.Restarting.
const (
	RuleRestartsFinished    = "finished"
	RuleRestartsNone        = "never-restarted"
	RuleRestartsTimeUnknown = "time-unknown"
	RuleRestartsCheckpoint  = "checkpoint-since"
	RuleRestartsRecent      = "recent"
	RuleRestartsSettled     = "settled"
)

// Restarting decides whether a job shows Restarting because hyperpodrun
// restarted its workers recently, from its restart record w (nil: none),
// whether the job finished, and the time now; it returns the rule that
// decided. Rules, in order:
//
//   - finished: a finished job shows its outcome: no;
//   - never-restarted: no restart counted: no;
//   - time-unknown: the last failure report has no time (a hyperpodrun
//     older than the field, or the report is gone): no (the count still
//     shows in describe and the ElasticJob's status);
//   - checkpoint-since: a checkpoint was committed after the last
//     failure, so the job made progress since: no;
//   - recent: the last failure is less than RestartingWindow old (or in
//     the future: the reporting node's clock is ahead): yes;
//   - settled: anything else: no.
func (w *WorkerRestarts) Restarting(finished bool, now time.Time) (bool, string) {
	switch {
	case finished:
		return false, RuleRestartsFinished
	case w == nil || w.Count <= 0:
		return false, RuleRestartsNone
	case w.LastTime.IsZero():
		return false, RuleRestartsTimeUnknown
	case w.CheckpointTime.After(w.LastTime):
		return false, RuleRestartsCheckpoint
	case now.Sub(w.LastTime) < RestartingWindow:
		return true, RuleRestartsRecent
	}
	return false, RuleRestartsSettled
}

// RestartingMessage says why a job is Restarting: the count (and
// MaxRestarts when known), when the last failure was (when: "45s ago",
// "at 2026-11-26T02:30:15Z"), its round and node, and the first line of
// the last error.
func (w *WorkerRestarts) RestartingMessage(when string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "hyperpodrun restarted the workers after failures %d time(s)", w.Count)
	if w.MaxRestarts > 0 {
		fmt.Fprintf(&b, " of maxRestarts %d", w.MaxRestarts)
	}
	b.WriteString(", the last " + when)
	if w.LastRound > 0 {
		fmt.Fprintf(&b, " (round %d", w.LastRound)
		if w.LastNode != "" {
			b.WriteString(" on " + w.LastNode)
		}
		b.WriteString(")")
	}
	if first, _, _ := strings.Cut(strings.TrimSpace(w.LastError), "\n"); first != "" {
		const most = 160
		if utf8.RuneCountInString(first) > most {
			first = string([]rune(first)[:most]) + "..."
		}
		b.WriteString(": " + first)
	}
	return b.String()
}

// JobOfRestartsKey is the job whose restart count (Keys.Restarts) key
// is; ok is false for any other key.
func (k Keys) JobOfRestartsKey(key string) (job string, ok bool) {
	rest, ok := strings.CutPrefix(key, k.JobsPrefix())
	if !ok {
		return "", false
	}
	job, ok = strings.CutSuffix(rest, "/restarts")
	if !ok || job == "" || strings.Contains(job, "/") {
		return "", false
	}
	return job, true
}

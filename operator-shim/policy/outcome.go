package policy

import (
	"fmt"
	"slices"
	"strings"
)

// outcome is what one cycle decided for a job. The phase that decides it
// records it through the set methods below, as Kueue's scheduler records an
// entry's status and inadmissibleMsg where it decides them; explain.go only
// renders it into a Reason.
//
// A later phase may change a job again (a job repaired in carry-over can be
// shrunk by a reclaim, then nothing else; a shrunk job can grow back): each
// set method then records the net outcome of the cycle so far.
type outcome struct {
	kind ReasonKind
	code ReasonCode
	// msg is the whole message, for outcomes that nothing later in the cycle
	// changes and whose message needs no end-of-cycle usage: invalid,
	// suspended, no team or flavor, requeued, moved.
	msg string
	// detail says what changed in the spec (a SpecChanged shrink).
	detail string
	// forJobs and forTeam name the jobs this job gave way to (as a victim of
	// reclaim or priority preemption, or moved by defragmentation) and the
	// team of the last of them.
	forJobs []string
	forTeam string
	// borrowed: a growth step of this cycle took borrowed quota.
	borrowed bool
	// growBlock is why an elastic job did not grow (Running only).
	growBlock ReasonCode
}

// setInvalid records that the job's spec is invalid (build).
func (j *jobRT) setInvalid(err error) {
	j.out = outcome{kind: KindInvalid, code: CodeInvalidSpec, msg: "invalid spec: " + err.Error()}
}

// setSuspended records that the user suspended the job (build).
func (j *jobRT) setSuspended() {
	msg := "suspended"
	if by := j.spec.RequestedBy; by != "" {
		msg += " by " + by
	}
	j.out = outcome{kind: KindSuspended, code: CodeSuspended, msg: msg}
}

// setPending records that the job waits. With a message, the cause is known
// now (no team, no flavor); without one, explain.go renders the cause from
// the end state of the cycle.
func (j *jobRT) setPending(code ReasonCode, msg string) {
	j.out = outcome{kind: KindPending, code: code, msg: msg}
}

// releasedNote is appended to the message of a job that held nodes and
// holds none now.
func (j *jobRT) releasedNote() string {
	if j.prevSize == 0 {
		return ""
	}
	return "; released " + plural(j.prevSize, "node")
}

// release records that carry-over dropped the allocation of an invalid or
// suspended job, or of a job whose team or flavor is gone (then it is
// preempted, not pending).
func (j *jobRT) release() {
	j.out.msg += j.releasedNote()
	if j.out.kind == KindPending {
		j.out.kind = KindPreempted
	}
}

// setCarried records that carry-over kept the job's allocation.
func (j *jobRT) setCarried() {
	j.out = outcome{kind: KindRunning}
}

// setRequeued records that the job lost its whole allocation in carry-over
// or repair (spec changed, nodes lost): why is the message without the
// released note.
func (j *jobRT) setRequeued(code ReasonCode, why string) {
	j.out = outcome{kind: KindPreempted, code: code, msg: why + "; requeued" + j.releasedNote()}
}

// setShrunk records that carry-over or repair shrank the job (code
// SpecChanged with detail, or NodeLost). The message names the final size,
// which growth may still change: see setGrown.
func (j *jobRT) setShrunk(code ReasonCode, detail string) {
	j.out.kind, j.out.code, j.out.detail = KindShrunk, code, detail
}

// setRepaired records that every lost node was replaced. A job its spec
// shrank in the same cycle (the user's resize) stays a SpecChanged shrink.
func (j *jobRT) setRepaired() {
	if j.out.kind == KindShrunk && j.out.code == CodeSpecChanged {
		return
	}
	j.out.kind, j.out.code = KindRepaired, CodeNodeLost
}

// setAdmitted records that the job was admitted at its minimum size; code
// says how (within quota, borrowing, reclaim, priority preemption).
func (j *jobRT) setAdmitted(code ReasonCode) {
	j.out.kind, j.out.code = KindAdmitted, code
}

// yieldTo records that the job gave capacity to by.
func (j *jobRT) yieldTo(by *jobRT) {
	j.out.forTeam = by.tf.team.name
	if !slices.Contains(j.out.forJobs, by.name) {
		j.out.forJobs = append(j.out.forJobs, by.name)
	}
}

// setTakenBy records that the job was shrunk or preempted for by (code
// Reclaim or PriorityPreemption). Nothing later in the cycle resizes it.
func (j *jobRT) setTakenBy(by *jobRT, code ReasonCode) {
	j.yieldTo(by)
	j.out.code = code
	if j.size > 0 {
		j.out.kind = KindShrunk
		return
	}
	j.out.kind = KindPreempted
	switch code {
	case CodeReclaim:
		j.out.msg = fmt.Sprintf("preempted: team %s reclaimed its nominal quota for %s while team %s was borrowing; requeued", j.out.forTeam, strings.Join(j.out.forJobs, ", "), j.tf.team.name)
	case CodePriorityPreemption:
		j.out.msg = fmt.Sprintf("preempted by higher-priority %s of the same team %s (this job's priority is %d); requeued", strings.Join(j.out.forJobs, ", "), j.tf.team.name, j.sp.prio)
	}
	j.out.msg += j.releasedNote()
}

// setMoved records that defragmentation moved the job (from its previous
// node, or "?" if it had none) for by. A job admitted in this cycle stays
// Admitted, reported as within quota as before this record existed; one
// below its previous size stays a NodeLost shrink.
func (j *jobRT) setMoved(by *jobRT) {
	j.yieldTo(by)
	switch {
	case j.out.kind == KindAdmitted:
		j.out.code = CodeWithinQuota
	case j.size < j.prevSize:
		j.out.kind, j.out.code = KindShrunk, CodeNodeLost
	default:
		from := "?"
		if len(j.prevNodes) > 0 {
			from = j.prevNodes[0]
		}
		j.out.kind, j.out.code = KindMoved, CodeDefragment
		j.out.msg = fmt.Sprintf("moved from node %s to %s to make room for %s of team %s (guaranteed quota; free capacity was fragmented)", from, j.nodes[0].name, strings.Join(j.out.forJobs, ", "), j.out.forTeam)
	}
}

// setGrown records one growth step; borrowed: the team is above its nominal
// quota after it. A job admitted in this cycle stays Admitted (its message
// names the grown size). A carried job above its previous size is Grown
// (NodeLost when carry-over found nodes to repair, else FairShare); one grown
// back to its previous size after a shrink is Running; otherwise the earlier
// outcome (a shrink, a repair) stands.
func (j *jobRT) setGrown(borrowed bool) {
	j.out.borrowed = j.out.borrowed || borrowed
	j.out.growBlock = ""
	switch {
	case j.out.kind == KindAdmitted:
	case j.size > j.prevSize:
		j.out.kind, j.out.code = KindGrown, CodeFairShare
		if j.repairNeed > 0 {
			j.out.code = CodeNodeLost
		}
	case j.size == j.prevSize && j.out.kind == KindShrunk:
		j.out.kind, j.out.code = KindRunning, ""
	}
}

// blockGrowth records why an elastic job does not grow (further).
func (j *jobRT) blockGrowth(code ReasonCode) {
	j.out.growBlock = code
}

// The phases read back what they recorded: these replace the per-cycle
// booleans the engine kept beside the record.

// admitted reports whether the job was admitted in this cycle and holds that
// allocation.
func (j *jobRT) admitted() bool { return j.out.kind == KindAdmitted }

// preempted reports whether the job lost its whole allocation in this cycle
// (requeued or preempted): it is not admitted again before the next cycle.
func (j *jobRT) preempted() bool { return j.out.kind == KindPreempted }

// yielded reports whether the job gave capacity to another job in this
// cycle, as a victim or moved: it is neither moved nor grown afterwards.
func (j *jobRT) yielded() bool { return len(j.out.forJobs) > 0 }

package main

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Job kinds: the PyTorch DDP job and the bundled-worker job.
const (
	kindDDP    = "ddp"
	kindWorker = "worker"
	outputKeep = 40 // output lines kept per job, for the report
)

// jobState is what the soak knows of one submitted job.
type jobState struct {
	name, kind string
	gen        int
	steps      int // configured
	submitted  time.Time
	// From rank 0's step lines.
	lastStep, maxStep, restarts int
	// From the checkpoint record: the highest committed step seen, and the
	// record's last readable value.
	committed, record int64
	// From `elasticctl get jobs -o json`.
	state, message string
	finished       bool // Succeeded or Failed, seen
	ended          time.Time
	output         []string
	// uids are the uids its workers and hyperpodruns were seen running as
	// (/proc), in the order first seen.
	uids []uint32
	// wiped: etcd lost its data under the job (the etcd_wipe fault): it
	// is gone from the control plane, its node agents stop it, and its
	// output is no longer judged.
	wiped bool
}

// jobTable tracks the soak's jobs and turns their output into invariant
// checks.
type jobTable struct {
	mu    sync.Mutex
	jobs  map[string]*jobState
	order []string
}

func newJobTable() *jobTable { return &jobTable{jobs: map[string]*jobState{}} }

func (t *jobTable) add(j *jobState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.jobs[j.name] = j
	t.order = append(t.order, j.name)
}

// running reports whether job was submitted by the soak and has not ended.
func (t *jobTable) running(job string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	j := t.jobs[job]
	return j != nil && !j.finished
}

func (t *jobTable) runningNames() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, n := range t.order {
		if !t.jobs[n].finished {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// snapshot copies every job's state, in submission order.
func (t *jobTable) snapshot() []jobState {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]jobState, 0, len(t.order))
	for _, n := range t.order {
		j := *t.jobs[n]
		j.output = append([]string(nil), j.output...)
		j.uids = append([]uint32(nil), j.uids...)
		out = append(out, j)
	}
	return out
}

// agentLine matches the node agent's copy of a job's console output:
// "<node>/<job> <line>".
var agentLine = regexp.MustCompile(`^([a-z0-9-]+)/([a-z0-9-]+) (.*)$`)

// stepLine matches global rank 0's step line (nproc 1 per node, and only
// rank 0 prints steps). Worker output is unprefixed, as under torchrun,
// unless teed ("[default0]:").
var stepLine = regexp.MustCompile(`^(?:\[default0\]:)?step=(\d+) world_size=(\d+) `)

// lineEvent is what one output line meant for the invariants.
type lineEvent struct {
	job          string
	restart      bool
	resumedAfter int // the step the restarted attempt resumed after
	lost         int64
	committed    int64
}

// line feeds one node agent output line; it returns a non-nil event when
// the line shows rank 0 starting over (a restart) so the caller can judge it.
func (t *jobTable) line(text string) *lineEvent {
	m := agentLine.FindStringSubmatch(text)
	if m == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	j := t.jobs[m[2]]
	if j == nil {
		return nil
	}
	j.output = append(j.output, time.Now().Format("15:04:05.000")+" "+m[1]+": "+m[3])
	if len(j.output) > outputKeep {
		j.output = j.output[len(j.output)-outputKeep:]
	}
	sm := stepLine.FindStringSubmatch(m[3])
	if sm == nil || j.wiped {
		return nil
	}
	step, _ := strconv.Atoi(sm[1])
	var ev *lineEvent
	if step <= j.lastStep {
		// Rank 0 starts over: it must resume from the latest committed
		// checkpoint, i.e. after a step >= every commit seen so far.
		j.restarts++
		ev = &lineEvent{job: j.name, restart: true, resumedAfter: step - 1, committed: j.committed}
		if int64(step-1) < j.committed {
			ev.lost = j.committed - int64(step-1)
		}
	}
	j.lastStep = step
	j.maxStep = max(j.maxStep, step)
	return ev
}

// record feeds a readable checkpoint record of job; it returns how many
// committed steps the record lost (it went backwards), and the previous step.
func (t *jobTable) record(job string, step int64) (lost, prev int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	j := t.jobs[job]
	if j == nil {
		return 0, 0
	}
	prev = j.record
	if step < j.record {
		lost = j.record - step
	}
	j.record = step
	j.committed = max(j.committed, step)
	return lost, prev
}

// status records a job's state from elasticctl; it returns true the first
// time the job is seen Succeeded or Failed.
func (t *jobTable) status(job, state, message string) (*jobState, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	j := t.jobs[job]
	if j == nil {
		return nil, false
	}
	if j.wiped {
		return nil, false
	}
	j.state, j.message = state, message
	if j.finished || (state != "Succeeded" && state != "Failed") {
		return nil, false
	}
	j.finished, j.ended = true, time.Now()
	c := *j
	c.output = append([]string(nil), j.output...)
	return &c, true
}

// wipe marks jobs as lost with etcd's data: ended, neither Succeeded nor
// Failed, their output no longer judged.
func (t *jobTable) wipe(names []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range names {
		if j := t.jobs[n]; j != nil && !j.finished {
			j.finished, j.wiped, j.ended, j.state = true, true, time.Now(), "Wiped"
			j.message = "etcd lost its data under it (etcd_wipe); the agents stop it"
		}
	}
}

// sawUIDs records the uids the jobs' workers and hyperpodruns run as.
func (t *jobTable) sawUIDs(ps []proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range ps {
		j := t.jobs[p.job]
		if j == nil || !(p.worker || p.hyperpodrun) || !p.uidKnown || slices.Contains(j.uids, p.uid) {
			continue
		}
		j.uids = append(j.uids, p.uid)
	}
}

func (j jobState) String() string {
	uids := "-"
	if len(j.uids) > 0 {
		var us []string
		for _, u := range j.uids {
			us = append(us, strconv.FormatUint(uint64(u), 10))
		}
		uids = strings.Join(us, ",")
	}
	return fmt.Sprintf("%s (%s, %d steps configured, at step %d, %d restarts of rank 0, committed %d, uid %s, state %s)",
		j.name, j.kind, j.steps, j.maxStep, j.restarts, j.committed, uids, orDash(j.state))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

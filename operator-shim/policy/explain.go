package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// holders caches, per flavor, the largest running jobs: per team, per
// cohort (borrowers only) and overall (borrowers first).
type holders struct {
	team   map[*teamFlavor][]Holder
	cohort map[*cohortRT][]Holder
	all    []Holder
}

// holdersOf returns flavor f's holders, computed once per cycle from the
// end state and cached.
func (s *sched) holdersOf(f *flavorRT, cache map[*flavorRT]*holders) *holders {
	if h := cache[f]; h != nil {
		return h
	}
	k := s.cfg.HolderLimit()
	h := &holders{team: map[*teamFlavor][]Holder{}, cohort: map[*cohortRT][]Holder{}}
	better := func(a, b Holder) bool {
		if a.Borrowing != b.Borrowing {
			return a.Borrowing
		}
		if a.Accelerators != b.Accelerators {
			return a.Accelerators > b.Accelerators
		}
		return a.Job < b.Job
	}
	insert := func(list []Holder, x Holder) []Holder {
		i := len(list)
		for i > 0 && better(x, list[i-1]) {
			i--
		}
		if i >= k {
			return list
		}
		list = slices.Insert(list, i, x)
		if len(list) > k {
			list = list[:k]
		}
		return list
	}
	for _, j := range f.jobs {
		if j.size == 0 {
			continue
		}
		x := Holder{Job: j.name, Team: j.team.name, Accelerators: j.per * j.size, Borrowing: j.tf.used > j.tf.nominal}
		h.team[j.tf] = insert(h.team[j.tf], x)
		if x.Borrowing {
			h.cohort[j.tf.co] = insert(h.cohort[j.tf.co], x)
		}
		h.all = insert(h.all, x)
	}
	cache[f] = h
	return h
}

// plural formats n with word, pluralised.
func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// holderNames lists holders for a message.
func holderNames(hs []Holder) string {
	if len(hs) == 0 {
		return "nobody"
	}
	parts := make([]string, len(hs))
	for i, h := range hs {
		b := ""
		if h.Borrowing {
			b = ", borrowing"
		}
		parts[i] = fmt.Sprintf("%s (team %s, %d%s)", h.Job, h.Team, h.Accelerators, b)
	}
	return strings.Join(parts, ", ")
}

// limitStr formats a borrowing limit.
func limitStr(l int) string {
	if l >= unlimited {
		return "unlimited"
	}
	return fmt.Sprint(l)
}

// reason renders j's outcome into its Reason. The outcome was recorded by the
// phase that decided it (outcome.go); what is rendered here is only what
// needs the end of the cycle: the team's usage that admitted, grown and
// running jobs name, the final size of a shrunk job, and, for a pending job,
// what blocks it now (quota, holders, free capacity; see pendingReason).
func (s *sched) reason(j *jobRT, cache map[*flavorRT]*holders) Reason {
	o := &j.out
	r := Reason{Job: j.name, Team: j.spec.Team, FromSize: j.prevSize, ToSize: j.size, Kind: o.kind, Code: o.code, Message: o.msg}
	if o.code == CodeSpecChanged || o.code == CodeSuspended {
		r.RequestedBy = j.spec.RequestedBy
	}
	if j.tf == nil || o.kind == KindSuspended {
		// Invalid, suspended, no team or flavor: the message is complete.
		return r
	}
	r.For, r.ForTeam = o.forJobs, o.forTeam
	tf := j.tf
	switch o.kind {
	case KindPreempted:
		if j.prevSize > 0 {
			return r
		}
		// Admitted and preempted in this cycle: it waits like any pending job.
		r.Kind = KindPending
		s.pendingReason(j, &r, cache)
	case KindPending:
		s.pendingReason(j, &r, cache)
	case KindMoved:
	case KindAdmitted:
		min := j.sp.min
		switch o.code {
		case CodeBorrowing:
			r.Message = fmt.Sprintf("admitted at %s by borrowing idle quota (%s, borrowing limit %s)", plural(min, "node"), s.usage(j), limitStr(tf.borrowLimit))
		case CodeReclaim:
			if tf.used > tf.nominal {
				r.Message = fmt.Sprintf("admitted at %s by reclaiming lent capacity,%s", plural(min, "node"), quotaStanding(tf.used, tf.nominal, s.usage(j)))
			} else {
				r.Message = fmt.Sprintf("admitted at %s within the team's nominal quota by reclaiming lent capacity (%s)", plural(min, "node"), s.usage(j))
			}
		case CodePriorityPreemption:
			r.Message = fmt.Sprintf("admitted at %s by preempting lower-priority jobs of team %s (priority %d; %s)", plural(min, "node"), tf.team.name, j.sp.prio, s.usage(j))
		default:
			r.Message = fmt.Sprintf("admitted at %s%s", plural(min, "node"), quotaStanding(tf.used, tf.nominal, s.usage(j)))
		}
		if j.size > min {
			r.Message += fmt.Sprintf("; grown to %d by fair share", j.size)
		}
	case KindGrown:
		if o.borrowed {
			r.Message = fmt.Sprintf("grown from %d to %d nodes into idle capacity by fair share by borrowing idle quota (%s)", j.prevSize, j.size, s.usage(j))
			break
		}
		r.Message = fmt.Sprintf("grown from %d to %d nodes into idle capacity by fair share%s", j.prevSize, j.size, quotaStanding(tf.used, tf.nominal, s.usage(j)))
	case KindRepaired, KindShrunk:
		if o.kind == KindRepaired && j.size == j.prevSize {
			r.Message = fmt.Sprintf("lost node(s) replaced; still %s", plural(j.size, "node"))
			break
		}
		// A repair that left the job below its previous size is a shrink.
		r.Kind = KindShrunk
		switch o.code {
		case CodeReclaim:
			r.Message = fmt.Sprintf("shrunk from %d to %d nodes: team %s reclaimed its nominal quota for %s while team %s was borrowing", j.prevSize, j.size, o.forTeam, strings.Join(o.forJobs, ", "), tf.team.name)
		case CodePriorityPreemption:
			r.Message = fmt.Sprintf("shrunk from %d to %d nodes for higher-priority %s of the same team %s (this job's priority is %d)", j.prevSize, j.size, strings.Join(o.forJobs, ", "), tf.team.name, j.sp.prio)
		case CodeSpecChanged:
			r.Message = fmt.Sprintf("shrunk from %d to %d nodes at the user's request: %s (%s)", j.prevSize, j.size, specChanged(j.spec.RequestedBy), o.detail)
		default:
			r.Message = fmt.Sprintf("shrunk from %d to %d nodes: node(s) lost and no replacement free", j.prevSize, j.size)
		}
	case KindRunning:
		s.runningReason(j, &r)
	}
	return r
}

// quotaStanding words where a team stands against its nominal quota at the
// end of a cycle, for a job admitted or grown in it, with usage (see
// sched.usage): within the nominal quota, or, when the team uses more than
// its nominal quota (other jobs of the team grew by borrowing), borrowing
// idle quota and by how much: never "within" beside a usage above nominal.
func quotaStanding(used, nominal int, usage string) string {
	if used > nominal {
		return " with the team borrowing idle quota (" + usage + ", " + strconv.Itoa(used-nominal) + " above nominal)"
	}
	return " within the team's nominal quota (" + usage + ")"
}

// usage is the team's usage of j's flavor at the end of the cycle. Built
// without fmt: running jobs name it every cycle.
func (s *sched) usage(j *jobRT) string {
	tf := j.tf
	return "team " + tf.team.name + " uses " + strconv.Itoa(tf.used) + " of nominal " + strconv.Itoa(tf.nominal) + " on " + j.flavor
}

// runningReason renders an unchanged job: its size and usage and, for an
// elastic job, why it did not grow (recorded by grow).
func (s *sched) runningReason(j *jobRT, r *Reason) {
	// The same for every running job of the team, flavor and shape:
	// written once per cycle.
	k := runningKey{j.tf, j.size, j.per}
	msg, ok := s.runningTexts[k]
	if !ok {
		nodes := " nodes ("
		if j.size == 1 {
			nodes = " node ("
		}
		msg = "running on " + strconv.Itoa(j.size) + nodes + strconv.Itoa(j.per*j.size) + " accelerators; " + s.usage(j) + ")"
		if s.runningTexts == nil {
			s.runningTexts = map[runningKey]string{}
		}
		s.runningTexts[k] = msg
	}
	r.Message = msg
	if !j.spec.Elastic {
		return
	}
	block := j.out.growBlock
	r.Code = block
	switch {
	case j.size >= j.allowedMax():
		r.Code = CodeAtMax
		r.Message += "; at maxNodes"
	case block == CodeStablePeriod:
		r.Message += fmt.Sprintf("; may grow again after %s (min stable period %s)", j.lastResize.Add(s.stable).UTC().Format("15:04:05"), s.stable)
	case block == CodeBorrowingLimit:
		r.Message += "; cannot grow: team at its borrowing limit"
	case block == CodeCohortExhausted:
		r.Message += "; cannot grow: no idle quota left to borrow in the cohort"
	case block == CodeReserved:
		r.Message += "; cannot grow: idle capacity is reserved for another team's guaranteed demand"
	case block == CodeQuotaExceeded:
		r.Message += "; cannot grow: vCPU/memory quota"
	case block != "":
		r.Code = CodeNoCapacity
		r.Message += "; cannot grow: no idle nodes"
	}
}

// pendingReason renders why a pending job waits. Unlike the other outcomes
// it is derived from the end state of the cycle, after every phase: the
// cause (quota, StrictFIFO order, reserved or fragmented capacity), the
// usage and the holders it names are what blocks the job now, and what the
// next cycle starts from; a phase after the one that left the job waiting
// may have taken or freed the capacity in between.
func (s *sched) pendingReason(j *jobRT, r *Reason, cache map[*flavorRT]*holders) {
	tf, f := j.tf, j.fl
	need := j.per * j.sp.min
	vcpu, mem := j.vcpu*j.sp.min, j.mem*int64(j.sp.min)
	usage := s.usageText(tf, j.flavor)
	shape := func() string {
		if j.exclusive {
			return fmt.Sprintf("%s with %d accelerators", plural(j.sp.min, "whole node"), j.per)
		}
		return fmt.Sprintf("%d accelerators on one node", j.per)
	}
	if s.strict {
		for k := tf.head; k < len(tf.queue); k++ {
			h := tf.queue[k]
			if h == j {
				break
			}
			if h.size == 0 && !h.preempted() {
				r.Code = CodeStrictFIFO
				r.Message = fmt.Sprintf("waiting behind %s of team %s (StrictFIFO queueing)", h.name, tf.team.name)
				return
			}
		}
	}
	switch {
	case tf.vcpuCap > 0 && tf.vcpuUsed+vcpu > tf.vcpuCap:
		r.Code = CodeQuotaExceeded
		r.Message = fmt.Sprintf("team %s's vCPU quota on %s is full: uses %d of %d, the job needs %d", tf.team.name, j.flavor, tf.vcpuUsed, tf.vcpuCap, vcpu)
		r.Holders = s.holdersOf(f, cache).team[tf]
		return
	case tf.memCap > 0 && tf.memUsed+mem > tf.memCap:
		r.Code = CodeQuotaExceeded
		r.Message = fmt.Sprintf("team %s's memory quota on %s is full: uses %s of %s, the job needs %s", tf.team.name, j.flavor, ByteSize(tf.memUsed), ByteSize(tf.memCap), ByteSize(mem))
		r.Holders = s.holdersOf(f, cache).team[tf]
		return
	case tf.borrowLimit < unlimited && need > tf.nominal+tf.borrowLimit:
		r.Code = CodeQuotaExceeded
		r.Message = fmt.Sprintf("needs %d accelerators at minNodes but team %s may hold at most %d (nominal) + %d (borrowing limit) on %s; lower minNodes or raise the quota", need, tf.team.name, tf.nominal, tf.borrowLimit, j.flavor)
		return
	case tf.borrowLimit < unlimited && tf.used+need > tf.nominal+tf.borrowLimit:
		r.Code = CodeBorrowingLimit
		r.Message = fmt.Sprintf("team %s is at its borrowing limit: uses %d of nominal %d + borrowing limit %d on %s, the job needs %d more; waiting for the team's own jobs", tf.team.name, tf.used, tf.nominal, tf.borrowLimit, j.flavor, need)
		r.Holders = s.holdersOf(f, cache).team[tf]
		return
	case j.stuck:
		r.Code = CodeNoCapacity
		r.Holders = s.holdersOf(f, cache).all
		r.Message = fmt.Sprintf("within the team's nominal quota (%s, needs %d) but no capacity could be freed: needs %s, %s free; capacity reserved for it; held by %s", usage, need, shape(), plural(f.freeAccel, "accelerator"), s.holderNames(r.Holders))
		return
	}
	switch c := s.quotaCheck(tf, need, vcpu, mem, false); c {
	case CodeCohortExhausted:
		r.Code = c
		co := tf.co
		hs := s.holdersOf(f, cache).cohort[co]
		r.Holders = hs
		cname := co.name
		if cname == "" {
			cname = "(default)"
		}
		// The same for every pending job of the team needing as much (a
		// long message when the borrowers are many): written once.
		k := exhaustedKey{tf, j.flavor, need, usage}
		if m, ok := s.exhaustedTexts[k]; ok {
			r.Message = m
			return
		}
		r.Message = fmt.Sprintf("no idle quota to borrow: cohort %s lends %d accelerators on %s and all are in use or reserved (%s, needs %d); borrowers: %s", cname, co.pool, j.flavor, usage, need, s.holderNames(hs))
		if s.exhaustedTexts == nil {
			s.exhaustedTexts = map[exhaustedKey]string{}
		}
		s.exhaustedTexts[k] = r.Message
		return
	case CodeReserved:
		r.Code = c
		r.Holders = s.holdersOf(f, cache).all
		r.Message = fmt.Sprintf("idle capacity on %s (%d accelerators) is reserved for teams waiting for their nominal quota (%d reserved); %s, needs %d by borrowing", j.flavor, f.freeAccel, f.reservedPhys, usage, need)
		return
	case "":
	default:
		r.Code = c
		r.Message = fmt.Sprintf("quota: %s (%s, needs %d)", c, usage, need)
		return
	}
	r.Code = CodeNoCapacity
	r.Holders = s.holdersOf(f, cache).all
	if s.canPlace(j, j.sp.min) {
		r.Message = fmt.Sprintf("capacity was freed in this cycle; expected to be admitted next cycle (%s)", usage)
		return
	}
	if len(f.shapes) == 0 {
		r.Message = fmt.Sprintf("no nodes of flavor %s in the fleet", j.flavor)
		return
	}
	r.Message = fmt.Sprintf("quota allows it (%s, needs %d) but no nodes are free: needs %s, %s and %s free; held by %s",
		usage, need, shape(), plural(f.wholeFree, "whole node"), plural(f.freeAccel, "accelerator"), s.holderNames(r.Holders))
}

// usageText is "team T uses U of nominal N on F", written once per team
// and flavor for all its pending jobs (it is in most of their messages).
func (s *sched) usageText(tf *teamFlavor, flavor string) string {
	m, ok := s.usageTexts[tf]
	if ok && m.used == tf.used && m.nominal == tf.nominal && m.flavor == flavor {
		return m.text
	}
	m = usageText{used: tf.used, nominal: tf.nominal, flavor: flavor,
		text: fmt.Sprintf("team %s uses %d of nominal %d on %s", tf.team.name, tf.used, tf.nominal, flavor)}
	if s.usageTexts == nil {
		s.usageTexts = map[*teamFlavor]usageText{}
	}
	s.usageTexts[tf] = m
	return m.text
}

// runningKey names a running job's message: its team's usage of the
// flavor (final when reasons are rendered), its size and accelerators.
type runningKey struct {
	tf        *teamFlavor
	size, per int
}

type usageText struct {
	used, nominal int
	flavor, text  string
}

// holderNames is holderNames(hs) for a list of holdersOf's cache, written
// once per list for all the pending jobs whose message names it (the lists
// are not changed once built, and live as long as the cache).
func (s *sched) holderNames(hs []Holder) string {
	if len(hs) == 0 {
		return holderNames(hs)
	}
	k := holderList{&hs[0], len(hs)}
	if t, ok := s.holderTexts[k]; ok {
		return t
	}
	t := holderNames(hs)
	if s.holderTexts == nil {
		s.holderTexts = map[holderList]string{}
	}
	s.holderTexts[k] = t
	return t
}

type holderList struct {
	first *Holder
	n     int
}

// exhaustedKey names a CohortExhausted message: the rest of what it says
// (the cohort's pool and borrowers) is the same for the whole decision.
type exhaustedKey struct {
	tf     *teamFlavor
	flavor string
	need   int
	usage  string
}

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

func (s *sched) holdersOf(f *flavorRT, cache map[*flavorRT]*holders) *holders {
	if h := cache[f]; h != nil {
		return h
	}
	k := s.cfg.maxHolders()
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

func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

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

func limitStr(l int) string {
	if l >= unlimited {
		return "unlimited"
	}
	return fmt.Sprint(l)
}

func (s *sched) reason(j *jobRT, cache map[*flavorRT]*holders) Reason {
	r := Reason{Job: j.name, Team: j.spec.Team, FromSize: j.prevSize, ToSize: j.size}
	rel := ""
	if j.prevSize > 0 && j.size == 0 {
		rel = fmt.Sprintf("; released %s", plural(j.prevSize, "node"))
	}
	switch {
	case !j.valid:
		r.Kind, r.Code, r.Message = KindInvalid, CodeInvalidSpec, "invalid spec: "+j.invalid+rel
		return r
	case j.spec.Suspended:
		r.Kind, r.Code, r.Message = KindSuspended, CodeSuspended, "suspended"+rel
		return r
	case j.tf == nil:
		r.Kind, r.Code, r.Message = KindPending, j.preCode, j.preMsg+rel
		if j.prevSize > 0 {
			r.Kind = KindPreempted
		}
		return r
	}
	tf := j.tf
	acc := j.per * j.size
	// Built without fmt: this runs for every job every cycle.
	usage := "team " + tf.team.name + " uses " + strconv.Itoa(tf.used) + " of nominal " + strconv.Itoa(tf.nominal) + " on " + j.flavor
	r.For, r.ForTeam = j.forJobs, j.forTeam
	r.Code = j.code
	switch {
	case j.size == 0 && j.prevSize > 0:
		r.Kind = KindPreempted
		switch j.code {
		case CodeReclaim:
			r.Message = fmt.Sprintf("preempted: team %s reclaimed its nominal quota for %s while team %s was borrowing; requeued", j.forTeam, strings.Join(j.forJobs, ", "), tf.team.name)
		case CodePriorityPreemption:
			r.Message = fmt.Sprintf("preempted by higher-priority %s of the same team %s (this job's priority is %d); requeued", strings.Join(j.forJobs, ", "), tf.team.name, j.sp.prio)
		case CodeSpecChanged:
			r.Message = fmt.Sprintf("spec changed (%s); requeued", j.detail)
		default:
			r.Code = CodeNodeLost
			r.Message = "node(s) of the allocation lost and no replacement free; requeued"
		}
		r.Message += rel
	case j.size == 0:
		r.Kind = KindPending
		s.pendingReason(j, &r, cache)
	case j.prevSize == 0 || j.admittedNow:
		r.Kind = KindAdmitted
		min := j.sp.min
		switch j.code {
		case CodeBorrowing:
			r.Message = fmt.Sprintf("admitted at %s by borrowing idle quota (%s, borrowing limit %s)", plural(min, "node"), usage, limitStr(tf.borrowLimit))
		case CodeReclaim:
			r.Message = fmt.Sprintf("admitted at %s within the team's nominal quota by reclaiming lent capacity (%s)", plural(min, "node"), usage)
		case CodePriorityPreemption:
			r.Message = fmt.Sprintf("admitted at %s by preempting lower-priority jobs of team %s (priority %d; %s)", plural(min, "node"), tf.team.name, j.sp.prio, usage)
		default:
			r.Code = CodeWithinQuota
			r.Message = fmt.Sprintf("admitted at %s within the team's nominal quota (%s)", plural(min, "node"), usage)
		}
		if j.size > min {
			r.Message += fmt.Sprintf("; grown to %d by fair share", j.size)
		}
	case j.size > j.prevSize:
		r.Kind = KindGrown
		if j.repairedNow || j.code == CodeNodeLost {
			r.Code = CodeNodeLost
		} else {
			r.Code = CodeFairShare
		}
		how := "within the team's nominal quota"
		if j.grewBorrow {
			how = "by borrowing idle quota"
		}
		r.Message = fmt.Sprintf("grown from %d to %d nodes into idle capacity by fair share %s (%s)", j.prevSize, j.size, how, usage)
	case j.size < j.prevSize:
		r.Kind = KindShrunk
		switch j.code {
		case CodeReclaim:
			r.Message = fmt.Sprintf("shrunk from %d to %d nodes: team %s reclaimed its nominal quota for %s while team %s was borrowing", j.prevSize, j.size, j.forTeam, strings.Join(j.forJobs, ", "), tf.team.name)
		case CodePriorityPreemption:
			r.Message = fmt.Sprintf("shrunk from %d to %d nodes for higher-priority %s of the same team %s (this job's priority is %d)", j.prevSize, j.size, strings.Join(j.forJobs, ", "), tf.team.name, j.sp.prio)
		case CodeSpecChanged:
			r.Message = fmt.Sprintf("shrunk from %d to %d nodes: spec changed (%s)", j.prevSize, j.size, j.detail)
		default:
			r.Code = CodeNodeLost
			r.Message = fmt.Sprintf("shrunk from %d to %d nodes: node(s) lost and no replacement free", j.prevSize, j.size)
		}
	case j.movedNow:
		r.Kind, r.Code = KindMoved, CodeDefragment
		from := "?"
		if len(j.prevNodes) > 0 {
			from = j.prevNodes[0]
		}
		r.Message = fmt.Sprintf("moved from node %s to %s to make room for %s of team %s (guaranteed quota; free capacity was fragmented)", from, j.nodes[0].name, strings.Join(j.forJobs, ", "), j.forTeam)
	case j.repairedNow:
		r.Kind, r.Code = KindRepaired, CodeNodeLost
		r.Message = fmt.Sprintf("lost node(s) replaced; still %s", plural(j.size, "node"))
	default:
		r.Kind = KindRunning
		r.Code = ""
		nodes := " nodes ("
		if j.size == 1 {
			nodes = " node ("
		}
		r.Message = "running on " + strconv.Itoa(j.size) + nodes + strconv.Itoa(acc) + " accelerators; " + usage + ")"
		if j.spec.Elastic {
			r.Code = j.growBlock
			switch {
			case j.size >= j.allowedMax():
				r.Code = CodeAtMax
				r.Message += "; at maxNodes"
			case j.growBlock == CodeStablePeriod:
				r.Message += fmt.Sprintf("; may grow again after %s (min stable period %s)", j.lastResize.Add(s.stable).UTC().Format("15:04:05"), s.stable)
			case j.growBlock == CodeBorrowingLimit:
				r.Message += "; cannot grow: team at its borrowing limit"
			case j.growBlock == CodeCohortExhausted:
				r.Message += "; cannot grow: no idle quota left to borrow in the cohort"
			case j.growBlock == CodeReserved:
				r.Message += "; cannot grow: idle capacity is reserved for another team's guaranteed demand"
			case j.growBlock == CodeQuotaExceeded:
				r.Message += "; cannot grow: vCPU/memory quota"
			case j.growBlock != "":
				r.Code = CodeNoCapacity
				r.Message += "; cannot grow: no idle nodes"
			}
		}
	}
	return r
}

func (s *sched) pendingReason(j *jobRT, r *Reason, cache map[*flavorRT]*holders) {
	tf, f := j.tf, j.fl
	need := j.per * j.sp.min
	vcpu, mem := j.vcpu*j.sp.min, j.mem*int64(j.sp.min)
	usage := fmt.Sprintf("team %s uses %d of nominal %d on %s", tf.team.name, tf.used, tf.nominal, j.flavor)
	shape := fmt.Sprintf("%d accelerators on one node", j.per)
	if j.exclusive {
		shape = fmt.Sprintf("%s with %d accelerators", plural(j.sp.min, "whole node"), j.per)
	}
	if s.strict {
		for k := tf.head; k < len(tf.queue); k++ {
			h := tf.queue[k]
			if h == j {
				break
			}
			if h.size == 0 && !h.preemptedNow {
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
		r.Message = fmt.Sprintf("within the team's nominal quota (%s, needs %d) but no capacity could be freed: needs %s, %s free; capacity reserved for it; held by %s", usage, need, shape, plural(f.freeAccel, "accelerator"), holderNames(r.Holders))
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
		r.Message = fmt.Sprintf("no idle quota to borrow: cohort %s lends %d accelerators on %s and all are in use or reserved (%s, needs %d); borrowers: %s", cname, co.pool, j.flavor, usage, need, holderNames(hs))
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
		usage, need, shape, plural(f.wholeFree, "whole node"), plural(f.freeAccel, "accelerator"), holderNames(r.Holders))
}

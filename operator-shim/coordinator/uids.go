package coordinator

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// DefaultJobUIDRange is hyperpod-coordinator's --job-uid-range: above the
// uids Linux distributions give users and services, and below the ranges
// systemd (DynamicUser 61184-65519, nspawn 524288+) and Kubernetes user
// namespaces (65536 per pod from 65536 up) hand out.
const DefaultJobUIDRange = "200000-299999"

// ParseUIDRange parses FIRST-LAST (both inclusive, 1 <= FIRST <= LAST <
// 2^32-1); "" or "none" is no range (0, 0).
func ParseUIDRange(s string) (first, last uint32, err error) {
	if s == "" || s == "none" {
		return 0, 0, nil
	}
	a, b, ok := strings.Cut(s, "-")
	f, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 32)
	l, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 32)
	if !ok || err1 != nil || err2 != nil || f == 0 || l < f || l == 1<<32-1 {
		return 0, 0, fmt.Errorf("uid range %q: want FIRST-LAST with 1 <= FIRST <= LAST < 4294967295, e.g. %s", clipMsg(s), DefaultJobUIDRange)
	}
	return uint32(f), uint32(l), nil
}

// codeNoUID is a pending job's cause when every uid of the range is held.
const codeNoUID api.ReasonCode = "NoJobUID"

// assignUIDs decides the uid of each job of placed (in name order) from
// [first, last], given held: the uid of every live job (its desired
// record's, 0 for none). A job keeps its uid while it is in the range and
// no job of a smaller name holds the same one; a job without one gets the
// lowest uid no live job holds. Jobs for which none is free are returned
// in none (they wait); a uid comes free when its job is forgotten (its
// desired record is gone, so it is no longer in held).
func assignUIDs(first, last uint32, held map[string]uint32, placed []string) (uids map[string]uint32, none []string) {
	uids = make(map[string]uint32, len(placed))
	if first == 0 {
		return uids, nil
	}
	// owner of each uid in use: the smallest job name holding it.
	owner := make(map[uint32]string, len(held))
	for job, u := range held {
		if u == 0 {
			continue
		}
		if o, ok := owner[u]; !ok || job < o {
			owner[u] = job
		}
	}
	next := first
	for _, job := range placed {
		if u := held[job]; u >= first && u <= last && owner[u] == job {
			uids[job] = u
			continue
		}
		for next <= last {
			if _, used := owner[next]; !used {
				break
			}
			next++
		}
		if next > last {
			none = append(none, job)
			continue
		}
		uids[job] = next
		owner[next] = job
		next++
	}
	return uids, none
}

// withoutUIDs takes the jobs of none out of d's allocations (they keep
// waiting, their status says why); d's lists are copied, never changed in
// place (the engine's).
func withoutUIDs(d *policy.Decision, none []string, first, last uint32) {
	if len(none) == 0 {
		return
	}
	allocs := make([]api.Allocation, 0, len(d.Allocations))
	for _, a := range d.Allocations {
		if !slices.Contains(none, a.Job) {
			allocs = append(allocs, a)
		}
	}
	d.Allocations = allocs
	reasons := slices.Clone(d.Reasons)
	for i := range reasons {
		if slices.Contains(none, reasons[i].Job) {
			r := &reasons[i]
			r.Kind, r.Code, r.ToSize, r.For, r.ForTeam = policy.KindPending, codeNoUID, 0, nil, ""
			r.Message = fmt.Sprintf("waiting for a uid: every uid of the coordinator's --job-uid-range %d-%d is held by a live job; one comes free when a job is deleted and its nodes have left", first, last)
		}
	}
	d.Reasons = reasons
}

// clipMsg clips a string read from a user before it is logged or
// returned.
func clipMsg(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// freeUIDs gives each job of need, in order, the lowest uid of [first,
// last] that no live job holds (inUse: the desired records holding each
// uid) and no job before it got; none are the jobs for which none is free
// (they wait). It is assignUIDs for jobs without a uid in the range, on
// the view's count of the uids in use instead of every desired record.
func freeUIDs(first, last uint32, inUse map[uint32]int, need []string) (uids map[string]uint32, none []string) {
	uids = make(map[string]uint32, len(need))
	next := first
	for _, job := range need {
		for next <= last && inUse[next] > 0 {
			next++
		}
		if next > last {
			none = append(none, job)
			continue
		}
		uids[job] = next
		next++
	}
	return uids, none
}

// decideUIDs gives every job d places a uid (JobUIDFirst..JobUIDLast):
// the one its desired record holds, else a free one; a job for which no
// uid is free is taken out of d and waits. The uids are derived from the
// desired records alone, so they survive restarts and leader changes. It
// returns only the uids given now: a job that holds one keeps it
// (uidOf).
func (c *Coordinator) decideUIDs(d *policy.Decision) map[string]uint32 {
	first, last := c.cfg.JobUIDFirst, c.cfg.JobUIDLast
	if first == 0 {
		return nil
	}
	v := c.view
	var need []string
	for i := range d.Allocations {
		job := d.Allocations[i].Job
		if u := v.desired[job].UID; u < first || u > last {
			need = append(need, job)
		}
	}
	if len(need) == 0 {
		return nil
	}
	got, none := freeUIDs(first, last, v.uidUse, need)
	if len(none) > 0 {
		c.log.Warn("no free uid for admitted jobs; they wait", "jobs", len(none), "range", fmt.Sprintf("%d-%d", first, last))
		withoutUIDs(d, none, first, last)
	}
	return got
}

// uidOf is the uid of placed job a this cycle: the one decideUIDs gave
// it, else the one its desired record holds in the range (0: none).
func (c *Coordinator) uidOf(job string, prev uint32) uint32 {
	first, last := c.cfg.JobUIDFirst, c.cfg.JobUIDLast
	if first == 0 {
		return 0
	}
	if u, ok := c.uids[job]; ok {
		return u
	}
	if prev >= first && prev <= last {
		return prev
	}
	return 0
}

package coordinator

import (
	"encoding/json"
	"log/slog"
	"slices"
	"sort"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// eventIndex is the coordinator's copy of the decision history (it is the
// history's only writer): it deduplicates events and bounds the history
// without reading etcd.
type eventIndex struct {
	keys  fleet.Keys
	byJob map[string][]evRec // each job's events, oldest first
	total int
	// grown are the jobs that gained an event since the last prune (nil:
	// every job, after a load): prune checks only them against perJob.
	grown map[string]bool
}

type evRec struct {
	key string
	e   fleet.Event
	bad bool // malformed in etcd: never updated, pruned first
}

func loadEvents(keys fleet.Keys, kvs []*mvccpb.KeyValue, log *slog.Logger) *eventIndex {
	x := &eventIndex{keys: keys, byJob: map[string][]evRec{}}
	bad := 0
	for _, kv := range kvs { // etcd returns them in key (time) order
		key := string(kv.Key)
		ek, _ := keys.ParseEventKey(key) // Job "" for a key that names no job
		job := ek.Job
		e, err := fleet.DecodeEvent(key, kv.Value)
		r := evRec{key: key}
		if err != nil {
			r.bad = true
			bad++
		} else {
			r.e = *e
		}
		x.byJob[job] = append(x.byJob[job], r)
		x.total++
	}
	if bad > 0 {
		log.Warn("malformed events in the history: they are pruned first", "count", bad)
	}
	return x
}

// same reports whether two decisions about one job are the same event.
func same(a, b api.Reason) bool {
	return a.Kind == b.Kind && a.Code == b.Code && a.FromSize == b.FromSize && a.ToSize == b.ToSize &&
		a.ForTeam == b.ForTeam && slices.Equal(a.For, b.For)
}

// evPut is a planned write of the history: a new event of job, or
// (update) a new value of its latest event.
type evPut struct {
	job    string
	rec    evRec
	update bool
}

// evDel is a planned deletion of one of job's events.
type evDel struct {
	job, key string
}

// plan is the write that adds a decision to the history, without changing
// x: an update of the job's latest event when it is the same decision
// again within window (its count and last-seen time), else a new event.
func (x *eventIndex) plan(r api.Reason, now time.Time, window time.Duration) evPut {
	evs := x.byJob[r.Job]
	if n := len(evs); n > 0 {
		last := evs[n-1]
		seen := last.e.LastSeen
		if seen.IsZero() {
			seen = last.e.Time
		}
		if !last.bad && same(last.e.Reason, r) && now.Sub(seen) <= window {
			first := last.e.FirstSeen
			if first.IsZero() {
				first = last.e.Time
			}
			e := last.e
			e.Reason = r // the latest explanation
			e.Count = last.e.Times() + 1
			e.FirstSeen, e.LastSeen = first, now
			return evPut{job: r.Job, rec: evRec{key: last.key, e: e}, update: true}
		}
	}
	e := fleet.Event{Time: now, Reason: r, Count: 1, FirstSeen: now, LastSeen: now}
	return evPut{job: r.Job, rec: evRec{key: x.keys.Event(now, r.Job), e: e}}
}

// put records a planned write in x.
func (x *eventIndex) put(p evPut) {
	evs := x.byJob[p.job]
	if n := len(evs); p.update && n > 0 && evs[n-1].key == p.rec.key {
		evs[n-1] = p.rec
		return
	}
	x.byJob[p.job] = append(evs, p.rec)
	x.total++
	if x.grown != nil {
		x.grown[p.job] = true
	}
}

// record adds a decision to the history (plan, then put). It returns the
// key and value to put.
func (x *eventIndex) record(r api.Reason, now time.Time, window time.Duration) (string, fleet.Event) {
	p := x.plan(r, now, window)
	x.put(p)
	return p.rec.key, p.rec.e
}

// drop forgets a job's events and returns their keys.
func (x *eventIndex) drop(job string) []string {
	var keys []string
	for _, r := range x.byJob[job] {
		keys = append(keys, r.key)
	}
	x.total -= len(x.byJob[job])
	delete(x.byJob, job)
	return keys
}

// prune bounds the history: at most perJob events of a job and total in
// all, the oldest going first (malformed ones before any). It returns the
// keys to delete. The total bound is enforced with 10% slack, so that a
// full history is not pruned one event per cycle.
func (x *eventIndex) prune(perJob, total int) []string {
	del := x.pruneKeys(perJob, total, nil)
	x.remove(del)
	keys := make([]string, len(del))
	for i, d := range del {
		keys[i] = d.key
	}
	return keys
}

// pruneKeys is what prune would delete once puts are recorded, without
// changing x.
func (x *eventIndex) pruneKeys(perJob, total int, puts []evPut) []evDel {
	added := map[string][]evRec{}
	n := x.total
	for _, p := range puts {
		if !p.update {
			added[p.job] = append(added[p.job], p.rec)
			n++
		}
	}
	// evs is a job's history once puts are recorded.
	evs := func(job string) []evRec {
		if a := added[job]; len(a) > 0 {
			return append(slices.Clip(x.byJob[job]), a...)
		}
		return x.byJob[job]
	}
	var del []evDel
	cut := map[string]int{} // how many of a job's oldest go
	check := func(job string) {
		if _, done := cut[job]; done {
			return
		}
		h := evs(job)
		cut[job] = 0
		if len(h) <= perJob {
			return
		}
		k := len(h) - perJob
		for _, r := range h[:k] {
			del = append(del, evDel{job, r.key})
		}
		cut[job] = k
		n -= k
	}
	if x.grown == nil {
		for job := range x.byJob {
			check(job)
		}
	} else {
		for job := range x.grown {
			check(job)
		}
	}
	for job := range added {
		check(job)
	}
	if n <= total+total/10 {
		return del
	}
	type ref struct {
		evDel
		bad bool
	}
	all := make([]ref, 0, n)
	collect := func(job string) {
		for _, r := range evs(job)[cut[job]:] {
			all = append(all, ref{evDel{job, r.key}, r.bad})
		}
	}
	for job := range x.byJob {
		collect(job)
	}
	for job := range added {
		if _, ok := x.byJob[job]; !ok {
			collect(job)
		}
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].bad != all[j].bad {
			return all[i].bad
		}
		return all[i].key < all[j].key
	})
	for _, r := range all[:len(all)-total] {
		del = append(del, r.evDel)
	}
	return del
}

// pruneOps are the etcd deletes of del (pruneKeys' answer for puts), in
// units of at most maxTxnOps ops. The history's keys sort by time and the
// total bound cuts the oldest, so every deleted key older than the oldest
// kept one goes in one range delete (one write, not one per event: issue
// 27); the others (a job's bound, a malformed key) one delete each. The
// range also takes an event the index no longer holds (one left behind
// by a forgotten job's cleanup), which is older than every kept one.
func (x *eventIndex) pruneOps(del []evDel, puts []evPut) [][]clientv3.Op {
	if len(del) == 0 {
		return nil
	}
	gone := make(map[string]bool, len(del))
	for _, d := range del {
		gone[d.key] = true
	}
	oldest := "" // the oldest key kept, "" when none is
	keep := func(key string) {
		if !gone[key] && (oldest == "" || key < oldest) {
			oldest = key
		}
	}
	for _, evs := range x.byJob {
		for _, r := range evs {
			keep(r.key)
		}
	}
	for _, p := range puts {
		keep(p.rec.key)
	}
	var below, single []string
	for _, d := range del {
		if oldest == "" || d.key < oldest {
			below = append(below, d.key)
		} else {
			single = append(single, d.key)
		}
	}
	var ops []clientv3.Op
	if len(below) > 1 {
		end := oldest
		if end == "" {
			end = clientv3.GetPrefixRangeEnd(x.keys.EventsPrefix())
		}
		ops = append(ops, clientv3.OpDelete(x.keys.EventsPrefix(), clientv3.WithRange(end)))
	} else {
		single = append(single, below...)
	}
	sort.Strings(single)
	for _, key := range single {
		ops = append(ops, clientv3.OpDelete(key))
	}
	var units [][]clientv3.Op
	for len(ops) > 0 {
		n := min(len(ops), maxTxnOps)
		units = append(units, ops[:n:n])
		ops = ops[n:]
	}
	return units
}

// remove forgets deleted events; every job is then checked against the
// per-job bound only when it grows again.
func (x *eventIndex) remove(del []evDel) {
	if x.grown == nil {
		x.grown = map[string]bool{}
	} else {
		clear(x.grown)
	}
	if len(del) == 0 {
		return
	}
	gone := map[string]map[string]bool{}
	for _, d := range del {
		if gone[d.job] == nil {
			gone[d.job] = map[string]bool{}
		}
		gone[d.job][d.key] = true
	}
	for job, keys := range gone {
		evs := x.byJob[job]
		kept := evs[:0:0]
		for _, r := range evs {
			if !keys[r.key] {
				kept = append(kept, r)
			}
		}
		x.total -= len(evs) - len(kept)
		if len(kept) == 0 {
			delete(x.byJob, job)
		} else {
			x.byJob[job] = kept
		}
	}
}

func decodeUsage(b []byte) ([]api.TeamUsage, error) {
	var u []api.TeamUsage
	err := json.Unmarshal(b, &u)
	return u, err
}

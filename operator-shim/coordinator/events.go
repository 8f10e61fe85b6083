package coordinator

import (
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

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

// record adds a decision to the history: an update of the job's latest
// event when it is the same decision again within window (its count and
// last-seen time), else a new event. It returns the key and value to put.
func (x *eventIndex) record(r api.Reason, now time.Time, window time.Duration) (string, fleet.Event) {
	evs := x.byJob[r.Job]
	if n := len(evs); n > 0 {
		last := &evs[n-1]
		seen := last.e.LastSeen
		if seen.IsZero() {
			seen = last.e.Time
		}
		if !last.bad && same(last.e.Reason, r) && now.Sub(seen) <= window {
			first := last.e.FirstSeen
			if first.IsZero() {
				first = last.e.Time
			}
			last.e.Reason = r // the latest explanation
			last.e.Count = last.e.Times() + 1
			last.e.FirstSeen, last.e.LastSeen = first, now
			return last.key, last.e
		}
	}
	e := fleet.Event{Time: now, Reason: r, Count: 1, FirstSeen: now, LastSeen: now}
	key := x.keys.Event(now, r.Job)
	x.byJob[r.Job] = append(evs, evRec{key: key, e: e})
	x.total++
	if x.grown != nil {
		x.grown[r.Job] = true
	}
	return key, e
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

// clone is a copy of x (tests: verifyDiff).
func (x *eventIndex) clone() *eventIndex {
	y := &eventIndex{keys: x.keys, byJob: make(map[string][]evRec, len(x.byJob)), total: x.total}
	for job, evs := range x.byJob {
		y.byJob[job] = slices.Clone(evs)
	}
	if x.grown != nil {
		y.grown = maps.Clone(x.grown)
	}
	return y
}

// prune bounds the history: at most perJob events of a job and total in
// all, the oldest going first (malformed ones before any). It returns the
// keys to delete. The total bound is enforced with 10% slack, so that a
// full history is not pruned one event per cycle.
func (x *eventIndex) prune(perJob, total int) []string {
	var del []string
	check := func(job string, evs []evRec) {
		if len(evs) <= perJob {
			return
		}
		n := len(evs) - perJob
		for _, r := range evs[:n] {
			del = append(del, r.key)
		}
		x.byJob[job] = slices.Clone(evs[n:])
		x.total -= n
	}
	if x.grown == nil {
		for job, evs := range x.byJob {
			check(job, evs)
		}
		x.grown = map[string]bool{}
	} else {
		for job := range x.grown {
			check(job, x.byJob[job])
		}
		clear(x.grown)
	}
	if x.total <= total+total/10 {
		return del
	}
	type ref struct {
		key string
		bad bool
	}
	all := make([]ref, 0, x.total)
	for _, evs := range x.byJob {
		for _, r := range evs {
			all = append(all, ref{r.key, r.bad})
		}
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].bad != all[j].bad {
			return all[i].bad
		}
		return all[i].key < all[j].key
	})
	gone := map[string]bool{}
	for _, r := range all[:len(all)-total] {
		gone[r.key] = true
		del = append(del, r.key)
	}
	for job, evs := range x.byJob {
		kept := evs[:0:0]
		for _, r := range evs {
			if !gone[r.key] {
				kept = append(kept, r)
			}
		}
		if len(kept) == 0 {
			delete(x.byJob, job)
		} else {
			x.byJob[job] = kept
		}
	}
	x.total = total
	return del
}

func decodeUsage(b []byte) ([]api.TeamUsage, error) {
	var u []api.TeamUsage
	err := json.Unmarshal(b, &u)
	return u, err
}

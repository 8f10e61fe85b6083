package coordinator

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// view is the coordinator's in-memory copy of etcd, like a Kubernetes
// informer's cache: read whole once (load) and then kept by one watch per
// input prefix from the revision after that read (apply). The inputs are
// what others write (nodes, teams, specs, finish records); what the
// coordinator writes itself (desired, status, assignments, events, usage)
// it records here when its transaction commits, and never watches: its
// own writes never come back as triggers.
type view struct {
	keys fleet.Keys
	log  *slog.Logger
	rev  int64 // the revision the view was loaded at

	// Inputs.
	nodes    map[string]nodeRec   // by node
	teams    map[string]api.Team  // by team
	specs    map[string]specRec   // by spec key
	finished map[string]finishRec // by job

	// alive are the nodes whose alive key exists; nodeLease is each node
	// record's lease; dead are the nodes whose record declares an alive
	// key that is missing (nodeCounts), by their record's lease: the next
	// cycle deletes those records (reapDead).
	alive     map[string]bool
	nodeLease map[string]int64
	dead      map[string]int64
	// names are the spec keys of each job name; owned the spec that owns
	// each name; active the names of the owned jobs that have not
	// finished, in order: kept as specs and finish records change, so a
	// cycle's cost follows the active jobs, not every spec kept for the
	// retention period, and the engine's job list comes in name order,
	// which spares the engine its sort.
	names  map[string][]string
	owned  map[string]specRec
	active []string

	// The coordinator's own records, as they are in etcd.
	desired  map[string]fleet.Desired
	deleted  map[string]bool // stopped jobs no spec owns (recheckDeleted)
	statuses map[string]*fleet.Status
	assigned map[string]map[string]int64 // job -> node -> generation
	usage    []api.TeamUsage
	events   *eventIndex

	// uidUse counts the desired records holding each uid (0 not counted):
	// the uids in use, kept as desired records change (decideUIDs).
	uidUse map[uint32]int

	// changed counts input changes: a cycle runs only when it moved.
	changed uint64
	// The engine's input, rebuilt only where it changed (the engine
	// orders its input itself and does not modify it).
	cNodes  []policy.Node
	cTeams  []policy.Team
	cJobs   []policy.Job
	cAllocs []policy.Allocation
	stale   struct{ nodes, teams, jobs, allocs bool }
	// jobEdits are the job names whose spec or finish record changed since
	// the engine's job list was built: state patches them in (a full
	// rebuild when stale.jobs or when they are many). allocAt is each
	// running job's index in cAllocs, kept as desired records change.
	jobEdits []string
	allocAt  map[string]int

	// What the last cycle decided and wrote (the write diff visits only
	// the jobs whose decision changed since; haveLast false: every job),
	// and the jobs whose records in the view changed outside the write
	// diff since (re-read, forgotten, expired, or a write skipped): the
	// diff checks those in full.
	haveLast    bool
	lastAllocs  []api.Allocation
	lastReasons []policy.Reason
	touched     map[string]bool
	// held are the new jobs whose first status the last cycle held for
	// its follow-up (plan.held).
	held map[string]heldFirst
	// outside counts the jobs touched outside the write diff (touch).
	outside uint64
	// refresh are the jobs whose desired record and status must be read
	// again before the next cycle: a new spec of that name may have
	// deleted what an earlier job of that name left (fleet.SubmitJob).
	refresh map[string]bool

	// reports are the nodes' reports not processed yet, by key
	// (reports/<node>/...): the next cycle copies or ignores them.
	reports map[string]*mvccpb.KeyValue
	// gone are the job names whose last spec was deleted since the
	// coordinator last looked: their etcd users are revoked at once.
	gone []string
	// wantCreds says assignments carry the job's credentials: one
	// loaded without them is written again.
	wantCreds bool

	// submitted are the jobs submitted since the last cycle under names
	// the view knew nothing of; submitChanges counts the input changes
	// (of changed) that were only such submits: when every change since
	// the last cycle was one, the engine may decide them on its fast path
	// (policy.Engine.Admit).
	submitted     []string
	submitChanges uint64
}

// specRec is what the view keeps of a job's spec: the job as the engine
// sees it (the spec's run section is the nodes' business, not the
// coordinator's) and the record's create revision.
type specRec struct {
	job       policy.Job
	createRev int64
}

type finishRec struct {
	f fleet.Finish
	// seen is when the coordinator first saw it (the retention clock when
	// the record has no time).
	seen time.Time
}

func newView(keys fleet.Keys, log *slog.Logger) *view {
	return &view{keys: keys, log: log}
}

// load replaces the view with a snapshot. Malformed records fall back to
// their last good value where etcd still holds one.
func (v *view) load(ctx context.Context, cli *clientv3.Client, snap *fleet.CoordinatorSnapshot, now time.Time) {
	v.rev = snap.Rev
	v.nodes = map[string]nodeRec{}
	v.alive, v.nodeLease, v.dead = map[string]bool{}, map[string]int64{}, map[string]int64{}
	v.teams = map[string]api.Team{}
	v.specs = map[string]specRec{}
	v.finished = map[string]finishRec{}
	v.names = map[string][]string{}
	v.owned = map[string]specRec{}
	v.active = nil
	v.desired = map[string]fleet.Desired{}
	v.uidUse = map[uint32]int{}
	v.deleted = map[string]bool{}
	v.statuses = map[string]*fleet.Status{}
	v.assigned = map[string]map[string]int64{}
	v.refresh = map[string]bool{}
	v.touched = map[string]bool{}
	v.held = nil
	v.reports = map[string]*mvccpb.KeyValue{}
	v.gone = nil
	v.haveLast, v.lastAllocs, v.lastReasons = false, nil, nil
	v.jobEdits, v.allocAt = nil, nil
	v.usage = nil
	v.stale.nodes, v.stale.teams, v.stale.jobs, v.stale.allocs = true, true, true, true
	for _, kv := range snap.Alive {
		if node, ok := v.keys.ParseAliveKey(string(kv.Key)); ok {
			v.alive[node] = true
		}
	}
	for _, kv := range snap.Nodes {
		v.putNode(kv)
	}
	for _, kv := range snap.Teams {
		if t := decodeOrLastGood(ctx, cli, v.log, "team", kv, fleet.DecodeTeam); t != nil {
			v.teams[t.Name] = *t
		}
	}
	for _, kv := range snap.Specs {
		spec := decodeOrLastGood(ctx, cli, v.log, "job", kv, func(k string, b []byte) (*fleet.JobSpec, error) { return fleet.DecodeSpec(v.keys, k, b) })
		if spec != nil {
			v.setSpec(string(kv.Key), specRec{job: spec.Job, createRev: kv.CreateRevision})
		}
	}
	for _, kv := range snap.Finished {
		v.putFinish(kv, now)
	}
	for _, kv := range snap.Desired {
		if d := decodeOrLastGood(ctx, cli, v.log, "desired record", kv, fleet.DecodeDesired); d != nil {
			v.setDesired(*d)
		}
	}
	for _, kv := range snap.Statuses {
		if s := decodeOrLastGood(ctx, cli, v.log, "status", kv, fleet.DecodeStatus); s != nil {
			v.statuses[s.Job] = s
		} else if job, ok := v.keys.ParseStatusKey(string(kv.Key)); ok {
			// Unreadable, with no good version: a record that matches
			// no decision, so that the job's next status write, or the
			// delete of a job running as placed, replaces it.
			v.statuses[job] = unreadableStatus(job)
		}
	}
	for _, kv := range snap.Assigned {
		ak, ok := v.keys.ParseAssignmentKey(string(kv.Key))
		if !ok {
			continue
		}
		node, job := ak.Node, ak.Job
		a, err := fleet.DecodeAssignment(string(kv.Key), kv.Value)
		gen := int64(-1) // rewritten by the next cycle
		// One without the job's credentials or uid (an earlier release's)
		// is rewritten too.
		if err == nil && (a.Creds != nil) == v.wantCreds && a.UID == v.desired[job].UID {
			gen = a.Generation
		}
		v.assign(job, node, gen)
	}
	for _, kv := range snap.Reports {
		v.reports[string(kv.Key)] = kv
	}
	v.events = loadEvents(v.keys, snap.Events, v.log)
	if len(snap.Usage) > 0 {
		if u, err := decodeUsage(snap.Usage[0].Value); err == nil {
			v.usage = u
		}
	}
	v.changed++
}

func (v *view) assign(job, node string, gen int64) {
	m := v.assigned[job]
	if m == nil {
		m = map[string]int64{}
		v.assigned[job] = m
	}
	m[node] = gen
}

// unreadableStatus stands in the view for a status record that cannot be
// decoded: its kind is no kind a decision has.
func unreadableStatus(job string) *fleet.Status {
	return &fleet.Status{Reason: api.Reason{Job: job, Message: "(unreadable)"}}
}

// decodeOrLastGood decodes kv, or falls back on its last good value.
func decodeOrLastGood[T any](ctx context.Context, cli *clientv3.Client, log *slog.Logger, what string, kv *mvccpb.KeyValue, dec func(string, []byte) (*T, error)) *T {
	x, err := dec(string(kv.Key), kv.Value)
	if err == nil {
		return x
	}
	if good, rev := fleet.LastGood(ctx, cli, kv, dec); good != nil {
		log.Warn("malformed "+what+"; using its last good value", "err", err, "revision", rev)
		return good
	}
	log.Warn("ignoring malformed "+what, "err", err)
	return nil
}

func (v *view) putNode(kv *mvccpb.KeyValue) bool {
	node, ok := v.keys.ParseNodeKey(string(kv.Key))
	if !ok {
		v.log.Warn("ignoring a node inventory at a key that names no node", "key", fleet.ClipKey(kv.Key))
		return false
	}
	if kv.Lease == 0 {
		// An inventory counts only while its agent's lease proves the
		// agent alive; one without a lease would never expire.
		v.log.Warn("ignoring a node inventory written without its agent's lease", "key", fleet.ClipKey(kv.Key))
		return v.delNode(node)
	}
	inv, err := api.ParseInventory(string(kv.Key), kv.Value)
	if err != nil {
		v.log.Warn("ignoring malformed node inventory; keeping its last good value", "err", err)
		return false
	}
	if inv.Node != node {
		// A node's etcd role writes its own key only: the key, not the
		// record, says which node speaks.
		v.log.Warn("ignoring a node inventory that names another node than its key", "key", fleet.ClipKey(kv.Key), "names", inv.Node)
		return false
	}
	old, had := v.nodes[inv.Node]
	alive := v.alive[inv.Node]
	rec := nodeRec{node: fleet.EngineNode(*inv), liveness: inv.Liveness}
	v.nodes[inv.Node] = rec
	v.nodeLease[inv.Node] = kv.Lease
	v.checkDead(inv.Node)
	if had && old.node == rec.node && nodeCounts(old.liveness, alive) == nodeCounts(rec.liveness, alive) {
		return false // nothing the engine sees changed (a timestamp, say)
	}
	return true
}

// delNode forgets a node's record; it reports whether the engine saw it.
func (v *view) delNode(node string) bool {
	rec, had := v.nodes[node]
	delete(v.nodes, node)
	delete(v.nodeLease, node)
	delete(v.dead, node)
	return had && nodeCounts(rec.liveness, v.alive[node])
}

// setAlive records whether node's alive key exists; it reports whether
// the engine's view of the node changed.
func (v *view) setAlive(node string, alive bool) bool {
	was := v.alive[node]
	if alive {
		v.alive[node] = true
	} else {
		delete(v.alive, node)
	}
	v.checkDead(node)
	rec, ok := v.nodes[node]
	return ok && nodeCounts(rec.liveness, was) != nodeCounts(rec.liveness, alive)
}

// checkDead keeps dead: the nodes whose record does not count for want
// of its alive key.
func (v *view) checkDead(node string) {
	if rec, ok := v.nodes[node]; ok && !nodeCounts(rec.liveness, v.alive[node]) {
		v.dead[node] = v.nodeLease[node]
	} else {
		delete(v.dead, node)
	}
}

// nodeRec is what the view keeps of a node's inventory: the node as the
// engine sees it, and what proves it alive (api.Inventory.Liveness). Not
// the whole record: at 20,000 nodes the inventories' device lists,
// hostnames and reasons were 46 MB of the coordinator's live heap.
type nodeRec struct {
	node     api.Node
	liveness string
}

// nodeCounts decides whether a node record counts as a node: the
// record's lease alone cannot prove its agent alive (etcd lets any user
// keep any lease alive, and every reader of the record sees its lease
// id), so a record that declares an alive key counts only while that key,
// under a lease only its agent knows, exists. A record without the
// declaration (older agents, hand-written records) counts on its lease.
func nodeCounts(liveness string, alive bool) bool {
	if liveness == api.LivenessAliveKey {
		return alive
	}
	return true
}

func (v *view) putFinish(kv *mvccpb.KeyValue, now time.Time) bool {
	job, ok := v.keys.ParseFinishKey(string(kv.Key))
	if !ok {
		v.log.Warn("ignoring a finish record at a key that names no job", "key", fleet.ClipKey(kv.Key))
		return false
	}
	f, err := fleet.DecodeFinish(string(kv.Key), kv.Value)
	if err != nil {
		v.log.Warn("malformed finish record: the job counts as finished", "err", err)
		f = &fleet.Finish{}
	}
	_, had := v.finished[job]
	v.finished[job] = finishRec{f: *f, seen: now}
	v.reindex(job)
	return !had
}

// setSpec and delSpec change a spec in the view; setFinished... keep the
// name indexes.
func (v *view) setSpec(key string, s specRec) {
	if _, had := v.specs[key]; !had {
		v.names[s.job.Name] = append(v.names[s.job.Name], key)
	}
	v.specs[key] = s
	v.reindex(s.job.Name)
}

func (v *view) delSpec(key string) {
	s, had := v.specs[key]
	if !had {
		return
	}
	delete(v.specs, key)
	name := s.job.Name
	keys := v.names[name]
	for i, k := range keys {
		if k == key {
			keys = append(keys[:i:i], keys[i+1:]...)
			break
		}
	}
	if len(keys) == 0 {
		delete(v.names, name)
	} else {
		v.names[name] = keys
	}
	v.reindex(name)
	if _, owned := v.owned[name]; !owned {
		v.gone = append(v.gone, name)
	}
}

func (v *view) delFinished(job string) bool {
	if _, had := v.finished[job]; !had {
		return false
	}
	delete(v.finished, job)
	v.reindex(job)
	return true
}

// reindex recomputes which spec owns name (the oldest, lowest create
// revision, of the teams' specs of that name) and whether it is active.
func (v *view) reindex(name string) {
	var own specRec
	found := false
	for _, k := range v.names[name] {
		if s := v.specs[k]; !found || s.createRev < own.createRev {
			own, found = s, true
		}
	}
	if found {
		v.owned[name] = own
	} else {
		delete(v.owned, name)
	}
	v.recheckDeleted(name)
	_, done := v.finished[name]
	i, listed := slices.BinarySearch(v.active, name)
	switch {
	case found && !done && !listed:
		v.active = slices.Insert(v.active, i, name)
	case (!found || done) && listed:
		v.active = slices.Delete(v.active, i, i+1)
	}
	v.jobEdits = append(v.jobEdits, name)
}

// apply updates the view with watch events; it reports whether anything
// the engine reads changed.
func (v *view) apply(evs []*clientv3.Event, now time.Time) bool {
	changed := false
	onlySubmits := true // every event is a new job's spec
	k := v.keys
	for _, e := range evs {
		if !v.brandNewSpec(e) {
			onlySubmits = false
		}
		key := string(e.Kv.Key)
		del := e.Type == clientv3.EventTypeDelete
		switch {
		case strings.HasPrefix(key, k.NodesPrefix()):
			node, ok := k.ParseNodeKey(key)
			if !ok {
				continue
			}
			if del {
				had := v.delNode(node)
				changed = changed || had
				v.stale.nodes = v.stale.nodes || had
			} else if v.putNode(e.Kv) {
				changed = true
				v.stale.nodes = true
			}
		case strings.HasPrefix(key, k.AlivePrefix()):
			if node, ok := k.ParseAliveKey(key); ok && v.setAlive(node, !del) {
				changed = true
				v.stale.nodes = true
			}
		case strings.HasPrefix(key, k.TeamsPrefix()):
			name, ok := k.ParseTeamKey(key)
			if !ok {
				continue
			}
			v.stale.teams = true
			if del {
				delete(v.teams, name)
				changed = true
				continue
			}
			t, err := fleet.DecodeTeam(key, e.Kv.Value)
			if err != nil {
				v.log.Warn("ignoring malformed team; keeping its last good value", "err", err)
				continue
			}
			v.teams[t.Name] = *t
			changed = true
		case strings.HasPrefix(key, k.SpecsPrefix()):
			if del {
				v.delSpec(key)
				changed = true
				continue
			}
			spec, err := fleet.DecodeSpec(k, key, e.Kv.Value)
			if err != nil {
				v.log.Warn("ignoring malformed job; keeping its last good value", "err", err)
				continue
			}
			if e.IsCreate() {
				v.refresh[spec.Name] = true
			}
			v.setSpec(key, specRec{job: spec.Job, createRev: e.Kv.CreateRevision})
			changed = true
		case strings.HasPrefix(key, k.FinishedPrefix()):
			job, ok := k.ParseFinishKey(key)
			if !ok {
				continue
			}
			if del {
				changed = v.delFinished(job) || changed
			} else if v.putFinish(e.Kv, now) {
				changed = true
			}
		case strings.HasPrefix(key, k.ReportsPrefix()):
			// A node's report: the next cycle processes it.
			if del {
				delete(v.reports, key)
			} else {
				v.reports[key] = e.Kv
				changed = true
			}
		}
	}
	if changed {
		v.changed++
		if onlySubmits {
			v.submitChanges++
		}
	}
	return changed
}

// brandNewSpec reports whether e creates the spec of a job under a name
// the view knows nothing of (no spec, desired record, status or finish
// record), and records the name in submitted.
func (v *view) brandNewSpec(e *clientv3.Event) bool {
	key := string(e.Kv.Key)
	if e.Type != clientv3.EventTypePut || !e.IsCreate() || !strings.HasPrefix(key, v.keys.SpecsPrefix()) {
		return false
	}
	spec, err := fleet.DecodeSpec(v.keys, key, e.Kv.Value)
	if err != nil {
		return false
	}
	name := spec.Name
	_, spec1 := v.names[name]
	_, des := v.desired[name]
	_, st := v.statuses[name]
	_, fin := v.finished[name]
	if spec1 || des || st || fin || slices.Contains(v.submitted, name) {
		return false
	}
	v.submitted = append(v.submitted, name)
	return true
}

// state is the engine's input; each part is rebuilt only when it changed,
// in name order (the engine then need not sort it).
func (v *view) state(now time.Time, cfg policy.Config) (policy.State, map[string]specRec) {
	if v.stale.nodes {
		v.cNodes = v.cNodes[:0]
		for name, rec := range v.nodes {
			if nodeCounts(rec.liveness, v.alive[name]) {
				v.cNodes = append(v.cNodes, rec.node)
			}
		}
		slices.SortFunc(v.cNodes, func(a, b policy.Node) int { return strings.Compare(a.Name, b.Name) })
		v.stale.nodes = false
	}
	if v.stale.teams {
		v.cTeams = v.cTeams[:0]
		for _, t := range v.teams {
			v.cTeams = append(v.cTeams, t)
		}
		slices.SortFunc(v.cTeams, func(a, b policy.Team) int { return strings.Compare(a.Name, b.Name) })
		v.stale.teams = false
	}
	if v.stale.jobs || len(v.jobEdits) > 64 {
		// Finished jobs are not active: their capacity is released.
		v.cJobs = v.cJobs[:0]
		for _, name := range v.active {
			v.cJobs = append(v.cJobs, v.owned[name].job)
		}
		v.stale.jobs = false
	} else {
		for _, name := range v.jobEdits {
			v.patchJob(name)
		}
	}
	v.jobEdits = v.jobEdits[:0]
	if v.stale.allocs || v.allocAt == nil {
		v.cAllocs = v.cAllocs[:0]
		v.allocAt = make(map[string]int, len(v.desired))
		for _, d := range v.desired {
			if d.Running() {
				v.allocAt[d.Job] = len(v.cAllocs)
				v.cAllocs = append(v.cAllocs, d.Allocation)
			}
		}
		v.stale.allocs = false
	}
	return policy.State{Now: now, Config: cfg, Nodes: v.cNodes, Teams: v.cTeams, Jobs: v.cJobs, Allocations: v.cAllocs}, v.owned
}

// patchJob brings name's entry of the engine's job list (in name order,
// like active) up to date: replaced, inserted or removed.
func (v *view) patchJob(name string) {
	i, listed := slices.BinarySearchFunc(v.cJobs, name, func(j policy.Job, name string) int { return strings.Compare(j.Name, name) })
	own, found := v.owned[name]
	_, done := v.finished[name]
	switch active := found && !done; {
	case active && listed:
		v.cJobs[i] = own.job
	case active:
		v.cJobs = slices.Insert(v.cJobs, i, own.job)
	case listed:
		v.cJobs = slices.Delete(v.cJobs, i, i+1)
	}
}

// setDesired and dropDesired change a desired record in the view, and
// the engine's allocation list with it (its order is of no consequence:
// the engine orders the allocations itself).
func (v *view) setDesired(d fleet.Desired) {
	if old, ok := v.desired[d.Job]; ok {
		v.useUID(old.UID, -1)
	}
	v.useUID(d.UID, 1)
	v.desired[d.Job] = d
	v.recheckDeleted(d.Job)
	if d.Running() {
		v.setAlloc(d.Job, &d.Allocation)
	} else {
		v.setAlloc(d.Job, nil)
	}
}

func (v *view) dropDesired(job string) {
	if old, ok := v.desired[job]; ok {
		v.useUID(old.UID, -1)
		delete(v.desired, job)
		delete(v.deleted, job)
		v.setAlloc(job, nil)
	}
}

// touch marks job's records changed outside the write diff: the next
// diff checks it in full, and the next decision is a full cycle.
func (v *view) touch(job string) {
	v.touched[job] = true
	v.outside++
}

// useUID counts one more (n 1) or one less (n -1) desired record holding
// uid.
func (v *view) useUID(uid uint32, n int) {
	if uid == 0 {
		return
	}
	if v.uidUse == nil {
		v.uidUse = map[uint32]int{}
	}
	if v.uidUse[uid] += n; v.uidUse[uid] <= 0 {
		delete(v.uidUse, uid)
	}
}

// setAlloc sets (a != nil) or removes job's entry of the engine's
// allocation list.
func (v *view) setAlloc(job string, a *api.Allocation) {
	if v.allocAt == nil || v.stale.allocs {
		v.stale.allocs = true // rebuilt whole by state
		return
	}
	i, ok := v.allocAt[job]
	switch {
	case a != nil && ok:
		v.cAllocs[i] = *a
	case a != nil:
		v.allocAt[job] = len(v.cAllocs)
		v.cAllocs = append(v.cAllocs, *a)
	case ok:
		last := len(v.cAllocs) - 1
		v.cAllocs[i] = v.cAllocs[last]
		v.allocAt[v.cAllocs[i].Job] = i
		v.cAllocs[last] = api.Allocation{}
		v.cAllocs = v.cAllocs[:last]
		delete(v.allocAt, job)
	}
}

// recheckDeleted keeps deleted: the jobs whose desired record stops them
// and that no spec owns any more.
func (v *view) recheckDeleted(job string) {
	_, owned := v.owned[job]
	if d, ok := v.desired[job]; ok && d.Stop != nil && !owned {
		v.deleted[job] = true
	} else {
		delete(v.deleted, job)
	}
}

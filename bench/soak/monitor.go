package main

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// markVar is set in the environment of every process the soak starts; all
// their descendants inherit it (jobs get it through their spec), so /proc tells the soak's tree from the rest
// of the machine (other jobs share it).
const markVar = "SOAK_MARK"

// proc is one live process of the soak's tree, as /proc shows it.
type proc struct {
	pid, ppid int
	state     byte
	start     uint64
	// worker: its environment has TORCHELASTIC_RUN_ID.
	worker bool
	job    string // TORCHELASTIC_RUN_ID (workers) or --rdzv-id (hyperpodrun)
	rank   string
	round  string
	node   string // HYPERPODRUN_NODE_ID
	// hyperpodrun: the process runs the soak's hyperpodrun binary.
	hyperpodrun bool
	cmd         string
	// uid is the process's real uid (/proc/<pid>/status); uidKnown says
	// it could be read.
	uid      uint32
	uidKnown bool
}

func (p proc) String() string {
	switch {
	case p.worker:
		return fmt.Sprintf("worker pid %d (job %s, RANK %s, round %s, node %s, ppid %d, state %c)", p.pid, p.job, p.rank, p.round, p.node, p.ppid, p.state)
	case p.hyperpodrun:
		return fmt.Sprintf("hyperpodrun pid %d (job %s, node %s, ppid %d, state %c)", p.pid, p.job, p.node, p.ppid, p.state)
	}
	return fmt.Sprintf("pid %d %q (ppid %d, state %c)", p.pid, p.cmd, p.ppid, p.state)
}

// cached is what the scanner remembers of a process whose exec is old
// enough not to change any more.
type cached struct {
	start uint64
	ours  bool
	p     proc
}

// scanner reads the soak's tree out of /proc.
type scanner struct {
	mark        string
	hyperpodrun string // absolute path of the hyperpodrun binary
	self        int
	bootTicks   func() uint64
	mu          sync.Mutex
	cache       map[int]cached
}

func newScanner(mark, hyperpodrun string) *scanner {
	return &scanner{mark: mark, hyperpodrun: hyperpodrun, self: os.Getpid(), cache: map[int]cached{}, bootTicks: ticksSinceBoot}
}

// clkTck is USER_HZ, 100 on every Linux the soak runs on.
const clkTck = 100

func ticksSinceBoot() uint64 {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	up, _ := strconv.ParseFloat(f[0], 64)
	return uint64(up * clkTck)
}

// scan returns every live (non-zombie) process of the soak's tree.
func (s *scanner) scan() []proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.bootTicks()
	seen := map[int]bool{}
	var out []proc
	for _, pid := range listPIDs() {
		if pid == s.self {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.state == 'Z' || st.state == 'X' {
			continue
		}
		seen[pid] = true
		c, ok := s.cache[pid]
		if !ok || c.start != st.startTime {
			c = cached{start: st.startTime}
			env, err := readEnviron(pid)
			if err != nil {
				continue
			}
			c.ours = env[markVar] == s.mark
			if c.ours {
				c.p = s.describe(pid, env)
			}
			// A process younger than 2 s may not have exec'd yet (a forked
			// hyperpodrun about to become a worker): read it again later.
			if now > st.startTime+2*clkTck {
				s.cache[pid] = c
			}
		}
		if !c.ours {
			continue
		}
		p := c.p
		p.ppid, p.state, p.start = st.ppid, st.state, st.startTime
		out = append(out, p)
	}
	for pid := range s.cache {
		if !seen[pid] {
			delete(s.cache, pid)
		}
	}
	return out
}

func (s *scanner) describe(pid int, env map[string]string) proc {
	p := proc{pid: pid, node: env["HYPERPODRUN_NODE_ID"]}
	p.uid, p.uidKnown = readUID(pid)
	args := readCmdline(pid)
	p.cmd = strings.Join(args, " ")
	if len(p.cmd) > 120 {
		p.cmd = p.cmd[:120] + "..."
	}
	if id, ok := env["TORCHELASTIC_RUN_ID"]; ok {
		p.worker, p.job, p.rank, p.round = true, id, env["RANK"], env["HYPERPODRUN_ROUND"]
		return p
	}
	if exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err == nil && exe == s.hyperpodrun {
		p.hyperpodrun = true
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "--rdzv-id" || args[i] == "--rdzv_id" {
				p.job = args[i+1]
			}
		}
	}
	return p
}

// dupKey names one RANK of one job.
type dupKey struct{ job, rank string }

// duplicates finds the ranks of a job held by more than one live worker.
// A worker's descendants inherit its environment: only a process whose
// parent is not itself a worker of the job counts as a worker.
func duplicates(ps []proc) map[dupKey][]proc {
	workerPID := map[int]string{}
	for _, p := range ps {
		if p.worker {
			workerPID[p.pid] = p.job
		}
	}
	by := map[dupKey][]proc{}
	for _, p := range ps {
		if !p.worker || workerPID[p.ppid] == p.job {
			continue
		}
		k := dupKey{p.job, p.rank}
		by[k] = append(by[k], p)
	}
	out := map[dupKey][]proc{}
	for k, v := range by {
		if len(v) > 1 {
			sort.Slice(v, func(i, j int) bool { return v[i].pid < v[j].pid })
			out[k] = v
		}
	}
	return out
}

// orphanWatch finds processes of the tree whose parent died: reparented
// to the soak (its subreaper) without being one of its children, or to
// PID 1. One is an orphan once it has lived so for grace (a worker killed
// by its parent's death signal is seen reparented for a moment).
type orphanWatch struct {
	grace time.Duration
	since map[int]time.Time
	found map[int]proc
	order []int
}

func newOrphanWatch(grace time.Duration) *orphanWatch {
	return &orphanWatch{grace: grace, since: map[int]time.Time{}, found: map[int]proc{}}
}

// observe updates the watch with a scan; it returns the processes that just
// became orphans.
func (o *orphanWatch) observe(ps []proc, now time.Time, self int, isChild func(int) bool) []proc {
	var fresh []proc
	cur := map[int]bool{}
	for _, p := range ps {
		if !(p.ppid == 1 || (p.ppid == self && !isChild(p.pid))) {
			continue
		}
		cur[p.pid] = true
		t, ok := o.since[p.pid]
		if !ok {
			o.since[p.pid] = now
			continue
		}
		if _, done := o.found[p.pid]; !done && now.Sub(t) >= o.grace {
			o.found[p.pid] = p
			o.order = append(o.order, p.pid)
			fresh = append(fresh, p)
		}
	}
	for pid := range o.since {
		if !cur[pid] {
			delete(o.since, pid)
		}
	}
	return fresh
}

// staleRounds finds live workers of a job whose rendezvous round is older
// than the newest round with live workers of that job: a superseded round's
// worker must be gone before the next round's workers start (fencing),
// whether or not its RANK collides.
func staleRounds(ps []proc) map[string][]proc {
	newest := map[string]int64{}
	for _, p := range ps {
		if r, err := strconv.ParseInt(p.round, 10, 64); p.worker && err == nil && r > newest[p.job] {
			newest[p.job] = r
		}
	}
	out := map[string][]proc{}
	for _, p := range ps {
		if r, err := strconv.ParseInt(p.round, 10, 64); p.worker && err == nil && r < newest[p.job] {
			out[p.job] = append(out[p.job], p)
		}
	}
	return out
}

// uidProblem is one broken per-job identity: key names it (reported once),
// detail says what was seen.
type uidProblem struct{ key, detail string }

// uidProblems checks, with per-job uids on, who the jobs' processes
// (workers and hyperpodruns) run as. Rules:
//
//   - root: a job's process runs as root;
//   - two-uids: a job's processes run as two uids at once (a job has one
//     uid on every node);
//   - shared: one uid runs processes of two jobs at once (they could read,
//     write and signal each other).
func uidProblems(ps []proc) []uidProblem {
	byJob := map[string]map[uint32]proc{}
	byUID := map[uint32]map[string]proc{}
	for _, p := range ps {
		if !(p.worker || p.hyperpodrun) || p.job == "" || !p.uidKnown {
			continue
		}
		if byJob[p.job] == nil {
			byJob[p.job] = map[uint32]proc{}
		}
		if _, ok := byJob[p.job][p.uid]; !ok {
			byJob[p.job][p.uid] = p
		}
		if byUID[p.uid] == nil {
			byUID[p.uid] = map[string]proc{}
		}
		if _, ok := byUID[p.uid][p.job]; !ok {
			byUID[p.uid][p.job] = p
		}
	}
	var out []uidProblem
	for _, job := range sortedKeys(byJob) {
		uids := byJob[job]
		if p, ok := uids[0]; ok {
			out = append(out, uidProblem{key: "root/" + job, detail: fmt.Sprintf("job %s runs as root: %s", job, p)})
		}
		if len(uids) > 1 {
			var seen []string
			for _, u := range sortedKeys(uids) {
				seen = append(seen, fmt.Sprintf("uid %d: %s", u, uids[u]))
			}
			out = append(out, uidProblem{key: "two-uids/" + job, detail: fmt.Sprintf("job %s runs as %d uids at once:\n%s", job, len(uids), indent(seen, 0))})
		}
	}
	for _, u := range sortedKeys(byUID) {
		jobs := byUID[u]
		if u == 0 || len(jobs) < 2 {
			continue
		}
		names := sortedKeys(jobs)
		var seen []string
		for _, j := range names {
			seen = append(seen, jobs[j].String())
		}
		out = append(out, uidProblem{key: fmt.Sprintf("shared/%d/%s", u, strings.Join(names, ",")),
			detail: fmt.Sprintf("uid %d runs processes of %d jobs (%s) at once:\n%s", u, len(jobs), strings.Join(names, ", "), indent(seen, 0))})
	}
	return out
}

func sortedKeys[K string | uint32, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// readUID reads a process's real uid from /proc/<pid>/status.
func readUID(pid int) (uint32, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0, false
			}
			u, err := strconv.ParseUint(f[0], 10, 32)
			return uint32(u), err == nil
		}
	}
	return 0, false
}

// Command demo is the main demo, on an embedded etcd with no setup: the
// coordinator, four node agents with fixture inventories (8 x H100 each),
// two teams and real training workers (PyTorch DDP if installed, else the
// bundled worker). A low-priority elastic job of team research grows into
// the idle fleet; a high-priority job of team prod arrives and takes its
// quota back by shrinking the elastic job through the sync signal (checkpoint,
// no lost step); when prod finishes, the elastic job grows back. It prints a
// timeline and the fleet's utilization.
//
// Isolation (issue 22, -isolation, on by default): each node agent connects
// to etcd as its own node user (hyperpod-node-<node>), and, when the demo
// runs as root, each job runs as its own uid from the coordinator's
// --job-uid-range. What a job reads (hyperpodrun, the worker, the training
// script) is copied into a 0755 directory of the demo's work directory, and
// the jobs write their checkpoints under a sticky world-writable directory
// (1777, like /tmp or a shared scratch file system), each job in a
// directory it creates itself. A user other than root cannot change uid:
// then the jobs run as that user, as the demo says in its first lines.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/agent/node/jobrunner"
	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/fsutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

const (
	flavor      = "nvidia-h100-80gb"
	gpusPerNode = 8
	nodes       = 4
)

func main() {
	hpr := flag.String("hyperpodrun", "bin/hyperpodrun", "hyperpodrun binary")
	workerBin := flag.String("worker", "bin/worker", "bundled worker (used without PyTorch)")
	python := flag.String("python", "", "Python with torch (default: $PYTHON_EXEC, else /usr/bin/python3)")
	auth := flag.Bool("auth", true, "turn etcd auth on: every party connects as its own user (docs/security.md); -auth=false runs without")
	isolation := flag.Bool("isolation", true, "each node agent as its own etcd user (with -auth) and, as root, each job as its own uid; -isolation=false: one shared agent user, jobs as the demo's user")
	flag.Parse()
	res, err := scenario(options{hyperpodrun: *hpr, worker: *workerBin, python: *python, auth: *auth, isolation: *isolation, out: os.Stdout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	if res.lost > 0 {
		os.Exit(1)
	}
}

type options struct {
	hyperpodrun, worker, python string
	// auth turns etcd auth on (elasticctl auth bootstrap): the
	// coordinator, the agents and each team connect as their own users,
	// and every job gets its own.
	auth bool
	// isolation gives each node agent its own etcd user (with auth) and,
	// when the demo runs as root, each job its own uid (issue 22).
	isolation bool
	out       io.Writer
}

// result is what the scenario observed.
type result struct {
	// sizes are the elastic job's world sizes in the order they trained at.
	sizes          []int
	steps          int
	lost, repeated int
	utilization    float64
	prodFinished   bool
	history        []fleet.Event
	// refused holds etcd's answers to the attacks tried with auth on.
	refused []error
	// nodeRefused is etcd's answer to node-0's agent registering node-9
	// (with per-node users; nil when not tried).
	nodeRefused error
	// uids are the jobs' uids (their desired records'; 0: none) and procs
	// how many processes /proc showed running as each while both trained.
	uids  map[string]uint32
	procs map[string]int
}

// timeline prints events with the time since the demo started.
type timeline struct {
	out   io.Writer
	start time.Time
	mu    sync.Mutex
}

func (t *timeline) say(format string, a ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.out, "[%6.1fs] %s\n", time.Since(t.start).Seconds(), fmt.Sprintf(format, a...))
}

var stepRE = regexp.MustCompile(`^(\S+)/(\S+) (?:\[default0\]:)?step=(\d+) world_size=(\d+) loss=([0-9.]+)`)

// progress follows rank 0's step lines of every job.
type progress struct {
	tl    *timeline
	mu    sync.Mutex
	sizes map[string][]int
	world map[string]int
	steps map[string][]int
	last  map[string]string
}

func (p *progress) Write(b []byte) (int, error) {
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		m := stepRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		job := m[2]
		step, _ := strconv.Atoi(m[3])
		world, _ := strconv.Atoi(m[4])
		p.mu.Lock()
		if p.world[job] != world {
			p.sizes[job] = append(p.sizes[job], world)
			p.tl.say("%-12s training at world size %d (step %d, loss %s)", job, world, step, m[5])
			p.world[job] = world
		} else if step%25 == 0 {
			p.tl.say("%-12s step %d at world size %d, loss %s", job, step, world, m[5])
		}
		p.steps[job] = append(p.steps[job], step)
		p.last[job] = m[5]
		p.mu.Unlock()
	}
	return len(b), nil
}

func (p *progress) at(job string) (world, steps int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.steps[job]
	if len(s) > 0 {
		steps = s[len(s)-1]
	}
	return p.world[job], steps
}

// checkSteps counts steps missing from, and repeated in, a 1..N sequence.
func checkSteps(steps []int) (lost, repeated int) {
	seen := map[int]int{}
	top := 0
	for _, s := range steps {
		seen[s]++
		top = max(top, s)
	}
	for i := 1; i <= top; i++ {
		switch {
		case seen[i] == 0:
			lost++
		case seen[i] > 1:
			repeated += seen[i] - 1
		}
	}
	return
}

func waitUntil(ctx context.Context, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// fixture returns a node's inventory: 8 healthy H100s.
func fixture(name string) func(context.Context) (*devices.Inventory, error) {
	return func(context.Context) (*devices.Inventory, error) {
		inv := &devices.Inventory{Node: name, Flavor: flavor, Flavors: []string{flavor}, VCPUs: 192, MemoryBytes: 2 << 40, UpdatedAt: time.Now().UTC()}
		for g := 0; g < gpusPerNode; g++ {
			inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNVIDIA, Index: g, Name: "NVIDIA H100 80GB HBM3",
				Flavor: flavor, UUID: fmt.Sprintf("GPU-%s-%d", name, g), Minor: g, MemoryBytes: 80 << 30, Healthy: true})
		}
		return inv, nil
	}
}

// utilization integrates allocated GPUs over time from the decisions.
type utilization struct {
	mu         sync.Mutex
	total      int
	last       time.Time
	used       int
	usedSec    float64
	elapsedSec float64
}

func (u *utilization) record(d policy.Decision) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	if !u.last.IsZero() && u.used > 0 {
		dt := now.Sub(u.last).Seconds()
		u.usedSec += dt * float64(u.used)
		u.elapsedSec += dt
	}
	u.last = now
	u.used = 0
	for _, a := range d.Allocations {
		u.used += a.Size * a.AcceleratorsPerNode
	}
}

func (u *utilization) percent() float64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.elapsedSec == 0 {
		return 0
	}
	return 100 * u.usedSec / (u.elapsedSec * float64(u.total))
}

// followEvents prints the coordinator's decisions as they happen.
func followEvents(ctx context.Context, cli *clientv3.Client, st *fleet.Store, tl *timeline) {
	for w := range cli.Watch(ctx, st.Keys.EventsPrefix(), clientv3.WithPrefix(), clientv3.WithFilterDelete()) {
		evs := w.Events
		sort.Slice(evs, func(i, j int) bool { return string(evs[i].Kv.Key) < string(evs[j].Kv.Key) })
		for _, ev := range evs {
			var e fleet.Event
			if err := json.Unmarshal(ev.Kv.Value, &e); err != nil {
				continue
			}
			if e.Kind == policy.KindPending && e.Code == "" {
				continue
			}
			line := fmt.Sprintf("coordinator: %s %s", e.Job, e.Kind)
			if e.FromSize != e.ToSize {
				line += fmt.Sprintf(" %d -> %d nodes", e.FromSize, e.ToSize)
			}
			tl.say("%s: %s", line, e.Message)
		}
	}
}

// identityPlan is who the demo's parties and jobs run as.
type identityPlan struct {
	// perJobUIDs: each job runs as its own uid (the coordinator's
	// --job-uid-range, the agents' --job-uid-range); else as the demo's
	// user (--allow-root-jobs when that is root).
	perJobUIDs bool
	agentRange jobrunner.UIDRange
	// coordFirst and coordLast are the coordinator's range (0, 0: none).
	coordFirst, coordLast uint32
	// nodeUsers: each node agent connects as hyperpod-node-<node>; else
	// (with auth) all as the shared hyperpod-agent.
	nodeUsers bool
	// jobsLine and agentsLine say so, first thing.
	jobsLine, agentsLine string
}

// identities decides who the demo's jobs and node agents run as, given
// -isolation, -auth and the demo's effective uid. Rules:
//
//   - per-job-uid: isolation as root: each job its own uid from
//     coordinator.DefaultJobUIDRange;
//   - not-root: isolation as another user: the jobs run as that user
//     (only root can change uid);
//   - shared-uid: no isolation: the jobs run as the demo's user, root
//     included (hyperpod-agent --allow-root-jobs), as before issue 22;
//   - node-users: isolation with auth: each node agent its own etcd user;
//   - shared-agent: auth without isolation: one hyperpod-agent user;
//   - no-auth: auth off: no etcd users at all.
func identities(isolation, auth bool, euid int) identityPlan {
	var p identityPlan
	switch {
	case isolation && euid == 0:
		first, last, err1 := coordinator.ParseUIDRange(coordinator.DefaultJobUIDRange)
		r, err2 := jobrunner.ParseUIDRange(coordinator.DefaultJobUIDRange)
		if err := errors.Join(err1, err2); err != nil {
			p.jobsLine = fmt.Sprintf("jobs run as root: the uid range %s is unusable: %v", coordinator.DefaultJobUIDRange, err)
			break
		}
		p.perJobUIDs, p.agentRange, p.coordFirst, p.coordLast = true, r, first, last
		p.jobsLine = fmt.Sprintf("job identities: each job runs as its own uid from %s (coordinator and agents --job-uid-range), in 0700 directories made for it", r)
	case isolation:
		p.jobsLine = fmt.Sprintf("job identities: the jobs run as you (uid %d): a user other than root cannot change uid; run the demo as root (sudo make demo) to see each job run as its own uid", euid)
	default:
		p.jobsLine = fmt.Sprintf("job identities: -isolation=false: every job runs as the demo's user (uid %d, --allow-root-jobs)", euid)
	}
	switch {
	case !auth:
		p.agentsLine = "node agents: etcd auth is off (-auth=false): no party has a user of its own"
	case isolation:
		p.nodeUsers = true
		p.agentsLine = "node agents: each connects to etcd as its own user (hyperpod-node-<node>): it writes only its own node's records and reads only its own assignments"
	default:
		p.agentsLine = "node agents: -isolation=false: all connect to etcd as the one shared hyperpod-agent user"
	}
	return p
}

// shareReadOnly copies files into dir (made 0755): a job running as any
// uid can read them there, whatever the modes of the directories they came
// from (a 0700 temporary or home directory). Executables keep 0755, the
// rest get 0644. A file that does not exist is not copied and keeps its
// path. It returns the new paths, in order.
func shareReadOnly(dir string, files ...string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("shared directory: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("shared directory: %w", err)
	}
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = f
		st, err := os.Stat(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("share %s with the jobs: %w", f, err)
		}
		mode := os.FileMode(0o644)
		if st.Mode()&0o111 != 0 {
			mode = 0o755
		}
		dst := filepath.Join(dir, filepath.Base(f))
		if err := fsutil.CopyFile(f, dst, mode); err != nil {
			return nil, fmt.Errorf("share %s with the jobs: %w", f, err)
		}
		out[i] = dst
	}
	return out, nil
}

// procsByUID counts the live processes of each real uid (/proc/<pid>/status).
func procsByUID() map[uint32]int {
	n := map[uint32]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return n
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue // gone meanwhile
		}
		if uid, ok := statusUID(string(b)); ok {
			n[uid]++
		}
	}
	return n
}

// statusUID reads the real uid from a /proc/<pid>/status text.
func statusUID(status string) (uint32, bool) {
	for _, line := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(line, "Uid:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		u, err := strconv.ParseUint(f[0], 10, 32)
		return uint32(u), err == nil
	}
	return 0, false
}

// makeStickyDir makes dir world-writable and sticky (1777, as /tmp): any
// uid creates its own entries there, and none removes or renames another's.
func makeStickyDir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	// os.FileMode's sticky bit is ModeSticky, not 0o1000.
	return os.Chmod(dir, os.ModeSticky|0o777)
}

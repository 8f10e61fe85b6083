// Command coordinator_daemon measures the real hyperpod-coordinator binary
// on a real etcd (Debian's etcd binary, fsync on; the embedded etcd with
// fsync on where that is missing) at fleet sizes, with node records under
// leases and one watch per simulated node agent on its own assignments:
//
//   - submit -> decision written (the job's status record), median and max;
//   - idle CPU per 2 s (what one resync cycle cost before) and the bytes
//     etcd sends per idle minute;
//   - per churn round (1% of the jobs finish, 1% are submitted; a round
//     ends once the coordinator wrote and then rested 2 s): the
//     coordinator's etcd puts and deletes (keys, seen by a watch), etcd's
//     own count of put and delete requests (a range delete is one), the
//     watch events delivered to the agents' watches, against the jobs
//     changed;
//   - etcd's database growth per minute under churn (one round per 10 s,
//     extrapolated from the rounds run), with the coordinator compacting;
//   - the coordinator's RSS.
//
// Windows are short (a 2-core machine runs the whole bench in minutes): the
// per-minute figures are extrapolated, and the output says so.
//
//	go run ./bench/coordinator_daemon [-sizes 500x1000x10,2000x5000x50,5000x10000x100]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

const flavor = "nvidia-h100-80gb"

type size struct{ nodes, jobs, teams int }

func (s size) String() string { return fmt.Sprintf("%dn_%dj_%dt", s.nodes, s.jobs, s.teams) }

type options struct {
	coordinator, etcdBin string
	idle                 time.Duration
	rounds, submits      int
	agents               int
	seed                 uint64
	keep                 bool
	coordinatorFlags     string
	elasticSubmits       bool
}

func main() {
	var o options
	sizes := flag.String("sizes", "500x1000x10,2000x5000x50,5000x10000x100", "nodes x jobs x teams, comma-separated")
	flag.StringVar(&o.coordinator, "coordinator", "bin/hyperpod-coordinator", "the hyperpod-coordinator binary (built into a temporary directory when missing)")
	flag.StringVar(&o.etcdBin, "etcd", "/usr/bin/etcd", "etcd binary (Debian's etcd-server); when missing, the embedded etcd with fsync on")
	flag.DurationVar(&o.idle, "idle", 12*time.Second, "idle window (extrapolated per minute)")
	flag.IntVar(&o.rounds, "rounds", 4, "churn rounds")
	flag.IntVar(&o.submits, "submits", 15, "single submits timed for submit -> decision")
	flag.BoolVar(&o.elasticSubmits, "elastic-submits", false, "time elastic whole-node submits (8 accelerators a node, 1 to 4 nodes) instead of 1-accelerator ones (the submit lines' names end in _elastic)")
	flag.IntVar(&o.agents, "agents", 5000, "simulated agent watches (one per node, at most this many)")
	flag.Uint64Var(&o.seed, "seed", 1, "random seed")
	flag.StringVar(&o.coordinatorFlags, "coordinator-flags", "", "more flags for the coordinator, space-separated (e.g. --log-level=debug, with -keep: one log line per cycle)")
	flag.BoolVar(&o.keep, "keep", false, "keep the etcd data and the coordinator's log (the directory is printed)")
	flag.Parse()
	if err := run(o, *sizes); err != nil {
		fmt.Fprintln(os.Stderr, "coordinator_daemon:", err)
		os.Exit(1)
	}
}

func run(o options, sizes string) error {
	var ss []size
	for _, s := range strings.Split(sizes, ",") {
		var z size
		if _, err := fmt.Sscanf(s, "%dx%dx%d", &z.nodes, &z.jobs, &z.teams); err != nil || z.nodes < 1 || z.jobs < 1 || z.teams < 1 {
			return fmt.Errorf("-sizes %q: want NODESxJOBSxTEAMS, e.g. 500x1000x10", s)
		}
		ss = append(ss, z)
	}
	tmp, err := os.MkdirTemp("", "coordinator-daemon-bench-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("# keeping", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	if _, err := os.Stat(o.coordinator); err != nil {
		o.coordinator = filepath.Join(tmp, "hyperpod-coordinator")
		b := exec.Command("go", "build", "-o", o.coordinator, "./cmd/hyperpod-coordinator")
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			return fmt.Errorf("build hyperpod-coordinator: %w", err)
		}
	}
	fmt.Printf("# coordinator_daemon: the hyperpod-coordinator binary on %s; node records under leases (one per 100 nodes); one watch per simulated agent on its node's assignments; windows shortened (idle %s, %d churn rounds) and extrapolated per minute; machine load now: %s\n",
		etcdKind(o.etcdBin), o.idle, o.rounds, loadavg())
	for _, z := range ss {
		if err := bench(o, z, tmp); err != nil {
			return fmt.Errorf("%s: %w", z, err)
		}
	}
	return nil
}

func etcdKind(bin string) string {
	if _, err := os.Stat(bin); err == nil {
		return "Debian's etcd (" + bin + ", fsync on)"
	}
	return "the embedded etcd (fsync on)"
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// etcdServer is a running etcd: a child process or the embedded one.
type etcdServer struct {
	endpoint string
	cmd      *exec.Cmd
	emb      *etcdembed.Server
}

// freePort is a free loopback port; 0 when none could be had (what is
// started on it then fails and says so).
func freePort() int {
	p, _ := testutil.FreePortErr()
	return p
}

func startEtcd(ctx context.Context, bin, dir string) (*etcdServer, error) {
	if _, err := os.Stat(bin); err != nil {
		emb, err := etcdembed.Start(ctx, etcdembed.Options{Dir: filepath.Join(dir, "etcd")})
		if err != nil {
			return nil, err
		}
		return &etcdServer{endpoint: emb.Endpoints[0], emb: emb}, nil
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", freePort())
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort())
	cmd := exec.Command(bin, "--name", "bench", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "bench="+peer, "--initial-cluster-state", "new",
		"--quota-backend-bytes", strconv.Itoa(4<<30), "--logger", "zap", "--log-level", "error")
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &etcdServer{endpoint: client, cmd: cmd}
	deadline := time.Now().Add(30 * time.Second)
	for {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err == nil {
			c, cancel := context.WithTimeout(ctx, time.Second)
			_, err = cli.Get(c, "health")
			cancel()
			cli.Close()
			if err == nil {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("etcd did not answer in 30s (log: %s)", logf.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *etcdServer) stop() {
	if s.emb != nil {
		s.emb.Close()
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
}

// writeOps is the count of put and delete requests etcd applied so far
// (etcd_mvcc_put_total + etcd_mvcc_delete_total: its own count, where a
// range delete is one request whatever it removes); -1 where unknown, as
// sentBytes.
func (s *etcdServer) writeOps() float64 {
	if s.cmd == nil {
		return -1
	}
	return s.metricSum("etcd_mvcc_put_total ", "etcd_mvcc_delete_total ")
}

// metricSum sums the samples of etcd's /metrics whose lines start with one
// of prefixes (-1 when etcd does not answer).
func (s *etcdServer) metricSum(prefixes ...string) float64 {
	resp, err := http.Get(s.endpoint + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				f := strings.Fields(l)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				sum += v
			}
		}
	}
	return sum
}

// sentBytes is what etcd sent its clients so far (its own counter; the
// embedded etcd registers it in this process's default registry, which
// this bench does not serve: there it is 0 and reported as unknown).
func (s *etcdServer) sentBytes() float64 {
	if s.cmd == nil {
		return -1
	}
	return s.metricSum("etcd_network_client_grpc_sent_bytes_total")
}

// cycleSeconds is the coordinator's cycle-latency histogram's sum and
// count, and the engine's sum, from its /metrics.
func cycleSeconds(port int) (sum, count, engine float64) {
	m, _ := scrape(port)
	return m["hyperpod_coordinator_cycle_seconds_sum"], m["hyperpod_coordinator_cycle_seconds_count"], m["hyperpod_coordinator_engine_seconds_sum"]
}

// scrape reads the unlabelled series of the coordinator's /metrics, by
// name, in one fetch; the error is a failed fetch's.
func scrape(port int) (map[string]float64, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				m[f[0]] = v
			}
		}
	}
	return m, sc.Err()
}

// cpuTime reads a process's CPU time from /proc: the sum of its threads'
// run times in nanoseconds (schedstat), or /proc/PID/stat's 10 ms ticks
// where schedstat is missing.
func cpuTime(pid int) time.Duration {
	if ns, ok := sumTasks(pid, "schedstat", func(s string) (int64, bool) {
		f := strings.Fields(s)
		if len(f) == 0 {
			return 0, false
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		return n, err == nil
	}); ok {
		return time.Duration(ns)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// wakeups counts a process's context switches, voluntary and not, over
// its threads: each is a thread put on a CPU again, what an idle process
// pays for every timer it keeps.
func wakeups(pid int) int64 {
	n, _ := sumTasks(pid, "status", func(s string) (int64, bool) {
		var sum int64
		for _, l := range strings.Split(s, "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				c, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					return 0, false
				}
				sum += c
			}
		}
		return sum, true
	})
	return n
}

// sumTasks sums parse over /proc/PID/task/*/file; ok is false when a
// thread's file cannot be read or parsed.
func sumTasks(pid int, file string, parse func(string) (int64, bool)) (int64, bool) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return 0, false
	}
	var sum int64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/%s", pid, t.Name(), file))
		if err != nil {
			return 0, false
		}
		n, ok := parse(string(b))
		if !ok {
			return 0, false
		}
		sum += n
	}
	return sum, true
}

func rssMB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// tally counts the coordinator's writes seen by a watch on the whole
// prefix, and when each job's status was first written.
type tally struct {
	mu       sync.Mutex
	puts     int
	deletes  int
	byKind   map[string]int  // puts by record: desired, status, assign, events, usage; deletes as del-<record>
	jobs     map[string]bool // jobs whose desired record, status or assignment changed
	last     time.Time       // the coordinator's last write
	statusAt map[string]chan struct{}
	running  map[string]bool // jobs whose desired record places them
	// seq is each job's writes in this round, in order (desired, stop,
	// status:<kind>, assign, event; del-<record>): sequences() counts them.
	seq map[string][]string
}

// sequences counts the round's per-job write sequences, most common first
// (at most n): where a job's records were written more than once.
func (t *tally) sequences(n int) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	count := map[string]int{}
	for _, s := range t.seq {
		count[strings.Join(s, " ")]++
	}
	keys := slices.Collect(maps.Keys(count))
	slices.SortFunc(keys, func(a, b string) int {
		if count[a] != count[b] {
			return count[b] - count[a]
		}
		return strings.Compare(a, b)
	})
	var out []string
	for _, k := range keys[:min(n, len(keys))] {
		out = append(out, fmt.Sprintf("%d x [%s]", count[k], k))
	}
	return out
}

func (t *tally) reset() (puts, deletes, jobs int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	puts, deletes, jobs = t.puts, t.deletes, len(t.jobs)
	t.puts, t.deletes, t.jobs, t.byKind, t.seq = 0, 0, map[string]bool{}, map[string]int{}, map[string][]string{}
	return
}

func (t *tally) kinds() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.byKind)
}

func (t *tally) watch(ctx context.Context, cli *clientv3.Client, k fleet.Keys, rev int64) {
	wch := cli.Watch(ctx, k.Root(), clientv3.WithPrefix(), clientv3.WithRev(rev))
	go func() {
		for w := range wch {
			now := time.Now()
			t.mu.Lock()
			for _, e := range w.Events {
				key := string(e.Kv.Key)
				var job, kind, what string
				switch {
				case strings.HasPrefix(key, k.DesiredPrefix()):
					job, kind = strings.TrimPrefix(key, k.DesiredPrefix()), "desired"
					if e.Type == clientv3.EventTypePut {
						d, err := fleet.DecodeDesired(key, e.Kv.Value)
						t.running[job] = err == nil && d.Running()
						if err == nil && d.Stop != nil {
							what = "stop"
						}
					} else {
						delete(t.running, job)
					}
				case strings.HasPrefix(key, k.StatusPrefix()):
					job, kind = strings.TrimPrefix(key, k.StatusPrefix()), "status"
					if e.Type == clientv3.EventTypePut {
						if st, err := fleet.DecodeStatus(key, e.Kv.Value); err == nil {
							t.byKind["status:"+string(st.Kind)]++
							what = "status:" + string(st.Kind) + "/" + string(st.Code)
						}
					}
				case strings.HasPrefix(key, k.AssignPrefix()):
					_, job, _ = k.AssignmentOwner(key)
					kind = "assign"
				case strings.HasPrefix(key, k.EventsPrefix()):
					kind = "events"
					if ek, ok := k.ParseEventKey(key); ok && e.Type == clientv3.EventTypePut {
						job, what = ek.Job, "event"
					}
				case key == k.Usage():
					kind = "usage"
				default:
					continue // not the coordinator's
				}
				if what == "" {
					what = kind
					if e.Type != clientv3.EventTypePut {
						what = "del-" + kind
					}
				}
				// The job's decision is written: its status, or (a job
				// that runs as admitted has no status record) its
				// desired record.
				if ch := t.statusAt[job]; ch != nil && e.Type == clientv3.EventTypePut && (kind == "status" || kind == "desired") {
					close(ch)
					delete(t.statusAt, job)
				}
				if job != "" {
					if kind != "events" {
						t.jobs[job] = true
					}
					t.seq[job] = append(t.seq[job], what)
				}
				if e.Type == clientv3.EventTypePut {
					t.puts++
					t.byKind[kind]++
				} else {
					t.deletes++
					t.byKind["del-"+kind]++
				}
				t.last = now
			}
			t.mu.Unlock()
		}
	}()
}

// quiet waits until the coordinator wrote nothing for d (at most max).
func (t *tally) quiet(d, max time.Duration) {
	t.quietAfter(time.Time{}, d, max)
}

// quietAfter waits until the coordinator wrote something after since and
// then nothing for d (at most max): a churn round's writes start a cycle
// after its inputs, which under load can be more than d later.
func (t *tally) quietAfter(since time.Time, d, max time.Duration) {
	start := time.Now()
	for time.Since(start) < max {
		t.mu.Lock()
		last := t.last
		t.mu.Unlock()
		if last.After(since) && time.Since(last) >= d && time.Since(start) >= d {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type gen struct {
	rng   *rand.Rand
	teams int
	id    int
}

// job draws a Helios-shaped job (bench/engine's shapes): 1-8 GPUs on one
// node, or whole nodes, a third of those elastic.
func (g *gen) job(now time.Time) policy.Job {
	g.id++
	u := g.rng.Float64()
	p := g.rng.IntN(100)
	j := policy.Job{Name: fmt.Sprintf("job-%06d", g.id), Team: fmt.Sprintf("team-%03d", int(u*u*float64(g.teams))), Priority: &p, SubmitTime: now}
	x := g.rng.Float64()
	gpus := 64
	for _, c := range []struct {
		p float64
		g int
	}{{0.60, 1}, {0.70, 2}, {0.82, 4}, {0.94, 8}, {0.98, 16}, {0.995, 32}} {
		if x < c.p {
			gpus = c.g
			break
		}
	}
	if gpus <= 8 {
		j.PerNode.Accelerators = gpus
		return j
	}
	n := gpus / 8
	j.PerNode.Accelerators = 8
	j.MinNodes, j.MaxNodes = n, n
	if g.rng.IntN(3) == 0 {
		j.Elastic = true
		j.MinNodes, j.MaxNodes = max(1, n/2), n*2
	}
	return j
}

func putAll(ctx context.Context, cli *clientv3.Client, ops []clientv3.Op) error {
	for len(ops) > 0 {
		n := min(len(ops), 100)
		if _, err := cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			return err
		}
		ops = ops[n:]
	}
	return nil
}

func specOp(k fleet.Keys, j policy.Job) clientv3.Op {
	b, _ := json.Marshal(fleet.JobSpec{Job: j, Run: fleet.RunSpec{Script: "train.py"}})
	return clientv3.OpPut(k.Spec(j.Team, j.Name), string(b))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

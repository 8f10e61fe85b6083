package rendezvous

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/syncbuf"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// One embedded etcd serves the whole package; every test uses its own job
// id, so tests are isolated by key prefix and may run in parallel.
var (
	etcd   *etcdembed.Server
	jobSeq atomic.Int64
)

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	s, err := etcdembed.Start(ctx, etcdembed.Options{UnsafeNoFsync: true})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	etcd = s
	code := m.Run()
	etcd.Close()
	if code == 0 {
		if leaked := waitNoGoroutines(10*time.Second, "hyperpodrun/rendezvous.(*", "hyperpodrun/internal/tcpproxy", "go.etcd.io/etcd/client/v3"); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines leaked after all tests:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// waitNoGoroutines waits until no goroutine stack mentions any of the
// needles and returns the offending stacks if that never happens.
func waitNoGoroutines(d time.Duration, needles ...string) string {
	deadline := time.Now().Add(d)
	for {
		buf := make([]byte, 8<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var bad []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			for _, n := range needles {
				if strings.Contains(g, n) {
					bad = append(bad, g)
					break
				}
			}
		}
		if len(bad) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(bad, "\n\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// jobGoroutines returns the goroutines labelled with the job (every
// goroutine a Node starts carries its job and node id).
func jobGoroutines(job string) string {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	var out []string
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, `"rdzv-job":"`+job+`"`) {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

type harness struct {
	t     *testing.T
	job   string
	cli   *clientv3.Client
	logs  *syncBuffer
	mu    sync.Mutex
	nodes []*Node
}

// newHarness gives the test a job id, a client and a log buffer. Cleanup
// closes every node and checks none of the job's goroutines survive.
func newHarness(t *testing.T) *harness {
	t.Helper()
	cli, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	// Unique per run, so -count=N does not see the keys of earlier runs.
	job := fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()), jobSeq.Add(1))
	h := &harness{t: t, job: job, cli: cli, logs: &syncBuffer{}}
	t.Cleanup(func() {
		h.mu.Lock()
		nodes := h.nodes
		h.mu.Unlock()
		for _, n := range nodes {
			_ = n.Close()
		}
		// Goroutines the nodes started must be gone once Close returns...
		h.expectNoGoroutines(true)
		// ...and the client's own (watch streams created on a node's
		// goroutine inherit its labels) once the client is closed.
		cli.Close()
		h.expectNoGoroutines(false)
		if t.Failed() {
			t.Logf("logs:\n%s", h.logs.String())
		}
	})
	return h
}

// registerSilent writes node id's member record (127.0.0.1, LWS 1) under
// a 2 s lease kept alive until the test ends, as a live node that then
// does nothing: it never closes, acknowledges or renews a round. It
// returns the lease and the revision of the record's write.
func (h *harness) registerSilent(ctx context.Context, k keys, id string) (clientv3.LeaseID, int64) {
	h.t.Helper()
	g, err := h.cli.Grant(ctx, 2)
	if err != nil {
		h.t.Fatal(err)
	}
	kctx, kcancel := context.WithCancel(context.Background())
	h.t.Cleanup(kcancel)
	ka, err := h.cli.KeepAlive(kctx, g.ID)
	if err != nil {
		h.t.Fatal(err)
	}
	go func() {
		for range ka {
		}
	}()
	rec, _ := json.Marshal(memberRec{Addr: "127.0.0.1", LWS: 1})
	p, err := h.cli.Put(ctx, k.Member(id), string(rec), clientv3.WithLease(g.ID))
	if err != nil {
		h.t.Fatal(err)
	}
	return g.ID, p.Header.Revision
}

// expectNoGoroutines fails the test if goroutines labelled with the job
// survive (only those running rendezvous code when ours is set).
func (h *harness) expectNoGoroutines(ours bool) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		g := jobGoroutines(h.job)
		if ours && !strings.Contains(g, "hyperpodrun/rendezvous.") {
			return
		}
		if g == "" {
			return
		}
		if time.Now().After(deadline) {
			h.t.Errorf("goroutines of job %s still running after Close:\n%s", h.job, g)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) cfg(id string, minN, maxN int) Config {
	return Config{
		JobID: h.job, NodeID: id, Addr: "127.0.0.1", LocalWorldSize: 1,
		MinNodes: minN, MaxNodes: maxN,
		LeaseTTL: 2 * time.Second, LastCallTimeout: 300 * time.Millisecond, AckTimeout: 500 * time.Millisecond,
		JoinTimeout: 30 * time.Second,
		Logger:      slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("t", id),
	}
}

func (h *harness) node(cfg Config, cli ...*clientv3.Client) *Node {
	h.t.Helper()
	c := h.cli
	if len(cli) > 0 {
		c = cli[0]
	}
	n, err := New(c, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.mu.Lock()
	h.nodes = append(h.nodes, n)
	h.mu.Unlock()
	return n
}

// nodes creates nodes a, b, c... and registers them in that order, so
// their join order (and first-round ranks) is deterministic.
func (h *harness) register(ctx context.Context, cfgs ...Config) []*Node {
	h.t.Helper()
	var out []*Node
	for _, cfg := range cfgs {
		n := h.node(cfg)
		if err := n.register(ctx); err != nil {
			h.t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// NewClient connects the way hyperpodrun does, with the options
// --rdzv-conf carries.
func NewClient(endpoints []string, opts ClientOptions) (*clientv3.Client, error) {
	opts.Endpoints = endpoints
	if opts.Flags.Endpoints == "" {
		opts.Flags = etcdconn.RdzvFlags
	}
	return etcdconn.Connect(context.Background(), opts)
}

// setTarget sets the job's target size the way a coordinator-less
// operator would: a desired record without a placement.
func (h *harness) setTarget(ctx context.Context, n int) {
	h.t.Helper()
	if err := fleet.New(h.cli, "").SetTarget(ctx, h.job, n); err != nil {
		h.t.Fatal(err)
	}
}

// place writes the coordinator's desired record: size and placement.
func (h *harness) place(ctx context.Context, nodes ...string) {
	h.t.Helper()
	st := fleet.New(h.cli, "")
	op, err := st.PutDesiredOp(fleet.Desired{Allocation: api.Allocation{Job: h.job, Size: len(nodes), Nodes: nodes}, Generation: 1})
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.cli.Do(ctx, op); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) put(ctx context.Context, key, val string) {
	h.t.Helper()
	if _, err := h.cli.Put(ctx, key, val); err != nil {
		h.t.Fatal(err)
	}
}

type joinResult struct {
	r   *Round
	err error
	at  time.Time
}

// joinAll calls Join on every node concurrently.
func joinAll(ctx context.Context, nodes ...*Node) []joinResult {
	out := make([]joinResult, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := n.Join(ctx)
			out[i] = joinResult{r, err, time.Now()}
		}()
	}
	wg.Wait()
	return out
}

// mustJoinAll joins every node and checks they agree on one round.
func mustJoinAll(t *testing.T, ctx context.Context, nodes ...*Node) []*Round {
	t.Helper()
	res := joinAll(ctx, nodes...)
	rs := make([]*Round, len(res))
	for i, r := range res {
		if r.err != nil {
			t.Fatalf("node %s: join: %v", nodes[i].ID(), r.err)
		}
		rs[i] = r.r
	}
	checkRound(t, rs)
	return rs
}

// checkRound checks the invariants every member's view of a round obeys.
func checkRound(t *testing.T, rs []*Round) {
	t.Helper()
	first := rs[0]
	seen := map[int]string{}
	for _, r := range rs {
		if r.Number != first.Number || r.WorldSize != first.WorldSize || r.NumNodes != first.NumNodes ||
			r.MasterAddr != first.MasterAddr || r.MasterPort != first.MasterPort {
			t.Fatalf("members disagree on the round: %+v vs %+v", r, first)
		}
		if prev, dup := seen[r.Rank]; dup {
			t.Fatalf("rank %d held by %s and %s", r.Rank, prev, r.Self.NodeID)
		}
		seen[r.Rank] = r.Self.NodeID
		if r.MasterPort <= 0 || r.MasterAddr == "" {
			t.Fatalf("no master address: %+v", r)
		}
		if r.Members != nil {
			if len(r.Members) != r.NumNodes || r.Members[r.Rank] != r.Self {
				t.Fatalf("member list inconsistent with self: %+v", r)
			}
			base := 0
			for i, m := range r.Members {
				if m.GroupRank != i || m.BaseRank != base {
					t.Fatalf("member %d: rank %d base %d, want %d %d", i, m.GroupRank, m.BaseRank, i, base)
				}
				base += m.LocalWorldSize
			}
			if base != r.WorldSize || r.Members[0].Addr != r.MasterAddr {
				t.Fatalf("world %d vs %d, master %s vs %s", base, r.WorldSize, r.MasterAddr, r.Members[0].Addr)
			}
		}
	}
	if len(rs) == first.NumNodes && len(seen) != first.NumNodes {
		t.Fatalf("ranks %v do not cover the round", seen)
	}
}

func rankOf(rs []*Round, id string) int {
	for _, r := range rs {
		if r.Self.NodeID == id {
			return r.Rank
		}
	}
	return -1
}

// next waits for Next on every node and returns the changes.
func nextAll(t *testing.T, ctx context.Context, nodes []*Node, rs []*Round) []Change {
	t.Helper()
	out := make([]Change, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = n.Next(ctx, rs[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %s: next: %v", nodes[i].ID(), err)
		}
	}
	return out
}

type syncBuffer = syncbuf.Buffer

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, d, what, testutil.True(cond))
}

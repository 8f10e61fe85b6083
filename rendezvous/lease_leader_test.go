package rendezvous

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

func TestKeepaliveRules(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := time.Second
	t.Run("fenceAfter", func(t *testing.T) {
		for _, tc := range []struct {
			rule         string
			prev, expiry time.Time
			margin       time.Duration
			want         time.Time
		}{
			{"a confirmed keepalive moves the fence to its send time + TTL - margin", t0.Add(2 * s), t0.Add(4 * s), s, t0.Add(3 * s)},
			{"the answer to an older keepalive never moves the fence back", t0.Add(3 * s), t0.Add(3 * s), s, t0.Add(3 * s)},
			{"the first proof sets the fence", time.Time{}, t0.Add(3 * s), 750 * time.Millisecond, t0.Add(2250 * time.Millisecond)},
			{"an equal proof keeps the fence", t0.Add(2 * s), t0.Add(3 * s), s, t0.Add(2 * s)},
		} {
			if got := fenceAfter(tc.prev, tc.expiry, tc.margin); !got.Equal(tc.want) {
				t.Errorf("%s: fenceAfter(%v, %v, %s) = %v, want %v", tc.rule, tc.prev, tc.expiry, tc.margin, got, tc.want)
			}
		}
	})
	t.Run("streamVerdict", func(t *testing.T) {
		for _, tc := range []struct {
			rule        string
			oldest      time.Time
			answered    time.Time
			now         time.Time
			stuck       time.Duration
			wantReplace bool
		}{
			{"a stream with nothing awaiting an answer is kept", time.Time{}, t0, t0.Add(time.Hour), 250 * time.Millisecond, false},
			{"a keepalive younger than the wait keeps the stream", t0, t0, t0.Add(249 * time.Millisecond), 250 * time.Millisecond, false},
			{"a keepalive unanswered for the wait, nothing answered since, is stuck", t0, t0, t0.Add(250 * time.Millisecond), 250 * time.Millisecond, true},
			{"a stream answering others' keepalives late and in order is not stuck", t0, t0.Add(200 * time.Millisecond), t0.Add(300 * time.Millisecond), 250 * time.Millisecond, false},
			{"a longer wait (slow leader) keeps the stream longer", t0, t0, t0.Add(400 * time.Millisecond), 500 * time.Millisecond, false},
		} {
			if got := streamVerdict(tc.now, tc.oldest, tc.answered, tc.stuck); got != tc.wantReplace {
				t.Errorf("%s: streamVerdict = %v, want %v", tc.rule, got, tc.wantReplace)
			}
		}
	})
	t.Run("nextStuckAfter", func(t *testing.T) {
		for _, tc := range []struct {
			rule          string
			wait, maxWait time.Duration
			want          time.Duration
		}{
			{"each replacement without an answer doubles the wait", 250 * time.Millisecond, time.Second, 500 * time.Millisecond},
			{"the wait stops at two keepalive intervals", 800 * time.Millisecond, time.Second, time.Second},
			{"the cap is never below the shortest wait", 250 * time.Millisecond, 100 * time.Millisecond, minStuckAfter},
		} {
			if got := nextStuckAfter(tc.wait, tc.maxWait); got != tc.want {
				t.Errorf("%s: nextStuckAfter(%s, %s) = %s, want %s", tc.rule, tc.wait, tc.maxWait, got, tc.want)
			}
		}
	})
	t.Run("stuckWait", func(t *testing.T) {
		for _, tc := range []struct {
			rule          string
			wait, maxWait time.Duration
			endpoints     int
			want          time.Duration
		}{
			{"with other members, the adaptive wait", 250 * time.Millisecond, 2 * s, 3, 250 * time.Millisecond},
			{"with one member, two keepalive intervals", 250 * time.Millisecond, 2 * s, 1, 2 * s},
			{"with one member, never below the adaptive wait", 3 * s, 2 * s, 1, 3 * s},
		} {
			if got := stuckWait(tc.wait, tc.maxWait, tc.endpoints); got != tc.want {
				t.Errorf("%s: stuckWait(%s, %s, %d) = %s, want %s", tc.rule, tc.wait, tc.maxWait, tc.endpoints, got, tc.want)
			}
		}
	})
	t.Run("keepaliveInterval", func(t *testing.T) {
		for _, tc := range []struct {
			rule   string
			ttl    time.Duration
			joined bool
			want   time.Duration
		}{
			{"a joined node's lease is renewed six times per TTL", 3 * s, true, 500 * time.Millisecond},
			{"a long TTL is renewed six times per TTL too", 60 * s, true, 10 * s},
			{"never more often than every 100ms", 300 * time.Millisecond, true, 100 * time.Millisecond},
			{"a node that never joined a round (no workers) renews three times per TTL", 6 * s, false, 2 * s},
			{"never more often than every 100ms before a join either", 150 * time.Millisecond, false, 100 * time.Millisecond},
		} {
			if got := keepaliveInterval(tc.ttl, tc.joined); got != tc.want {
				t.Errorf("%s: keepaliveInterval(%s, joined %t) = %s, want %s", tc.rule, tc.ttl, tc.joined, got, tc.want)
			}
		}
	})
}

// clusterJob is a two-node job's rendezvous on a 3-member etcd cluster,
// each node on its own client to every member (as hyperpodrun connects),
// with the time each renewal left before the node would have fenced.
type clusterJob struct {
	t     *testing.T
	c     *etcdtest.Cluster
	nodes []*Node
	logs  *syncBuffer

	mu       sync.Mutex
	minSlack time.Duration // least time left before the fence when a renewal came
	lastFor  map[string]Renewal
}

func startClusterJob(t *testing.T, ttl time.Duration, etcdArgs ...string) *clusterJob {
	t.Helper()
	return startClusterJobOf(t, 3, ttl, etcdArgs...)
}

// startClusterJobOf is startClusterJob on an etcd of members members.
func startClusterJobOf(t *testing.T, members int, ttl time.Duration, etcdArgs ...string) *clusterJob {
	t.Helper()
	c := etcdtest.StartClusterArgs(t, members, etcdArgs...)
	j := &clusterJob{t: t, c: c, logs: &syncBuffer{}, minSlack: time.Hour, lastFor: map[string]Renewal{}}
	job := fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), jobSeq.Add(1))
	for _, id := range []string{"a", "b"} {
		cli, err := NewClient(c.Endpoints(), ClientOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		cfg := Config{
			JobID: job, NodeID: id, Addr: "127.0.0.1", LocalWorldSize: 1, MinNodes: 2, MaxNodes: 2,
			LeaseTTL: ttl, LastCallTimeout: 300 * time.Millisecond, AckTimeout: 500 * time.Millisecond, JoinTimeout: 30 * time.Second,
			Logger: slog.New(slog.NewTextHandler(j.logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("t", id),
		}
		cfg.OnRenew = func(r Renewal) {
			j.mu.Lock()
			defer j.mu.Unlock()
			if prev, ok := j.lastFor[id]; ok {
				j.minSlack = min(j.minSlack, time.Until(prev.FenceAt))
			}
			j.lastFor[id] = r
		}
		n, err := New(cli, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		j.nodes = append(j.nodes, n)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", j.logs.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustJoinAll(t, ctx, j.nodes...)
	return j
}

// fenced names the nodes that fired LeaseLost.
func (j *clusterJob) fenced() []string {
	var out []string
	for _, n := range j.nodes {
		select {
		case <-n.LeaseLost():
			out = append(out, n.ID())
		default:
		}
	}
	return out
}

// slack is the least time a renewal came before its node's fence.
func (j *clusterJob) slack() time.Duration {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.minSlack
}

// renewedSince waits until every node renewed its lease after t0.
func (j *clusterJob) renewedSince(t0 time.Time, what string) {
	j.t.Helper()
	testutil.Eventually(j.t, 20*time.Second, what, func() (bool, string) {
		if f := j.fenced(); len(f) > 0 {
			j.t.Fatalf("%s: nodes %v fenced", what, f)
		}
		j.mu.Lock()
		defer j.mu.Unlock()
		for _, n := range j.nodes {
			if r := j.lastFor[n.ID()]; !r.Expiry.After(t0.Add(n.ttl)) {
				return false, fmt.Sprintf("node %s's lease proven until %s", n.ID(), r.Expiry.Format("15:04:05.000"))
			}
		}
		return true, ""
	})
}

// fastElection is etcd tuned for a LAN (heartbeat 50 ms, election
// timeout 500 ms): a new leader within 0.5 to 1 s of the old one's death.
// A leader change never fences when the election ends within TTL -
// FenceMargin - TTL/6 (lease.go): with the default TTL (3 s) that is 1.75
// s, which etcd's default election timeout (1 s: elections of 1 to 2 s,
// 2.7 s seen on a loaded machine) does not always leave.
var fastElection = []string{"--heartbeat-interval", "50", "--election-timeout", "500"}

// leaderTestTTL: a 4 s lease leaves 2.3 s for the election and the first
// answer after it (the default 3 s left 47 ms once on 2 busy cores).
const leaderTestTTL = 4 * time.Second

// reprovenWithin bounds the time from a new leader (as the test sees it)
// to every node's lease proven again: the nodes' margin against a fence
// is what the election leaves of TTL - FenceMargin - TTL/6, less this.
const reprovenWithin = 600 * time.Millisecond

// An etcd leader SIGKILLed 20 times under a job (etcd's default election
// timeout, a 6 s lease): no node ever fences, and each node's lease is
// proven again within reprovenWithin of the new leader. Retrying a broken
// stream after 200ms and leaving a keepalive with the member that held it
// (which answers it a whole election timeout, 1 s, after the new leader
// is elected), the nodes took 0.7 to 1 s, and with the default 3 s lease
// fenced in most kills.
func TestLeaderKillNeverFences(t *testing.T) {
	j := startClusterJob(t, 6*time.Second)
	for i := 0; i < 20; i++ {
		old := j.c.Leader()
		killed := time.Now()
		old.Kill()
		j.c.Leader()
		elected := time.Since(killed)
		j.renewedSince(killed, fmt.Sprintf("both nodes' leases renewed after leader kill %d", i+1))
		renewed := time.Since(killed)
		t.Logf("kill %d: leader seen after %s, renewed after %s, slack %s", i+1, elected.Round(time.Millisecond), renewed.Round(time.Millisecond), j.slack().Round(time.Millisecond))
		if renewed-elected > reprovenWithin {
			t.Fatalf("leader kill %d: the leases were proven again %s after the new leader, want within %s", i+1, (renewed - elected).Round(time.Millisecond), reprovenWithin)
		}
		if f := j.fenced(); len(f) > 0 {
			t.Fatalf("leader kill %d (%s): nodes %v fenced", i+1, old.Name, f)
		}
		old.Restart()
		j.c.Settled()
	}
	if f := j.fenced(); len(f) > 0 {
		t.Fatalf("nodes %v fenced", f)
	}
	t.Logf("20 leader kills, no fence; least time left before a fence when a renewal came: %s", j.slack().Round(time.Millisecond))
}

// The defaults survive a leader change (issue 27): etcd's default
// election timeout (1 s) and the default lease (Config.LeaseTTL left
// zero), the leader SIGKILLed 10 times under a job: no node ever fences.
// With the former 3 s default, a node fenced when the election and the
// first answer after it took more than 1.75 s, as most kills did.
func TestLeaderKillNeverFencesWithDefaults(t *testing.T) {
	j := startClusterJob(t, 0)
	for _, n := range j.nodes {
		if n.ttl != DefaultLeaseTTL {
			t.Fatalf("node %s holds a %s lease, want the default %s", n.ID(), n.ttl, DefaultLeaseTTL)
		}
	}
	for i := 0; i < 10; i++ {
		old := j.c.Leader()
		killed := time.Now()
		old.Kill()
		j.renewedSince(killed, fmt.Sprintf("both nodes' leases renewed after leader kill %d", i+1))
		t.Logf("kill %d: renewed after %s, slack %s", i+1, time.Since(killed).Round(time.Millisecond), j.slack().Round(time.Millisecond))
		if f := j.fenced(); len(f) > 0 {
			t.Fatalf("leader kill %d (%s): nodes %v fenced", i+1, old.Name, f)
		}
		old.Restart()
		j.c.Settled()
	}
	if f := j.fenced(); len(f) > 0 {
		t.Fatalf("nodes %v fenced", f)
	}
	t.Logf("10 leader kills with the defaults, no fence; least time left before a fence when a renewal came: %s", j.slack().Round(time.Millisecond))
}

// The leadership moved 20 times (etcdctl move-leader's call) under a job:
// no node ever fences.
func TestLeaderMoveNeverFences(t *testing.T) {
	j := startClusterJob(t, leaderTestTTL, fastElection...)
	for i := 0; i < 20; i++ {
		fs := j.c.Followers()
		moved := time.Now()
		j.c.MoveLeader(fs[i%len(fs)])
		j.renewedSince(moved, fmt.Sprintf("both nodes' leases renewed after leader move %d", i+1))
		if f := j.fenced(); len(f) > 0 {
			t.Fatalf("leader move %d: nodes %v fenced", i+1, f)
		}
	}
	t.Logf("20 leader moves, no fence; least time left before a fence when a renewal came: %s", j.slack().Round(time.Millisecond))
}

// A node that no member answers (every member frozen: its connections
// stay open) still fences before its lease can expire: LeaseLost fires
// before the last proven expiry.
func TestEveryMemberSilentStillFences(t *testing.T) {
	j := startClusterJob(t, 3*time.Second)
	time.Sleep(time.Second) // a few renewals on the healthy cluster
	fencedAt := make([]chan time.Time, len(j.nodes))
	for i, n := range j.nodes {
		fencedAt[i] = make(chan time.Time, 1)
		go func() { <-n.LeaseLost(); fencedAt[i] <- time.Now() }()
	}
	for _, m := range j.c.Members {
		m.Pause()
	}
	paused := time.Now()
	defer func() {
		for _, m := range j.c.Members {
			m.Resume()
		}
	}()
	for i, n := range j.nodes {
		var lostAt time.Time
		select {
		case lostAt = <-fencedAt[i]:
		case <-time.After(10 * time.Second):
			t.Fatalf("node %s did not fence within 10 s of every member going silent", n.ID())
		}
		j.mu.Lock()
		r := j.lastFor[n.ID()]
		j.mu.Unlock()
		if !lostAt.Before(r.Expiry) {
			t.Errorf("node %s fenced at %s, not before its lease could expire (%s)", n.ID(), lostAt.Format("15:04:05.000"), r.Expiry.Format("15:04:05.000"))
		}
		t.Logf("node %s fenced %s after the members froze, %s before its lease could expire", n.ID(),
			lostAt.Sub(paused).Round(time.Millisecond), r.Expiry.Sub(lostAt).Round(time.Millisecond))
	}
}

func TestTransientErrors(t *testing.T) {
	for _, tc := range []struct {
		rule string
		err  error
		want bool
	}{
		{"the server's own deadline without quorum is retried", status.Error(codes.Unknown, context.DeadlineExceeded.Error()), true},
		{"so is it wrapped", fmt.Errorf("secretlease: grant a 3s lease: %w", status.Error(codes.Unknown, context.DeadlineExceeded.Error())), true},
		{"no leader is retried", status.Error(codes.Unavailable, "etcdserver: no leader"), true},
		{"the client's deadline is retried", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), true},
		{"another unknown error is not", status.Error(codes.Unknown, "something else"), false},
		{"permission denied is not", status.Error(codes.PermissionDenied, "etcdserver: permission denied"), false},
	} {
		if got := transient(tc.err); got != tc.want {
			t.Errorf("%s: transient(%v) = %v, want %v", tc.rule, tc.err, got, tc.want)
		}
	}
}

// A single etcd member that stops answering for a moment (a long fsync, a
// stalled host) is waited for: a node does not replace its keepalive
// stream before two keepalive intervals, since a new stream would go to
// the same member. A brief stall neither sends that member every lease's
// keepalive again (what turned a 10,000-node join's saturated etcd into a
// keepalive storm) nor logs a failure, and no node fences.
func TestOneMemberStalledBrieflyIsWaitedFor(t *testing.T) {
	j := startClusterJobOf(t, 1, 6*time.Second)
	m := j.c.Members[0]
	t0 := time.Now()
	m.Pause()
	// The stall: longer than a keepalive interval (1 s), so a keepalive
	// goes unanswered during it, shorter than two.
	time.Sleep(1500 * time.Millisecond)
	m.Resume()
	j.renewedSince(t0, "every lease proven again after the stall")
	if f := j.fenced(); len(f) > 0 {
		t.Fatalf("nodes %v fenced after a 1.5 s stall of a 6 s lease", f)
	}
	if logs := j.logs.String(); strings.Contains(logs, "lease keepalive failed") {
		t.Errorf("a node gave up on its keepalive stream during a 1.5 s stall of the only member:\n%s", logs)
	}
}

package elastic_test

import (
	"context"
	"encoding/json"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// frozenFor is how long the test freezes a node's hyperpodrun: issue 24's
// trial, far past the default lease.
const frozenFor = 30 * time.Second

// rejoinWithin bounds the time from SIGCONT to the job training at 3
// nodes again with the frozen node in it (2.9 s in the trials that
// rejoined; the failed one stayed out for 125 s and more).
const rejoinWithin = 20 * time.Second

// TestFrozenNodeRejoinsAtFullSize (issue 24, "the frozen-node rejoin"):
// the hyperpodrun of the node that closes a 3-node job's rounds (--nnodes
// 1:3, the coordinator's desired record asking for 3 nodes, Debian's etcd)
// is SIGSTOPped for 30 s, with the default lease. Its watchdog kills its workers before its lease can
// expire, the others go on at 2 nodes, and after SIGCONT the frozen node
// registers again and the job trains at 3 nodes within rejoinWithin.
func TestFrozenNodeRejoinsAtFullSize(t *testing.T) {
	// Debian's etcd (3.4), as the trial's fleet ran.
	etcd := startRestartableEtcd(t)
	endpoint := etcd.URL
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const job = "frozen"
	names := []string{"a", "b", "c"}
	// The coordinator's decision: 3 nodes, these three.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := fleet.New(cli, "")
	op, err := st.PutDesiredOp(fleet.Desired{Allocation: api.Allocation{Job: job, Size: 3, Nodes: names}, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Txn(ctx).Then(op).Commit(); err != nil {
		t.Fatal(err)
	}
	j := startShellJob(t, endpoint, job, "last_call_timeout=0.5", names, "LOGLEVEL=DEBUG")
	procs, starts, all := j.procs, j.starts, j.all
	atThree := func() (bool, string) {
		for _, n := range names {
			s := starts(n)
			if len(s) == 0 || s[len(s)-1] != "world=3" {
				return false, all()
			}
			if !j.stepsAt(n, "world=3") {
				return false, all()
			}
		}
		return true, all()
	}
	testutil.Eventually(t, 40*time.Second, "the job trains on 3 nodes", atThree)
	// Freeze the round's closer (the oldest node, the one that forms
	// rounds): its successor must take over and the frozen node must be
	// taken back as a new member.
	var head struct {
		Closer string `json:"closer"`
		Nodes  int    `json:"nodes"`
	}
	g, err := cli.Get(ctx, fleet.NewKeys(fleet.DefaultPrefix).Rdzv(job).Head)
	if err != nil || len(g.Kvs) == 0 {
		t.Fatalf("read the round record: %v", err)
	}
	if err := json.Unmarshal(g.Kvs[0].Value, &head); err != nil || procs[head.Closer] == nil {
		t.Fatalf("round record %s: closer %q: %v", g.Kvs[0].Value, head.Closer, err)
	}
	c := head.Closer
	other := names[0]
	if other == c {
		other = names[1]
	}
	before := len(starts(c))
	frozen := procs[c].Process
	if err := frozen.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(frozenFor) // the freeze itself, not a wait for a result
	if err := frozen.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	// The others went on without the frozen node meanwhile.
	if s := starts(other); s[len(s)-1] != "world=2" {
		t.Errorf("node %s's last start during the freeze of %s is %v, want world=2 (all: %s)", other, c, s, all())
	}
	testutil.Eventually(t, rejoinWithin, "the frozen node trains again, at 3 nodes", func() (bool, string) {
		if len(starts(c)) <= before {
			return false, all()
		}
		return atThree()
	})
	t.Logf("the job trains at 3 nodes again %s after SIGCONT of the closer %s (%s)", time.Since(resumed).Round(100*time.Millisecond), c, all())
}

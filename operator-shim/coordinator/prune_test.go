package coordinator

import (
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// Issue 27: the history's total bound is one range delete of the oldest
// events, not one delete per event; a job's own bound and a malformed
// event still go one by one. In etcd exactly the events the index keeps
// are left.
func TestHistoryBoundIsOneRangeDelete(t *testing.T) {
	cli, ctx := setup(t)
	k := fleet.NewKeys("")
	x := &eventIndex{keys: k, byJob: map[string][]evRec{}}
	t0 := time.Unix(1000, 0)
	var ops []clientv3.Op
	add := func(job string, i int) {
		key, e := x.record(policy.Reason{Job: job, Kind: policy.KindShrunk, FromSize: i + 2, ToSize: i + 1}, t0.Add(time.Duration(i)*time.Second), time.Hour)
		op, err := fleet.New(cli, "").PutEventAtOp(key, e)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	for i := range 40 {
		add(fmt.Sprintf("job-%d", i%4), i)
	}
	for i := 40; i < 46; i++ { // q's newest events: over its own bound of 4
		add("q", i)
	}
	bad := k.EventsPrefix() + "zz-not-an-event"
	ops = append(ops, clientv3.OpPut(bad, "{"))
	x.byJob[""] = []evRec{{key: bad, bad: true}}
	x.total++
	for len(ops) > 0 {
		n := min(len(ops), maxTxnOps)
		if _, err := cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			t.Fatal(err)
		}
		ops = ops[n:]
	}

	del := x.pruneKeys(4, 10, nil)
	units := x.pruneOps(del, nil)
	var n, ranges int
	for _, u := range units {
		for _, op := range u {
			n++
			if len(op.RangeBytes()) > 0 {
				ranges++
			}
		}
		if _, err := cli.Txn(ctx).Then(u...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	x.remove(del)
	// 47 events: q's own bound takes 2 of its 6, the total bound of 10
	// the malformed one and the jobs' oldest 34.
	if len(del) != 37 || x.total != 10 {
		t.Fatalf("pruned %d of 47 to %d, want 37 to 10", len(del), x.total)
	}
	// q's two are newer than the oldest kept (job-*'s 34th): one delete
	// each, as the malformed one.
	if ranges != 1 || n != 4 {
		t.Errorf("the prune of %d events is %d deletes (%d ranges), want one range, q's two and the malformed event's", len(del), n, ranges)
	}
	var want []string
	for _, evs := range x.byJob {
		for _, r := range evs {
			want = append(want, r.key)
		}
	}
	slices.Sort(want)
	r, err := cli.Get(ctx, k.EventsPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, kv := range r.Kvs {
		got = append(got, string(kv.Key))
	}
	if !slices.Equal(got, want) {
		t.Errorf("etcd holds the events\n%v\nthe index keeps\n%v", got, want)
	}
}

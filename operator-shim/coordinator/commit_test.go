package coordinator

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// A cycle's transactions go to etcd several at once, and every op is
// written; a job on more nodes than one transaction holds still has its
// desired record committed before any of its assignments (an agent
// reading its assignment finds the record that placed it).
func TestCommitWritesEverythingAndKeepsASplitJobInOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cli := etcdtest.Start(t)
	c := New(cli, Config{})
	st := c.store
	var units [][]clientv3.Op
	put := func(job string, nodes int) {
		d := fleet.Desired{Allocation: api.Allocation{Job: job, Team: "a", Size: nodes}, Generation: 1}
		op, err := st.PutDesiredOp(d)
		if err != nil {
			t.Fatal(err)
		}
		u := []clientv3.Op{op}
		for n := 0; n < nodes; n++ {
			op, err := st.PutAssignmentOp(fmt.Sprintf("n%03d", n), fleet.Desired{Allocation: api.Allocation{Job: job}, Generation: 1})
			if err != nil {
				t.Fatal(err)
			}
			u = append(u, op)
		}
		units = append(units, u)
	}
	total := 0
	for i := 0; i < 30; i++ {
		put(fmt.Sprintf("small%02d", i), 1+i%7)
		if i == 12 {
			put("big", 300) // 301 ops: three transactions
		}
	}
	for _, u := range units {
		total += len(u)
	}
	leader := clientv3.Compare(clientv3.CreateRevision("no-such-key"), "=", 0)
	n, err := c.commit(ctx, leader, units)
	if err != nil || n != total {
		t.Fatalf("commit wrote %d of %d ops: %v", n, total, err)
	}
	r, err := cli.Get(ctx, st.Keys.Root(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != int64(total) {
		t.Fatalf("etcd holds %d records, want %d (%v)", r.Count, total, err)
	}
	d, err := cli.Get(ctx, st.Keys.Desired("big"))
	if err != nil || len(d.Kvs) != 1 {
		t.Fatalf("big's desired record: %v %v", d, err)
	}
	for n := 0; n < 300; n++ {
		a, err := cli.Get(ctx, st.Keys.Assignment(fmt.Sprintf("n%03d", n), "big"))
		if err != nil || len(a.Kvs) != 1 {
			t.Fatalf("big's assignment on n%03d: %v %v", n, a, err)
		}
		if a.Kvs[0].ModRevision < d.Kvs[0].ModRevision {
			t.Fatalf("big's assignment on n%03d (revision %d) committed before its desired record (%d)", n, a.Kvs[0].ModRevision, d.Kvs[0].ModRevision)
		}
	}
	// Not the leader: nothing is written and the caller is told.
	if _, err := c.commit(ctx, clientv3.Compare(clientv3.CreateRevision(st.Keys.Desired("big")), "=", 0), units); err != errNotLeader {
		t.Errorf("commit as a deposed leader: %v, want errNotLeader", err)
	}
}

// The units that take nodes are sent only once every unit before them is
// written: when a release fails, no taking unit is written, even one that
// a transaction of its own would have carried at the same time.
func TestCommitSendsTheTakingUnitsOnlyAfterTheReleases(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cli := etcdtest.Start(t)
	c := New(cli, Config{})
	k := c.store.Keys
	unit := func(job string, n int) []clientv3.Op {
		var u []clientv3.Op
		for i := range n {
			u = append(u, clientv3.OpPut(k.Assignment(fmt.Sprintf("n%03d", i), job), "{}"))
		}
		return u
	}
	// The release fails: etcd refuses a transaction that names a key twice.
	release := append(unit("a", 100), clientv3.OpDelete(k.Assignment("n000", "a")))
	take := unit("b", 100)
	leader := clientv3.Compare(clientv3.CreateRevision("no-such-key"), "=", 0)
	if _, err := c.commit(ctx, leader, [][]clientv3.Op{release, take}, 1); err == nil {
		t.Fatal("commit of a failing release: no error")
	}
	r, err := cli.Get(ctx, k.Assignment("n000", "b"), clientv3.WithCountOnly())
	if err != nil || r.Count != 0 {
		t.Fatalf("b's assignment was written although the release before it failed (count %d, %v)", r.Count, err)
	}
}

package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// writer puts key/0, key/1, ... through cli, one at a time, each with a
// 2 s deadline, until stop is closed; it records which puts etcd
// acknowledged.
type writer struct {
	mu    sync.Mutex
	acked []string
	fails int
	errs  []error   // every failed put's error, in order
	last  time.Time // the last acknowledged put
}

func (w *writer) run(cli *clientv3.Client, prefix string, stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			key := fmt.Sprintf("%s/%06d", prefix, i)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := cli.Put(ctx, key, "v")
			cancel()
			w.mu.Lock()
			if err == nil {
				w.acked = append(w.acked, key)
				w.last = time.Now()
			} else {
				w.fails++
				w.errs = append(w.errs, err)
			}
			w.mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return done
}

func (w *writer) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// acksAfter waits until n more puts than now were acknowledged.
func (w *writer) acksAfter(t *testing.T, n int, what string) {
	t.Helper()
	from := w.count()
	testutil.Eventually(t, 20*time.Second, what, func() (bool, string) {
		c := w.count()
		return c >= from+n, fmt.Sprintf("%d puts acknowledged since", c-from)
	})
}

// everyAckedPutIsThere checks that no acknowledged put was lost.
func (w *writer) everyAckedPutIsThere(t *testing.T, cli *clientv3.Client, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, kv := range resp.Kvs {
		have[string(kv.Key)] = true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range w.acked {
		if !have[k] {
			t.Fatalf("put %s was acknowledged but is gone (%d acknowledged, %d keys)", k, len(w.acked), len(have))
		}
	}
}

func TestClusterKeepsWritingThroughLeaderKillAndMove(t *testing.T) {
	c := StartCluster(t, 3)
	cli := c.Client()
	var w writer
	stop := make(chan struct{})
	done := w.run(cli, "k", stop)
	var once sync.Once
	stopWriter := func() { once.Do(func() { close(stop); <-done }) }
	defer stopWriter()
	w.acksAfter(t, 20, "puts on the healthy cluster")

	// SIGKILL the leader: the others elect a new one and the client fails
	// over to them.
	old := c.Leader()
	pid := old.Pid()
	old.Kill()
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("killed leader %s (pid %d) still runs", old.Name, pid)
	}
	w.acksAfter(t, 20, "puts after the leader "+old.Name+" was SIGKILLed")
	if l := c.Leader(); l == old {
		t.Fatalf("the killed member %s is still the leader", old.Name)
	}
	old.Restart()
	w.acksAfter(t, 20, "puts after "+old.Name+" rejoined")

	// Move the leadership to each follower in turn.
	w.mu.Lock()
	killFails := w.fails
	w.mu.Unlock()
	for _, f := range c.Followers() {
		c.MoveLeader(f)
		w.acksAfter(t, 20, "puts after the leadership moved to "+f.Name)
	}
	stopWriter() // every acknowledged put is in w.acked before the check
	w.everyAckedPutIsThere(t, cli, "k")
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("%d puts acknowledged; failed: %d around the SIGKILL, %d around the moves", len(w.acked), killFails, w.fails-killFails)
	// A transfer is graceful: no put may time out or find no leader. etcd
	// does refuse the proposals in flight at the moment of the handover at
	// once, unapplied ("leader changed", or raft's "proposal dropped" while
	// the old leader hands over), which is what a client needs to retry, so
	// those are allowed.
	for _, err := range w.errs[killFails:] {
		if msg := err.Error(); !errors.Is(err, rpctypes.ErrLeaderChanged) && !strings.Contains(msg, "leader changed") && !strings.Contains(msg, "proposal dropped") {
			t.Errorf("a put failed while the leadership moved: %v (want none but an immediate refusal: a transfer is graceful)", err)
		}
	}
}

func TestClusterWritesFailWithoutQuorumAndResume(t *testing.T) {
	c := StartCluster(t, 3)
	cli := c.Client()
	put := func(key string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := cli.Put(ctx, key, "v")
		return err
	}
	if err := put("before"); err != nil {
		t.Fatal(err)
	}
	// Two of three down: no quorum.
	fs := c.Followers()
	for _, f := range fs {
		f.Stop()
	}
	start := time.Now()
	err := put("during")
	if err == nil {
		t.Fatal("a put without quorum was acknowledged")
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("a put without quorum took %s to fail, want its 2s deadline", el)
	}
	t.Logf("without quorum: %v after %s", err, time.Since(start).Round(time.Millisecond))

	// One member back: quorum again, writes resume.
	fs[0].Restart()
	testutil.Eventually(t, 30*time.Second, "a put once quorum is restored", func() (bool, string) {
		err := put("after")
		return err == nil, fmt.Sprint(err)
	})
	fs[1].Restart()
	c.Leader()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "before")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the put before the quorum loss: %v, %v", resp, err)
	}
}

func TestClusterCleansUpItsProcesses(t *testing.T) {
	var pids []int
	t.Run("cluster", func(t *testing.T) {
		c := StartCluster(t, 3)
		for _, m := range c.Members {
			pids = append(pids, m.Pid())
		}
	})
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("etcd member pid %d still runs after its test ended", pid)
		}
	}
	if len(pids) != 3 {
		t.Fatalf("%d members started, want 3", len(pids))
	}
}

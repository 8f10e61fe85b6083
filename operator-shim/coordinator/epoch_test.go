package coordinator

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/syncbuf"
)

// At its first election the coordinator writes the fleet's epoch; when
// the epoch is gone at a later one (etcd lost its data), it writes a new
// one, says so at error level and forgets the uids it gave the jobs of
// the lost data.
func TestCoordinatorNoticesALostEpoch(t *testing.T) {
	_, cli := etcdtest.Start(t)
	logs := &syncbuf.Buffer{}
	c := New(cli, Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.checkEtcd(ctx)
	first := c.etcdSeen.Epoch
	if first == "" {
		t.Fatalf("no epoch after the first election; log:\n%s", logs)
	}
	c.uids = map[string]uint32{"j": 200000}
	c.checkEtcd(ctx) // a second election, nothing lost
	if c.etcdSeen.Epoch != first || c.uids == nil || strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("a second election with the data kept: epoch %q (was %q), uids %v; log:\n%s", c.etcdSeen.Epoch, first, c.uids, logs)
	}
	if _, err := cli.Delete(ctx, c.store.Keys.Epoch()); err != nil {
		t.Fatal(err)
	}
	c.checkEtcd(ctx)
	if c.etcdSeen.Epoch == "" || c.etcdSeen.Epoch == first {
		t.Errorf("epoch after the loss %q, want a new one (was %q)", c.etcdSeen.Epoch, first)
	}
	if c.uids != nil {
		t.Errorf("the uids of the lost jobs are kept: %v", c.uids)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "etcd lost its data") || !strings.Contains(logs.String(), "rule=epoch-changed") {
		t.Errorf("no error naming the loss; log:\n%s", logs)
	}
}

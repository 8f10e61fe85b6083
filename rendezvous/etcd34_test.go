package rendezvous

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
)

// The rendezvous works against Debian's etcd 3.4 (a real external server
// and an older API level than the embedded 3.7).
func TestDebianEtcd34(t *testing.T) {
	t.Parallel()
	bin, ok := etcdtest.DebianEtcd()
	if !ok {
		t.Skipf("etcd binary %s not installed (Debian package etcd-server; CI installs it)", bin)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Skipf("%s --version: %v", bin, err)
	}
	t.Logf("%s", strings.SplitN(string(out), "\n", 2)[0])
	url := etcdtest.StartBinary(t, bin)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cli *clientv3.Client
	waitFor(t, 15*time.Second, "etcd "+url+" to answer", func() bool {
		c, err := NewClient([]string{strings.TrimPrefix(url, "http://")}, ClientOptions{DialTimeout: time.Second})
		if err != nil {
			return false
		}
		cli = c
		return true
	})
	defer cli.Close()
	h := newHarness(t)
	var nodes []*Node
	for _, id := range []string{"a", "b", "c"} {
		nodes = append(nodes, h.node(h.cfg(id, 2, 3), cli))
	}
	rs := mustJoinAll(t, ctx, nodes...)
	if rs[0].NumNodes != 3 {
		t.Fatalf("round: %+v", rs[0])
	}
	if _, err := nodes[0].ReportFailure(ctx, rs[0], "boom", ""); err != nil {
		t.Fatalf("report: %v", err)
	}
	rs = mustJoinAll(t, ctx, nodes...)
	if n, err := nodes[1].Restarts(ctx); err != nil || n != 1 {
		t.Fatalf("restarts after a failed round: %d %v", n, err)
	}
	if err := nodes[2].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	ch := nextAll(t, ctx, nodes[:2], rs[:2])
	if ch[0].Reason != MemberLost {
		t.Fatalf("change: %+v", ch[0])
	}
	rs = mustJoinAll(t, ctx, nodes[:2]...)
	if rs[0].NumNodes != 2 {
		t.Fatalf("round after leave: %+v", rs[0])
	}
}

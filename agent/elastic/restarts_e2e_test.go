package elastic_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMaxRestartsIsCountedForTheWholeJob: two nodes, --max-restarts 1;
// node 0's worker fails in the first round and node 1's in the second.
// The job-wide count (in etcd) stops both agents after the second failure
// (per-agent counts would allow a third round): each node starts its
// workers exactly twice, and both exit 1 naming the limit.
func TestMaxRestartsIsCountedForTheWholeJob(t *testing.T) {
	srv, _ := startEtcd(t)
	out := t.TempDir()
	w := filepath.Join(out, "w.sh")
	// Workers record their restart count under their agent's pid. Node
	// (group rank) 0 fails the first attempt, node 1 the second: each
	// agent sees one failure of its own, so only a job-wide count stops
	// the job after the second.
	os.WriteFile(w, []byte(`#!/bin/sh
echo "$TORCHELASTIC_RESTART_COUNT" >> "$OUT/starts.$PPID"
if [ "$GROUP_RANK" = "$TORCHELASTIC_RESTART_COUNT" ]; then sleep 0.3; exit 3; fi
exec sleep 30
`), 0o755)
	c := newCluster(t, []string{"OUT=" + out}, "--nnodes", "2:2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
		"--rdzv-endpoint", srv.Endpoints[0], "--rdzv-id", "always-fails", "--rdzv-conf", "last_call_timeout=0.5",
		"--max-restarts", "1", "--no-python", w)
	pids := map[string]int{}
	for _, n := range []string{"a", "b"} {
		c.start(n)
		pids[n] = c.PID(n)
	}
	for _, n := range []string{"a", "b"} {
		if code := c.wait(n, 60*time.Second); code != 1 {
			t.Errorf("node %s exited %d, want 1", n, code)
		}
	}
	for _, n := range []string{"a", "b"} {
		b, _ := os.ReadFile(filepath.Join(out, "starts."+strconv.Itoa(pids[n])))
		if got := strings.Join(strings.Fields(string(b)), ","); got != "0,1" {
			t.Errorf("node %s started its workers with restart counts [%s], want [0,1]: one restart for the whole job", n, got)
		}
	}
	for name, l := range c.Logs() {
		if !strings.Contains(l, "exceed --max-restarts 1 (counted for the whole job)") {
			t.Errorf("node %s does not say the job exceeded --max-restarts:\n%s", name, l)
		}
	}
}

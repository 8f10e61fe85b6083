package launcher

import (
	"io"
	"syscall"
	"testing"
	"time"
)

// Reassign (issue 14's in-process resize) gives running workers a new
// assignment: each live worker's torchrun environment under it, plus the
// assignment's extra variables; failure summaries then name the new ranks.
// Once a worker exited the group cannot be carried over whole.
func TestReassignGivesLiveWorkersTheirNewEnvironment(t *testing.T) {
	spec := Spec{Entrypoint: "/bin/sh", Args: []string{"-c", `[ "$LOCAL_RANK" = 1 ] && exit 3; exec sleep 30`}, NoPython: true,
		NProcPerNode: 2, RunID: "r", Stdout: io.Discard, Stderr: io.Discard}
	g, err := Start(spec, Assignment{GroupRank: 1, GroupWorldSize: 3, BaseRank: 2, WorldSize: 6, MasterAddr: "h0", MasterPort: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop(syscall.SIGKILL, 0)
	select {
	case <-g.Failed():
	case <-time.After(20 * time.Second):
		t.Fatal("local rank 1 did not fail")
	}
	a := Assignment{GroupRank: 0, GroupWorldSize: 2, BaseRank: 0, WorldSize: 4, MasterAddr: "h1", MasterPort: 2,
		Env: map[string]string{"HYPERPODRUN_ROUND": "9"}}
	out, ok := g.Reassign(a)
	if ok {
		t.Error("Reassign says the group is whole although local rank 1 exited")
	}
	if len(out) != 1 || out[0].LocalRank != 0 || out[0].Rank != 0 {
		t.Fatalf("reassigned %+v, want local rank 0 only, as rank 0", out)
	}
	env := out[0].Env
	for k, v := range map[string]string{"RANK": "0", "WORLD_SIZE": "4", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2",
		"MASTER_ADDR": "h1", "MASTER_PORT": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0", "HYPERPODRUN_ROUND": "9"} {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}
	if pids := g.PIDs(); len(pids) != 1 || pids[0] != out[0].PID {
		t.Errorf("PIDs %v, want the live worker %d", pids, out[0].PID)
	}
}

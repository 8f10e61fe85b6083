package launcher

import (
	"io"
	"os"
	"strconv"
	"strings"
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

// A prewarmed start (issue 14: a joining node's workers start before the
// node registers) gives the workers no rank: none of the round's variables,
// not even one inherited from hyperpodrun's own environment; only their
// local rank. Reassign then gives them the round's, as to any kept worker.
func TestPrewarmedWorkersHoldNoRankUntilReassigned(t *testing.T) {
	t.Setenv("RANK", "7") // inherited: must not reach a prewarmed worker
	t.Setenv("MASTER_PORT", "1234")
	out := t.TempDir() + "/env"
	spec := Spec{Entrypoint: "/bin/sh", Args: []string{"-c", `env > ` + out + `.$LOCAL_RANK.tmp && mv ` + out + `.$LOCAL_RANK.tmp ` + out + `.$LOCAL_RANK; exec sleep 30`},
		NoPython: true, NProcPerNode: 2, RunID: "r", Stdout: io.Discard, Stderr: io.Discard}
	g, err := Start(spec, Assignment{Prewarm: true, Env: map[string]string{"HYPERPODRUN_PREWARM": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop(syscall.SIGKILL, 0)
	for lr := 0; lr < 2; lr++ {
		env := waitEnvFile(t, out+"."+strconv.Itoa(lr))
		for _, k := range RoundEnv {
			if v, ok := env[k]; ok {
				t.Errorf("prewarmed local rank %d has %s=%q; it must hold no rank before its assignment", lr, k, v)
			}
		}
		if env["LOCAL_RANK"] != strconv.Itoa(lr) || env["LOCAL_WORLD_SIZE"] != "2" || env["HYPERPODRUN_PREWARM"] != "1" {
			t.Errorf("prewarmed local rank %d: LOCAL_RANK=%q LOCAL_WORLD_SIZE=%q HYPERPODRUN_PREWARM=%q", lr, env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["HYPERPODRUN_PREWARM"])
		}
	}
	got, ok := g.Reassign(Assignment{GroupRank: 1, GroupWorldSize: 2, BaseRank: 2, WorldSize: 4, MasterAddr: "h0", MasterPort: 5})
	if !ok || len(got) != 2 {
		t.Fatalf("Reassign of the prewarmed group: %+v ok=%v", got, ok)
	}
	for _, w := range got {
		if w.Rank != 2+w.LocalRank || w.Env["RANK"] != strconv.Itoa(2+w.LocalRank) || w.Env["WORLD_SIZE"] != "4" || w.Env["MASTER_PORT"] != "5" {
			t.Errorf("reassigned %+v", w)
		}
	}
}

// waitEnvFile reads an `env` dump once the worker wrote it whole.
func waitEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		data, err := os.ReadFile(path)
		if err == nil {
			return envMap(strings.Split(strings.TrimSpace(string(data)), "\n"))
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker did not write %s: %v", path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

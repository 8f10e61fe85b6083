package c10dstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests run real torch clients (Debian's python3-torch, 1.13) against
// the Go server. They are skipped when no Python with torch.distributed is
// found: C10DSTORE_TEST_PYTHON names the interpreter (default
// /usr/bin/python3, Debian's, as python3 on PATH may lack torch).

var torchPython struct {
	once sync.Once
	path string
	why  string
}

func needTorch(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("torch tests skipped in -short mode")
	}
	torchPython.once.Do(func() {
		py := os.Getenv("C10DSTORE_TEST_PYTHON")
		if py == "" {
			py = "/usr/bin/python3"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, py, "-c",
			"import torch, torch.distributed as d; assert d.is_available(); print(torch.__version__)").CombinedOutput()
		if err != nil {
			torchPython.why = fmt.Sprintf("no torch.distributed in %s (set C10DSTORE_TEST_PYTHON): %v: %s",
				py, err, lastLine(out))
			return
		}
		torchPython.path = py
		torchPython.why = strings.TrimSpace(string(out))
	})
	if torchPython.path == "" {
		t.Skip(torchPython.why)
	}
	t.Logf("torch %s (%s)", torchPython.why, torchPython.path)
	return torchPython.path
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// runRanks starts one Python process per rank with args(rank), waits for all
// of them, and decodes the JSON line each prints into out[rank].
func runRanks[T any](t *testing.T, py string, world int, args func(rank int) []string) []T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type result struct {
		stdout, stderr bytes.Buffer
		err            error
	}
	results := make([]*result, world)
	var wg sync.WaitGroup
	for rank := range world {
		r := &result{}
		results[rank] = r
		cmd := exec.CommandContext(ctx, py, args(rank)...)
		cmd.Env = append(os.Environ(), "GLOO_SOCKET_IFNAME=lo", "OMP_NUM_THREADS=1", "PYTHONUNBUFFERED=1")
		cmd.Stdout, cmd.Stderr = &r.stdout, &r.stderr
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.err = cmd.Wait()
		}()
	}
	wg.Wait()
	out := make([]T, world)
	for rank, r := range results {
		if r.err != nil {
			t.Fatalf("rank %d: %v\nstdout: %s\nstderr: %s", rank, r.err, r.stdout.String(), r.stderr.String())
		}
		if err := json.Unmarshal([]byte(lastLine(r.stdout.Bytes())), &out[rank]); err != nil {
			t.Fatalf("rank %d: output %q: %v\nstderr: %s", rank, r.stdout.String(), err, r.stderr.String())
		}
	}
	return out
}

type storeClientReport struct {
	Rank           int      `json:"rank"`
	Counter        int      `json:"counter"`
	Values         []string `json:"values"`
	Leader         string   `json:"leader"`
	LeaderCASWrong string   `json:"leader_cas_wrong"`
	DeleteFirst    bool     `json:"delete_first"`
	DeleteAgain    bool     `json:"delete_again"`
	WaitTimeout    string   `json:"wait_timeout"`
	AfterTimeout   string   `json:"after_timeout"`
	NumKeys        int64    `json:"num_keys"`
}

// TestTorchStoreClients: several torch 1.13 TCPStore clients (separate
// processes) use set/get/add/wait (with a timeout)/compare_set/check/
// num_keys/delete_key on the Go store at once (check is not exposed to
// Python in 1.13).
func TestTorchStoreClients(t *testing.T) {
	py := needTorch(t)
	s := startServer(t, Options{})
	const world = 3
	port := strconv.Itoa(s.Port())
	reports := runRanks[storeClientReport](t, py, world, func(rank int) []string {
		return []string{"testdata/torch_store_client.py", "127.0.0.1", port, strconv.Itoa(rank), strconv.Itoa(world)}
	})

	wantValues := []string{"hello0", "hello1", "hello2"}
	leader, _ := s.Get("/leader")
	counters := map[int]bool{}
	for _, r := range reports {
		if !reflect.DeepEqual(r.Values, wantValues) {
			t.Errorf("rank %d read %q", r.Rank, r.Values)
		}
		counters[r.Counter] = true
		if r.Leader != string(leader) || r.LeaderCASWrong != string(leader) {
			t.Errorf("rank %d saw leader %q / %q, store holds %q", r.Rank, r.Leader, r.LeaderCASWrong, leader)
		}
		if !r.DeleteFirst || r.DeleteAgain {
			t.Errorf("rank %d: delete_key first=%v again=%v", r.Rank, r.DeleteFirst, r.DeleteAgain)
		}
		if !strings.Contains(r.WaitTimeout, "Timeout") {
			t.Errorf("rank %d: wait on a missing key: %q, want a timeout error", r.Rank, r.WaitTimeout)
		}
		if r.AfterTimeout != wantValues[r.Rank] {
			t.Errorf("rank %d: get after the timed-out wait = %q", r.Rank, r.AfterTimeout)
		}
		// init/, rank0..2, counter, leader, arrived, all_arrived
		if r.NumKeys != 8 {
			t.Errorf("rank %d: num_keys = %d, want 8", r.Rank, r.NumKeys)
		}
	}
	if len(counters) != world {
		t.Errorf("add results %v: each rank should see a distinct count", counters)
	}
	if l := string(leader); l != "r0" && l != "r1" && l != "r2" {
		t.Errorf("leader = %q", l)
	}
	for key, want := range map[string]string{"init/": "3", "/counter": "3", "/arrived": "3", "/rank1": "hello1"} {
		if v, ok := s.Get(key); !ok || string(v) != want {
			t.Errorf("store %s = %q %v, want %q", key, v, ok, want)
		}
	}
}

type allReduceReport struct {
	Rank     int       `json:"rank"`
	Sum      []float64 `json:"sum"`
	Gathered []int     `json:"gathered"`
}

// TestTorchGlooAllReduce: torch 1.13 workers form a gloo process group
// through the Go store and all_reduce, both with an explicit TCPStore and
// with env:// + TORCHELASTIC_USE_AGENT_STORE (the agent-hosted store).
func TestTorchGlooAllReduce(t *testing.T) {
	py := needTorch(t)
	for _, tc := range []struct {
		mode  string
		world int
	}{{"store", 2}, {"env", 3}} {
		t.Run(tc.mode, func(t *testing.T) {
			s := startServer(t, Options{})
			port := strconv.Itoa(s.Port())
			reports := runRanks[allReduceReport](t, py, tc.world, func(rank int) []string {
				return []string{"testdata/torch_gloo_allreduce.py", tc.mode, "127.0.0.1", port,
					strconv.Itoa(rank), strconv.Itoa(tc.world)}
			})
			wantSum := []float64{float64(tc.world * (tc.world + 1) / 2), float64(tc.world)}
			wantGathered := make([]int, tc.world)
			for i := range wantGathered {
				wantGathered[i] = i
			}
			for _, r := range reports {
				if !reflect.DeepEqual(r.Sum, wantSum) || !reflect.DeepEqual(r.Gathered, wantGathered) {
					t.Errorf("rank %d: all_reduce %v (want %v), all_gather_object %v", r.Rank, r.Sum, wantSum, r.Gathered)
				}
			}
			if tc.mode == "env" {
				// torch's agent-store path keys everything under the attempt
				// (PrefixStore "/worker/attempt_0", and TCPStore's own "/").
				if n := s.NumKeys(); n < 2 {
					t.Errorf("only %d keys in the store", n)
				}
				found := false
				for k := range s.keys() {
					if strings.HasPrefix(k, "//worker/attempt_0/default_pg/") {
						found = true
					}
				}
				if !found {
					t.Errorf("no //worker/attempt_0/default_pg/ keys: %v", s.keys())
				}
			}
		})
	}
}

func (s *Server) keys() map[string]bool {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	m := make(map[string]bool, len(s.st.data))
	for k := range s.st.data {
		m[k] = true
	}
	return m
}

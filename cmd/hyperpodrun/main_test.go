package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/launcher"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hyperpodrun-test-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "hyperpodrun")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build hyperpodrun: %v\n%s", err, out)
		os.Exit(1)
	}
	// The c10d backend's host program lives next to hyperpodrun.
	out, err = exec.Command("go", "build", "-o", filepath.Join(dir, "hyperpodrun-rdzv-host"), "../hyperpodrun-rdzv-host").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build hyperpodrun-rdzv-host: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result of one hyperpodrun run.
type result struct {
	code           int
	stdout, stderr string
}

func hpr(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run hyperpodrun: %v", err)
	}
	return result{code, so.String(), se.String()}
}

// script writes an executable shell script and returns its path.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "worker.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			env[k] = v
		}
	}
	return env
}

func TestWorkerEnvironmentMatchesTorchrun(t *testing.T) {
	out := t.TempDir()
	w := script(t, `env > "$OUT/env.$RANK"`)
	logs := t.TempDir()
	// Node 1 of a 2-node static job with 2 workers per node: ranks 2 and 3.
	r := hpr(t, []string{"OUT=" + out, "OMP_NUM_THREADS="}, "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
		"--master-addr", "10.1.2.3", "--master-port", "23456", "--rdzv-id", "job7", "--max-restarts", "3",
		"--log-dir", logs, "--role", "trainer", "--no-python", w)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	for lr := 0; lr < 2; lr++ {
		rank := 2 + lr
		env := readEnvFile(t, filepath.Join(out, "env."+strconv.Itoa(rank)))
		want := map[string]string{
			"RANK": strconv.Itoa(rank), "LOCAL_RANK": strconv.Itoa(lr), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
			"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": strconv.Itoa(rank), "ROLE_WORLD_SIZE": "4",
			"ROLE_NAME": "trainer", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "23456",
			"TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "job7",
			"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_ASYNC_ERROR_HANDLING": "1", // issue 25: torchrun's static agent store
			"TORCHELASTIC_ERROR_FILE": filepath.Join(runLogDir(t, logs, "job7"), "attempt_0", strconv.Itoa(lr), "error.json"),
			"OUT":                     out, // the inherited environment is kept
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("rank %d: %s=%q, want %q", rank, k, env[k], v)
			}
		}
		// OMP_NUM_THREADS was set (empty) by the user: torchrun leaves it.
		if env["OMP_NUM_THREADS"] != "" {
			t.Errorf("OMP_NUM_THREADS=%q, want the user's empty value kept", env["OMP_NUM_THREADS"])
		}
	}
}

func TestOMPNumThreadsDefaultsToOneWhenUnsetAndSeveralWorkers(t *testing.T) {
	out := t.TempDir()
	w := script(t, `echo "${OMP_NUM_THREADS-unset}" > "$OUT/omp.$RANK"`)
	env := []string{"OUT=" + out}
	os.Unsetenv("OMP_NUM_THREADS")
	for _, tc := range []struct{ nproc, want string }{{"2", "1"}, {"1", "unset"}} {
		if r := hpr(t, env, "--standalone", "--nproc-per-node", tc.nproc, "--no-python", w); r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		b, _ := os.ReadFile(filepath.Join(out, "omp.0"))
		if got := strings.TrimSpace(string(b)); got != tc.want {
			t.Errorf("nproc %s: OMP_NUM_THREADS=%q, want %q", tc.nproc, got, tc.want)
		}
	}
}

func TestStandaloneSetsRandomRunIDAndFreePort(t *testing.T) {
	out := t.TempDir()
	w := script(t, `env > "$OUT/env.$RANK"`)
	if r := hpr(t, []string{"OUT=" + out}, "--standalone", "--nproc-per-node", "1", "--no-python", w); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	env := readEnvFile(t, filepath.Join(out, "env.0"))
	if !regexp.MustCompile(`^[0-9a-f-]{36}$`).MatchString(env["TORCHELASTIC_RUN_ID"]) {
		t.Errorf("run id %q is not a uuid", env["TORCHELASTIC_RUN_ID"])
	}
	if env["MASTER_PORT"] == "29500" || env["MASTER_PORT"] == "" {
		t.Errorf("standalone MASTER_PORT=%q, want a free port", env["MASTER_PORT"])
	}
}

func TestPETEnvironmentDefaultsAndUnderscoreSpelling(t *testing.T) {
	out := t.TempDir()
	w := script(t, `env > "$OUT/env.$RANK"`)
	r := hpr(t, []string{"OUT=" + out, "PET_NPROC_PER_NODE=3", "PET_MASTER_PORT=31000"},
		"--rdzv_id=abc", "--no_python", w)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	env := readEnvFile(t, filepath.Join(out, "env.2"))
	if env["WORLD_SIZE"] != "3" || env["MASTER_PORT"] != "31000" || env["TORCHELASTIC_RUN_ID"] != "abc" {
		t.Errorf("PET_* / underscore flags not honoured: WORLD_SIZE=%s MASTER_PORT=%s RUN_ID=%s",
			env["WORLD_SIZE"], env["MASTER_PORT"], env["TORCHELASTIC_RUN_ID"])
	}
}

func TestScriptArgumentsPassedUntouched(t *testing.T) {
	out := t.TempDir()
	w := script(t, `printf '%s|' "$@" > "$OUT/args"`)
	r := hpr(t, []string{"OUT=" + out}, "--no-python", w, "--nproc-per-node", "7", "-m", "x y", "--")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	b, _ := os.ReadFile(filepath.Join(out, "args"))
	if string(b) != "--nproc-per-node|7|-m|x y|--|" {
		t.Errorf("script got args %q", b)
	}
}

func TestBadInputExitsTwoWithClearMessage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nnodes", "3:2", "x.py"}, "maximum 2 is below the minimum 3"},
		{[]string{"--redirects", "0:9", "x.py"}, "not a stream selection"},
		{[]string{"--nproc-per-node", "zero", "x.py"}, "--nproc-per-node"},
		{[]string{"--no-such-flag", "x.py"}, "unknown option --no-such-flag"},
		{[]string{"--rdzv-backend", "zookeeper", "x.py"}, "choose static, etcd, c10d or hyperpod"},
		{[]string{"--logs-specs", "my_pkg:MySpecs", "x.py"}, "cannot load a custom torchrun.logs_specs entry point"},
		{[]string{"--numa-binding", "rack", "x.py"}, "choose node, socket, exclusive or core-complex"},
		{[]string{"--signals-to-handle", "SIGTERM,SIGKILL", "x.py"}, "SIGKILL cannot be caught"},
		{[]string{"--event-log-handler", "kafka", "x.py"}, "choose null or console"},
		{[]string{"--rdzv-backend", "hyperpod", "--nnodes", "2", "x.py"}, "give --rdzv-endpoint"},
		{[]string{"--server-log-level", "loud", "x.py"}, "--server-log-level"},
		{[]string{"--nnodes", "2"}, "missing the training script"},
		{[]string{"--shutdown-signal", "SIGNOPE", "x.py"}, "not a signal"},
		{[]string{"--rdzv-backend", "etcd", "--rdzv-endpoint", "@/nonexistent/endpoint", "x.py"}, "--rdzv-endpoint @/nonexistent/endpoint: open /nonexistent/endpoint: no such file"},
		{[]string{"--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-conf", "@/nonexistent/conf", "x.py"}, "--rdzv-conf @/nonexistent/conf"},
	} {
		r := hpr(t, nil, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

func TestConsolePrefixRedirectsTeeAndLogLayout(t *testing.T) {
	logs := t.TempDir()
	w := script(t, `echo "out-$LOCAL_RANK"; echo "err-$LOCAL_RANK" >&2`)
	// rank 0: stdout to file only; rank 1: stderr teed; rank 2: console only.
	r := hpr(t, nil, "--nproc-per-node", "3", "--rdzv-id", "logs", "--log-dir", logs,
		"--redirects", "0:1", "--tee", "1:2", "--no-python", w)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	first := runLogDir(t, logs, "logs")
	att := filepath.Join(first, "attempt_0")
	read := func(p string) string { b, _ := os.ReadFile(filepath.Join(att, p)); return string(b) }
	if got := read("0/stdout.log"); got != "out-0\n" {
		t.Errorf("rank 0 stdout.log = %q", got)
	}
	if strings.Contains(r.stdout, "out-0") {
		t.Errorf("redirected stdout of rank 0 reached the console: %q", r.stdout)
	}
	if got := read("1/stderr.log"); got != "err-1\n" {
		t.Errorf("rank 1 stderr.log = %q", got)
	}
	// As torchrun: only teed lines are prefixed; the rest is the worker's
	// own output, unprefixed.
	console := r.stdout + r.stderr
	for _, want := range []string{"[default1]:err-1\n", "\nerr-0\n", "\nout-2\n", "\nout-1\n"} {
		if !strings.Contains("\n"+console, want) {
			t.Errorf("console lacks %q:\nstdout=%q\nstderr=%q", want, r.stdout, r.stderr)
		}
	}
	if strings.Contains(console, "[default0]") || strings.Contains(console, "[default2]") || strings.Contains(console, "[default1]:out") {
		t.Errorf("a line that was not teed is prefixed:\nstdout=%q\nstderr=%q", r.stdout, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(att, "2", "stdout.log")); err == nil {
		t.Error("rank 2 has a stdout.log though it was neither redirected nor teed")
	}
	// A second run with the same id never reuses (and never mixes up) old logs.
	if r := hpr(t, nil, "--rdzv-id", "logs", "--log-dir", logs, "--redirects", "1", "--no-python", w); r.code != 0 {
		t.Fatal(r.stderr)
	}
	second := ""
	for _, d := range runLogDirs(t, logs, "logs") {
		if d != first {
			second = d
		}
	}
	if b, err := os.ReadFile(filepath.Join(second, "attempt_0", "0", "stdout.log")); err != nil || string(b) != "out-0\n" {
		t.Errorf("second run's log: %q %v", b, err)
	}
}

func TestLocalRanksFilter(t *testing.T) {
	w := script(t, `echo "hello-$LOCAL_RANK"`)
	r := hpr(t, nil, "--nproc-per-node", "3", "--local-ranks-filter", "1", "--tee", "3", "--no-python", w)
	if r.code != 0 || !strings.Contains(r.stdout, "[default1]:hello-1") || strings.Contains(r.stdout, "hello-0") || strings.Contains(r.stdout, "hello-2") {
		t.Errorf("exit %d, stdout %q: want only local rank 1", r.code, r.stdout)
	}
	r = hpr(t, nil, "--nproc-per-node", "3", "--local-ranks-filter", "1", "--no-python", w)
	if r.code != 0 || r.stdout != "hello-1\n" {
		t.Errorf("without --tee: exit %d, stdout %q: want only local rank 1, unprefixed", r.code, r.stdout)
	}
}

// errorJSON is what torch's @record writes.
func errorJSON(msg string, ts int64) string {
	return fmt.Sprintf(`{"message": {"message": %q, "extraInfo": {"py_callstack": "Traceback (most recent call last):\\n  %s", "timestamp": "%d"}}}`, msg, msg, ts)
}

func TestRootCauseFromErrorFileAndOthersStopped(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "first.json"), []byte(errorJSON("ValueError: first", 1900000000)), 0o644)
	// Rank 1 fails with an error file; rank 0 would run forever and must be
	// stopped, not reported as a failure.
	w := script(t, `if [ "$LOCAL_RANK" = 0 ]; then echo $$ > "$D/pid0"; exec sleep 600; fi
while [ ! -s "$D/pid0" ]; do sleep 0.01; done
cp "$D/first.json" "$TORCHELASTIC_ERROR_FILE"; exit 5`)
	r := hpr(t, []string{"D=" + dir}, "--nproc-per-node", "2", "--shutdown-timeout", "5", "--no-python", w)
	if r.code != 1 {
		t.Fatalf("exit %d, want 1 (torchrun's for failed workers)\n%s", r.code, r.stderr)
	}
	root := r.stderr[strings.Index(r.stderr, "Root Cause"):]
	for _, want := range []string{"rank      : 1 (local_rank: 1)", "exitcode  : 5", "ValueError: first", "error.json", "time      : 2030-03-17"} {
		if !strings.Contains(root, want) {
			t.Errorf("root cause lacks %q:\n%s", want, root)
		}
	}
	if !strings.Contains(r.stderr, "<NO_OTHER_FAILURES>") {
		t.Errorf("the stopped rank 0 was reported as a failure:\n%s", r.stderr)
	}
	if pid := readPIDs(t, dir, "pid0"); len(pid) != 1 || alive(pid[0]) {
		t.Errorf("rank 0 (%v) not stopped", pid)
	}
}

func TestRootCauseFromTorchRecord(t *testing.T) {
	py := torchPython(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "fail.py")
	os.WriteFile(p, []byte(`
import os
from torch.distributed.elastic.multiprocessing.errors import record
@record
def main():
    if os.environ["LOCAL_RANK"] == "1":
        raise RuntimeError("boom in rank one")
main()
`), 0o644)
	r := hpr(t, []string{"PYTHON_EXEC=" + py}, "--nproc-per-node", "2", p)
	if r.code != 1 || !strings.Contains(r.stderr, "RuntimeError: boom in rank one") || !strings.Contains(r.stderr, "rank      : 1 (local_rank: 1)") {
		t.Errorf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
}

func TestSignalReportedWithName(t *testing.T) {
	w := script(t, `kill -9 $$`)
	r := hpr(t, nil, "--no-python", w)
	if r.code != 1 || !strings.Contains(r.stderr, "exitcode  : -9") || !strings.Contains(r.stderr, "Signal 9 (SIGKILL)") {
		t.Errorf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
}

func TestRestartsAllWorkersWithRestartCount(t *testing.T) {
	out := t.TempDir()
	// Local rank 1 fails on the first two attempts, once local rank 0 has
	// recorded that attempt (else a loaded machine may kill rank 0 before
	// its shell got to the echo: that is not what this test is about).
	w := script(t, `echo "$TORCHELASTIC_RESTART_COUNT" >> "$OUT/attempts.$LOCAL_RANK"
if [ "$LOCAL_RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" -lt 2 ]; then
  i=0
  while ! grep -qx "$TORCHELASTIC_RESTART_COUNT" "$OUT/attempts.0" 2>/dev/null && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done
  exit 1
fi
sleep 0.2`)
	r := hpr(t, []string{"OUT=" + out}, "--nproc-per-node", "2", "--max-restarts", "2", "--no-python", w)
	if r.code != 0 {
		t.Fatalf("exit %d, want success on the third attempt:\n%s", r.code, r.stderr)
	}
	for lr := 0; lr < 2; lr++ {
		b, _ := os.ReadFile(filepath.Join(out, "attempts."+strconv.Itoa(lr)))
		if got := strings.Fields(string(b)); strings.Join(got, ",") != "0,1,2" {
			t.Errorf("local rank %d saw restart counts %v, want 0,1,2 (all workers restart)", lr, got)
		}
	}
	r = hpr(t, []string{"OUT=" + t.TempDir()}, "--nproc-per-node", "2", "--max-restarts", "1", "--no-python", w)
	if r.code != 1 || !strings.Contains(r.stderr, "FAILED") || !strings.Contains(r.stderr, "1 restart(s) used") {
		t.Errorf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
}

// startHPR starts hyperpodrun in the background.
func startHPR(t *testing.T, env []string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, &buf
}

func readPIDs(t *testing.T, dir, pattern string) []int {
	files, _ := filepath.Glob(filepath.Join(dir, pattern))
	var pids []int
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(s); err == nil {
				pids = append(pids, p)
			}
		}
	}
	return pids
}

func TestSignalForwardedAndEscalatedToSIGKILL(t *testing.T) {
	out := t.TempDir()
	// Rank 0 exits on SIGTERM (recording it); rank 1 ignores SIGTERM.
	w := script(t, `if [ "$LOCAL_RANK" = 0 ]; then trap 'echo term > "$OUT/got.0"; exit 0' TERM; else trap '' TERM; fi
echo $$ > "$OUT/pid.$LOCAL_RANK"
while true; do sleep 0.05; done`)
	cmd, buf := startHPR(t, []string{"OUT=" + out}, "--nproc-per-node", "2", "--shutdown-timeout", "1", "--no-python", w)
	waitFor(t, 10*time.Second, "both workers up", func() bool { return len(readPIDs(t, out, "pid.*")) == 2 })
	pids := readPIDs(t, out, "pid.*")
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	elapsed := time.Since(start)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Errorf("exit: %v, want code 1\n%s", err, buf)
	}
	if _, err := os.Stat(filepath.Join(out, "got.0")); err != nil {
		t.Errorf("rank 0 never received the forwarded SIGTERM\n%s", buf)
	}
	if elapsed < 900*time.Millisecond {
		t.Errorf("hyperpodrun exited after %s: it did not wait --shutdown-timeout for the worker ignoring SIGTERM", elapsed)
	}
	for _, p := range pids {
		if alive(p) {
			t.Errorf("worker pid %d survived shutdown", p)
		}
	}
}

func TestNoOrphanSurvives(t *testing.T) {
	out := t.TempDir()
	// Each worker leaves a grandchild in its own session (escapes the
	// process group) and a plain background child, then succeeds.
	w := script(t, `setsid sh -c 'echo $$ >> "$OUT/orphans"; exec sleep 600' &
sleep 600 & echo $! >> "$OUT/orphans"
while [ "$(wc -l < "$OUT/orphans")" -lt $((2 * LOCAL_WORLD_SIZE)) ]; do sleep 0.01; done
exit 0`)
	r := hpr(t, []string{"OUT=" + out}, "--nproc-per-node", "2", "--no-python", w)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	pids := readPIDs(t, out, "orphans")
	if len(pids) != 4 {
		t.Fatalf("want 4 recorded descendants, got %v", pids)
	}
	for _, p := range pids {
		if alive(p) {
			t.Errorf("descendant %d outlived hyperpodrun", p)
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

func TestReapsOrphansWhileRunning(t *testing.T) {
	out := t.TempDir()
	// The worker's child forks a grandchild that exits at once: re-parented
	// to hyperpodrun (subreaper), it must be reaped, not left a zombie.
	w := script(t, `sh -c 'sh -c "echo \$\$ > $OUT/gc; exit 0" & exit 0'
echo $$ > "$OUT/worker"; while [ ! -f "$OUT/stop" ]; do sleep 0.02; done`)
	cmd, buf := startHPR(t, []string{"OUT=" + out}, "--no-python", w)
	waitFor(t, 10*time.Second, "grandchild pid", func() bool { return len(readPIDs(t, out, "gc")) == 1 && len(readPIDs(t, out, "worker")) == 1 })
	gc := readPIDs(t, out, "gc")[0]
	waitFor(t, 10*time.Second, "grandchild reaped", func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", gc))
		return os.IsNotExist(err)
	})
	os.WriteFile(filepath.Join(out, "stop"), nil, 0o644)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v\n%s", err, buf)
	}
}

func TestRunsAsPID1InContainer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a PID namespace")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("unshare not installed")
	}
	out := t.TempDir()
	w := script(t, `echo "$PPID" > "$OUT/ppid"; sh -c 'sh -c "exit 0" & exit 0'; sleep 0.1; ps -o stat= -p 1 > /dev/null; grep -l '^State:.*Z' /proc/[0-9]*/status > "$OUT/zombies" 2>/dev/null; true`)
	cmd := exec.Command(unshare, "--pid", "--fork", "--mount-proc", binary, "--no-python", w)
	cmd.Env = append(os.Environ(), "OUT="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hyperpodrun as PID 1: %v\n%s", err, b)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "ppid")); strings.TrimSpace(string(b)) != "1" {
		t.Fatalf("worker's parent is %q, want hyperpodrun as PID 1", b)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "zombies")); len(bytes.TrimSpace(b)) != 0 {
		t.Errorf("zombies left in the container: %s", b)
	}
}

func TestPreAndPostTrainScripts(t *testing.T) {
	out := t.TempDir()
	pre := script(t, `echo "pre $*" >> "$OUT/order"`)
	post := filepath.Join(t.TempDir(), "post.sh")
	os.WriteFile(post, []byte("#!/bin/sh\necho \"post $*\" >> \"$OUT/order\"\n"), 0o755)
	w := filepath.Join(t.TempDir(), "w.sh")
	os.WriteFile(w, []byte("#!/bin/sh\necho train >> \"$OUT/order\"\n"), 0o755)
	r := hpr(t, []string{"OUT=" + out}, "--pre-train-script", pre, "--pre-train-args", "a b",
		"--post-train-script", post, "--post-train-args", "c", "--no-python", w)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	b, _ := os.ReadFile(filepath.Join(out, "order"))
	if string(b) != "pre a b\ntrain\npost c\n" {
		t.Errorf("order = %q", b)
	}
	bad := script(t, "exit 4")
	if r := hpr(t, nil, "--pre-train-script", bad, "--no-python", w); r.code == 0 || !strings.Contains(r.stderr, "pre-train-script") {
		t.Errorf("failing pre-train script: exit %d, %s", r.code, r.stderr)
	}
}

func TestPythonHelperImportableWithoutInstall(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	p := filepath.Join(t.TempDir(), "imp.py")
	os.WriteFile(p, []byte("import hyperpodrun_elastic\nfrom hyperpod_elastic_agent.elastic_event_handler import elastic_event_detected\nprint('imported', elastic_event_detected())\n"), 0o644)
	r := hpr(t, []string{"PYTHON_EXEC=" + py, "PYTHONPATH=/some/user/path"}, p)
	if r.code != 0 || !strings.Contains(r.stdout, "imported False") {
		t.Errorf("exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
}

func TestElasticBadSettingsGiveClearErrors(t *testing.T) {
	w := script(t, "true")
	start := time.Now()
	r := hpr(t, nil, "--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "j", "--no-python", w)
	if r.code == 0 || !strings.Contains(r.stderr, "127.0.0.1:1") || !strings.Contains(r.stderr, "rdzv-endpoint") {
		t.Errorf("unreachable etcd: exit %d\n%s", r.code, r.stderr)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("unreachable etcd took %s to report", took)
	}
	r = hpr(t, nil, "--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "j", "--rdzv-conf", "leese_ttl=3", "--no-python", w)
	if r.code != 2 || !strings.Contains(r.stderr, "leese_ttl") {
		t.Errorf("unknown rdzv-conf key: exit %d\n%s", r.code, r.stderr)
	}
	r = hpr(t, nil, "--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1", "--no-python", w)
	if r.code != 2 || !strings.Contains(r.stderr, "--rdzv-id") {
		t.Errorf("missing rdzv-id: exit %d\n%s", r.code, r.stderr)
	}
}

func TestRunPathAndModule(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "rp.py"), []byte("import sys\nprint('name', __name__, 'argv', sys.argv[1:])\n"), 0o644)
	r := hpr(t, []string{"PYTHON_EXEC=" + py}, "--run-path", filepath.Join(dir, "rp.py"), "a", "b")
	if r.code != 0 || !strings.Contains(r.stdout, "name __main__ argv ['a', 'b']") {
		t.Errorf("--run-path: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	os.MkdirAll(filepath.Join(dir, "pkg"), 0o755)
	os.WriteFile(filepath.Join(dir, "pkg", "__init__.py"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "pkg", "train.py"), []byte("import sys\nprint('module', __name__, sys.argv[1:])\n"), 0o644)
	r = hpr(t, []string{"PYTHON_EXEC=" + py, "PYTHONPATH=" + dir}, "-m", "pkg.train", "--x")
	if r.code != 0 || !strings.Contains(r.stdout, "module __main__ ['--x']") {
		t.Errorf("-m: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestSignalWhileWaitingForARound(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	w := script(t, "true")
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGUSR2, 0}, {syscall.SIGTERM, 1}} {
		job := "wait-" + strconv.Itoa(int(tc.sig))
		cmd, buf := startHPR(t, nil, "--nnodes", "2:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", srv.Endpoints[0],
			"--rdzv-id", job, "--no-python", w)
		// Registered (its member key exists) but alone: waiting for a round.
		waitFor(t, 20*time.Second, "the node to register", func() bool {
			r, err := cli.Get(context.Background(), "/hyperpodrun/jobs/"+job+"/rdzv/n/m/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			return err == nil && r.Count == 1
		})
		cmd.Process.Signal(tc.sig)
		err := cmd.Wait()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != tc.code {
			t.Errorf("%s while waiting: exit %d, want %d\n%s", launcher.SignalName(tc.sig), code, tc.code, buf)
		}
		// Leaving revoked its lease at once: the member is gone.
		if r, _ := cli.Get(context.Background(), "/hyperpodrun/jobs/"+job+"/rdzv/n/m/", clientv3.WithPrefix(), clientv3.WithCountOnly()); r != nil && r.Count != 0 {
			t.Errorf("%s: member still registered after leaving", launcher.SignalName(tc.sig))
		}
	}
}

// --standalone keeps the job's committed checkpoint in process: a worker
// commits step 7 through the Python helper and fails; the restarted
// workers are told to resume from it, with no etcd anywhere.
func TestStandaloneRestartResumesFromCommittedCheckpoint(t *testing.T) {
	out := t.TempDir()
	w := filepath.Join(t.TempDir(), "train.py")
	os.WriteFile(w, []byte(`import os, sys
import hyperpodrun_elastic as he
out = os.environ["OUT"]
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    path = os.path.join(out, "step-7")
    open(path, "w").close()
    if not he.report_checkpoint(7, path):
        sys.exit("checkpoint report refused")
    sys.exit(1)
with open(os.path.join(out, "resumed"), "w") as f:
    f.write("%s %s" % (os.environ.get("HYPERPODRUN_RESUME_STEP"), os.environ.get("HYPERPODRUN_CHECKPOINT")))
`), 0o644)
	r := hpr(t, []string{"OUT=" + out, "PYTHON_EXEC=python3"}, "--standalone", "--nproc-per-node", "1", "--max-restarts", "1", w)
	if r.code != 0 {
		t.Fatalf("exit %d:\n%s", r.code, r.stderr)
	}
	got, _ := os.ReadFile(filepath.Join(out, "resumed"))
	if want := "7 " + filepath.Join(out, "step-7"); string(got) != want {
		t.Errorf("restarted worker was told to resume from %q, want %q", got, want)
	}
}

// A pod's environment often already holds RANK, WORLD_SIZE and MASTER_*
// (Kubeflow's PyTorchJob, AWS's sample Dockerfiles). The values hyperpodrun
// assigns must win, each variable must reach the worker exactly once, and a
// parent PYTHONPATH is kept behind the helper's, not in place of it.
func TestPollutedParentEnvironmentNeverOverridesWorkers(t *testing.T) {
	out := t.TempDir()
	logs := t.TempDir()
	// /proc/self/environ is the environment exactly as exec'd: a shell's own
	// "env" would hide duplicates (it keeps the last copy, getenv the first).
	w := script(t, `tr '\0' '\n' < /proc/$$/environ > "$OUT/env.$LOCAL_RANK"`)
	polluted := []string{"OUT=" + out, "PYTHONPATH=/user/site"}
	for _, k := range []string{"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
		"GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
		"TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
		"TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE"} {
		polluted = append(polluted, k+"=polluted-"+k)
	}
	// Kubeflow's typical values, for the ones that must be numbers.
	polluted = append(polluted, "RANK=0", "WORLD_SIZE=1", "MASTER_PORT=29777")
	r := hpr(t, polluted, "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
		"--master-addr", "10.1.2.3", "--master-port", "23456", "--rdzv-id", "job7", "--max-restarts", "3",
		"--log-dir", logs, "--role", "trainer", "--no-python", w)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	for lr := 0; lr < 2; lr++ {
		raw, err := os.ReadFile(filepath.Join(out, "env."+strconv.Itoa(lr)))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		env := map[string]string{}
		for _, l := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(l, "="); ok {
				seen[k]++
				if _, dup := env[k]; !dup {
					env[k] = v // the first copy is the one getenv(3) returns
				}
			}
		}
		rank := 2 + lr
		want := map[string]string{
			"RANK": strconv.Itoa(rank), "LOCAL_RANK": strconv.Itoa(lr), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
			"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": strconv.Itoa(rank), "ROLE_WORLD_SIZE": "4",
			"ROLE_NAME": "trainer", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "23456",
			"TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "job7",
			"TORCHELASTIC_USE_AGENT_STORE": "True", // issue 25: torchrun's static agent store
			"TORCHELASTIC_ERROR_FILE":      filepath.Join(runLogDir(t, logs, "job7"), "attempt_0", strconv.Itoa(lr), "error.json"),
		}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("local rank %d: %s=%q, want %q (the parent's value must not win)", lr, k, env[k], v)
			}
		}
		for k, n := range seen {
			if n > 1 {
				t.Errorf("local rank %d: %s is in the worker's environment %d times", lr, k, n)
			}
		}
		// Issue 25: the user's path first, the helper's (outside the log
		// directory) after it.
		pp := strings.Split(env["PYTHONPATH"], ":")
		if len(pp) != 2 || pp[0] != "/user/site" || strings.HasPrefix(pp[1], logs) {
			t.Errorf("local rank %d: PYTHONPATH=%q, want /user/site then the helper's directory (outside the log directory)", lr, env["PYTHONPATH"])
		}
	}
}

// A node that joins a job whose nodes all finished gets torchrun's answer:
// the rendezvous is closed, exit 1, and its worker never runs (it used to
// run the whole job again, overwriting its outputs).
func TestNodeJoiningAFinishedJobIsRefused(t *testing.T) {
	srv, _ := etcdtest.Start(t)
	out := t.TempDir()
	w := script(t, `echo ran >> "$OUT/ran.$NODE"`)
	args := []string{"--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", srv.Endpoints[0],
		"--rdzv-id", "done-job", "--rdzv-conf", "last_call_timeout=0.2", "--no-python", w}
	if r := hpr(t, []string{"OUT=" + out, "NODE=a", "HYPERPODRUN_NODE_ID=a"}, args...); r.code != 0 {
		t.Fatalf("first node: exit %d\n%s", r.code, r.stderr)
	}
	r := hpr(t, []string{"OUT=" + out, "NODE=b", "HYPERPODRUN_NODE_ID=b"}, args...)
	if r.code != 1 || !strings.Contains(r.stderr, "finished") || !strings.Contains(r.stderr, "--rdzv-id") {
		t.Errorf("late node: exit %d, want 1 saying the job finished and to use another --rdzv-id\n%s", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(out, "ran.b")); err == nil {
		t.Error("the late node ran the finished job's worker again")
	}
}

// A corrupt checkpoint or restart-count record used to make hyperpodrun
// exit 1 and the job Failed: it is logged with its key, and the job runs
// (from scratch when no good value was ever stored).
func TestCorruptJobRecordsNeverEndAJob(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	k := fleet.NewKeys("")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cli.Put(ctx, k.Checkpoint("corrupt"), "{not json")
	cli.Put(ctx, k.Restarts("corrupt"), "lots")
	out := t.TempDir()
	w := script(t, `echo "resume=${HYPERPODRUN_RESUME_STEP-none}" > "$OUT/ran"`)
	r := hpr(t, []string{"OUT=" + out}, "--nnodes", "1:1", "--rdzv-backend", "etcd", "--rdzv-endpoint", srv.Endpoints[0],
		"--rdzv-id", "corrupt", "--max-restarts", "0", "--no-python", w)
	if r.code != 0 {
		t.Fatalf("exit %d with corrupt records, want 0\n%s", r.code, r.stderr)
	}
	if b, err := os.ReadFile(filepath.Join(out, "ran")); err != nil || !strings.Contains(string(b), "resume=none") {
		t.Errorf("the worker did not run from scratch: %q %v", b, err)
	}
	for _, key := range []string{k.Checkpoint("corrupt"), k.Restarts("corrupt")} {
		if !strings.Contains(r.stderr, key) {
			t.Errorf("the corrupt record %s was not logged with its key:\n%s", key, r.stderr)
		}
	}
}

// Hostile or mistaken input is refused with exit 2 and the rule: a
// rendezvous id that could escape its prefix or log directory, a signal
// workers cannot catch, a timeout that is not a number of seconds.
func TestRdzvIDSignalsAndTimeoutsAreChecked(t *testing.T) {
	w := script(t, "true")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "../nodes/x"}, "DNS-1123"},
		{[]string{"--nnodes", "1:2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-id", "My_Job"}, "DNS-1123"},
		{[]string{"--rdzv-id", "../../etc"}, "plain name"},
		{[]string{"--standalone", "--elastic-signal", "SIGKILL"}, "cannot catch"},
		{[]string{"--standalone", "--elastic-signal", "STOP"}, "cannot catch"},
		{[]string{"--standalone", "--graceful-timeout", "NaN"}, "--graceful-timeout"},
		{[]string{"--standalone", "--shutdown-timeout", "Inf"}, "--shutdown-timeout"},
		{[]string{"--standalone", "--graceful-timeout", "1e12"}, "between 0 and 86400"},
		{[]string{"--standalone", "--inprocess-prewarm-timeout", "-1"}, "--inprocess-prewarm-timeout -1: must be a number of seconds"},
		{[]string{"--standalone", "--inprocess-prewarm-timeout", "NaN"}, "--inprocess-prewarm-timeout"},
		{[]string{"--standalone", "--hang-startup-timeout", "-1"}, "--hang-startup-timeout -1: must be a number of seconds"},
	} {
		r := hpr(t, nil, append(tc.args, "--no-python", w)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

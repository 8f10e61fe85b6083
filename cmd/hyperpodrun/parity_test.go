package main

// Issue 17: torch 2.x and HyperPod launch lines, the console and the
// interpreter as torchrun users know them, and a differential test of the
// workers' environment against torch's own torchrun.

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// hprCtx runs hyperpodrun with a deadline; it returns when the process has
// exited.
func hprCtx(t *testing.T, ctx context.Context, env []string, args ...string) result {
	t.Helper()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Errorf("run hyperpodrun: %v", err)
		code = -1
	}
	return result{code, so.String(), se.String()}
}

// pidsGone checks that every pid written (one per line) to files matching
// glob has exited.
func pidsGone(t *testing.T, glob string) {
	t.Helper()
	files, _ := filepath.Glob(glob)
	if len(files) == 0 {
		t.Fatalf("no pid files match %s", glob)
	}
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, l := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(l)
			if err != nil {
				continue
			}
			waitFor(t, 10*time.Second, "worker "+l+" to be gone", func() bool { return !alive(pid) })
		}
	}
}

// c10dNodes starts n hyperpodrun processes on one c10d endpoint with the
// same args, and returns their results once all have exited.
func c10dNodes(t *testing.T, ctx context.Context, n int, delays []time.Duration, args ...string) []result {
	t.Helper()
	res := make([]result, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if delays != nil && delays[i] > 0 {
				select {
				case <-time.After(delays[i]):
				case <-ctx.Done():
				}
			}
			res[i] = hprCtx(t, ctx, nil, args...)
		}(i)
	}
	wg.Wait()
	return res
}

// The standard multi-node line with no etcd to run: one node hosts the
// rendezvous on the endpoint (an embedded etcd), the other joins it.
func TestC10dStaticTwoNodesWithoutEtcd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out := t.TempDir()
	w := script(t, `echo $$ >> "`+out+`/pids"; echo "$RANK $WORLD_SIZE $GROUP_RANK $MASTER_ADDR:$MASTER_PORT" > "`+out+`/rank.$RANK"`)
	ep := "localhost:" + strconv.Itoa(freePort(t))
	res := c10dNodes(t, ctx, 2, nil, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
		"--rdzv-endpoint", ep, "--rdzv-id", "c10d-static", "--no-python", w)
	hosts := 0
	for i, r := range res {
		if r.code != 0 {
			t.Fatalf("node %d exit %d\n%s", i, r.code, r.stderr)
		}
		if strings.Contains(r.stderr, "hosting the c10d rendezvous") {
			hosts++
		}
	}
	if hosts != 1 {
		t.Fatalf("%d nodes hosted the rendezvous, want exactly 1:\n%s\n---\n%s", hosts, res[0].stderr, res[1].stderr)
	}
	masters := map[string]bool{}
	for rank := 0; rank < 4; rank++ {
		b, err := os.ReadFile(filepath.Join(out, "rank."+strconv.Itoa(rank)))
		if err != nil {
			t.Fatalf("rank %d never ran: %v", rank, err)
		}
		f := strings.Fields(string(b))
		if f[1] != "4" || f[2] != strconv.Itoa(rank/2) {
			t.Errorf("rank %d: world size %s group rank %s, want 4 and %d", rank, f[1], f[2], rank/2)
		}
		masters[f[3]] = true
	}
	if len(masters) != 1 {
		t.Errorf("ranks disagree on the master: %v", masters)
	}
	pidsGone(t, filepath.Join(out, "pids"))
}

// Elastic 1:2 on c10d: the first node trains alone, the second joins and
// both train at world size 4.
func TestC10dElasticOneToTwoWithoutEtcd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	out := t.TempDir()
	stop := filepath.Join(out, "stop")
	// A worker that trains until told to stop, and stops at a planned
	// change (SIGUSR1) the way the Python helper makes it: exit 0.
	w := script(t, `echo $$ >> "`+out+`/pids"
touch "`+out+`/ws.$WORLD_SIZE.rank.$RANK"
trap 'exit 0' USR1
while [ ! -e "`+stop+`" ]; do sleep 0.05; done`)
	ep := "127.0.0.1:" + strconv.Itoa(freePort(t))
	args := []string{"--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", ep,
		"--rdzv-id", "c10d-elastic", "--rdzv-conf", "last_call_timeout=0.5", "--graceful-timeout", "10", "--no-python", w}
	var wg sync.WaitGroup
	res := make([]result, 2)
	wg.Add(1)
	go func() { defer wg.Done(); res[0] = hprCtx(t, ctx, nil, args...) }()
	waitFor(t, 60*time.Second, "the first node training alone (world size 2)", func() bool {
		_, err := os.Stat(filepath.Join(out, "ws.2.rank.1"))
		return err == nil
	})
	wg.Add(1)
	go func() { defer wg.Done(); res[1] = hprCtx(t, ctx, nil, args...) }()
	waitFor(t, 60*time.Second, "both nodes training at world size 4", func() bool {
		for r := 0; r < 4; r++ {
			if _, err := os.Stat(filepath.Join(out, "ws.4.rank."+strconv.Itoa(r))); err != nil {
				return false
			}
		}
		return true
	})
	os.WriteFile(stop, nil, 0o644)
	wg.Wait()
	for i, r := range res {
		if r.code != 0 {
			t.Errorf("node %d exit %d\n%s", i, r.code, r.stderr)
		}
	}
	if !strings.Contains(res[0].stderr, "hosting the c10d rendezvous") {
		t.Errorf("the first node (which owns 127.0.0.1) did not host:\n%s", res[0].stderr)
	}
	pidsGone(t, filepath.Join(out, "pids"))
}

// torch 2.x flags: --virtual-local-rank, --numa-binding, --logs-specs
// (default accepted), --signals-to-handle, --event-log-handler,
// --duplicate-*-filters, --log-line-prefix-template, --nproc-per-node xpu.
func TestTorch2Flags(t *testing.T) {
	out := t.TempDir()
	w := script(t, `echo "lr=$LOCAL_RANK rank=$RANK cvd=$CUDA_VISIBLE_DEVICES cpus=$(awk '/Cpus_allowed_list/{print $2}' /proc/$$/status)"
echo "loss=1 keep-$RANK"; echo "noise-$RANK"; echo "warn keep-err-$RANK" >&2`)
	logs := t.TempDir()
	r := hpr(t, []string{"CUDA_VISIBLE_DEVICES=4,5", "OUT=" + out}, "--nproc-per-node", "2", "--virtual-local-rank",
		"--numa-binding", "exclusive", "--logs-specs", "default", "--signals-to-handle", "SIGTERM,SIGINT,SIGUSR2",
		"--event-log-handler", "console", "--tee", "3", "--log-dir", logs, "--rdzv-id", "t2",
		"--duplicate-stdout-filters", "loss=,lr=", "--duplicate-stderr-filters", "warn",
		"--log-line-prefix-template", "[${role_name}-r${rank}-l${local_rank}]:", "--no-python", w)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	cpus := map[string]bool{}
	for lr := 0; lr < 2; lr++ {
		line := ""
		for _, l := range strings.Split(r.stdout, "\n") {
			if strings.HasPrefix(l, "[default-r"+strconv.Itoa(lr)+"-l"+strconv.Itoa(lr)+"]:lr=") {
				line = l
			}
		}
		if line == "" {
			t.Fatalf("no prefixed line of rank %d:\n%s", lr, r.stdout)
		}
		if !strings.Contains(line, "lr=0 ") {
			t.Errorf("--virtual-local-rank: %q, want LOCAL_RANK=0", line)
		}
		if want := "cvd=" + []string{"4", "5"}[lr] + " "; !strings.Contains(line, want) {
			t.Errorf("--virtual-local-rank: %q, want %s (one device each, from the launcher's list)", line, want)
		}
		cpus[line[strings.Index(line, "cpus=")+5:]] = true
	}
	if len(cpus) != 2 {
		t.Errorf("--numa-binding exclusive: the two ranks share CPUs %v", cpus)
	}
	att := filepath.Join(runLogDir(t, logs, "t2"), "attempt_0")
	fo, _ := os.ReadFile(filepath.Join(att, "filtered_stdout.log"))
	fe, _ := os.ReadFile(filepath.Join(att, "filtered_stderr.log"))
	for _, want := range []string{"[default-r0-l0]:loss=1 keep-0\n", "[default-r1-l1]:loss=1 keep-1\n", "[default-r0-l0]:lr=0"} {
		if !strings.Contains(string(fo), want) {
			t.Errorf("filtered_stdout.log lacks %q:\n%s", want, fo)
		}
	}
	if strings.Contains(string(fo), "noise") {
		t.Errorf("filtered_stdout.log has unmatched lines:\n%s", fo)
	}
	if !strings.Contains(string(fe), "[default-r1-l1]:warn keep-err-1\n") {
		t.Errorf("filtered_stderr.log: %q", fe)
	}
	// The template also comes from TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE.
	r = hpr(t, []string{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=<${rank}>"}, "--tee", "1", "--no-python", script(t, "echo hi"))
	if r.code != 0 || r.stdout != "<0>hi\n" {
		t.Errorf("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: exit %d, stdout %q", r.code, r.stdout)
	}
	// A signal named in --signals-to-handle is forwarded to the workers.
	ready := filepath.Join(t.TempDir(), "ready")
	sw := script(t, `trap 'echo got-usr2; exit 3' USR2; touch "`+ready+`"; while true; do sleep 0.05; done`)
	cmd := exec.Command(binary, "--signals-to-handle", "SIGUSR2", "--no-python", sw)
	var so bytes.Buffer
	cmd.Stdout = &so
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the worker to start", func() bool { _, err := os.Stat(ready); return err == nil })
	cmd.Process.Signal(syscall.SIGUSR2)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("hyperpodrun did not stop after the handled SIGUSR2")
	}
	if !strings.Contains(so.String(), "got-usr2") {
		t.Errorf("SIGUSR2 was not forwarded to the worker: %q", so.String())
	}
	// --nproc-per-node xpu without an Intel GPU: a clear refusal, exit 2.
	if r := hpr(t, nil, "--nproc-per-node", "xpu", "--no-python", w); r.code != 2 || !strings.Contains(r.stderr, "no Intel GPU (XPU)") {
		t.Errorf("--nproc-per-node xpu: exit %d %s", r.code, r.stderr)
	}
}

// torch accepts read_timeout, close_timeout, ... in --rdzv-conf: accepted
// with one warning each. Truly unknown keys are refused (see
// TestElasticBadSettingsGiveClearErrors): a misspelt key must not silently
// do nothing.
func TestTorchRdzvConfKeysAcceptedWithAWarning(t *testing.T) {
	w := script(t, `echo "addr=$MASTER_ADDR"`)
	r := hpr(t, nil, "--rdzv-conf", "read_timeout=60,close_timeout=5,keep_alive_interval=5,keep_alive_max_attempt=3,is_host=true,timeout=900,local_addr=127.0.0.1",
		"--no-python", w)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	for _, k := range []string{"read_timeout", "close_timeout", "keep_alive_interval", "keep_alive_max_attempt", "is_host"} {
		if n := strings.Count(r.stderr, "--rdzv-conf "+k+" accepted"); n != 1 {
			t.Errorf("%d warnings for %s, want 1:\n%s", n, k, r.stderr)
		}
	}
}

// argparse keeps the last of a flag given twice, in either spelling.
func TestSameFlagTwiceLastWins(t *testing.T) {
	w := script(t, `echo "n=$LOCAL_WORLD_SIZE role=$ROLE_NAME"`)
	for _, args := range [][]string{
		{"--nproc-per-node", "3", "--nproc-per-node", "2"},
		{"--nproc_per_node=3", "--nproc-per-node", "2"},
		{"--nproc-per-node=3", "--nproc_per_node=2"},
	} {
		a := append(append(args, "--role", "a", "--role", "b", "--no-python", w), "--nproc-per-node", "5")
		r := hpr(t, nil, a...)
		if r.code != 0 || strings.Count(r.stdout, "n=2 role=b\n") != 2 {
			t.Errorf("%v: exit %d stdout %q stderr %s", args, r.code, r.stdout, r.stderr)
		}
	}
}

// HyperPod's agent flags run unchanged, each with a one-line notice.
func TestHyperPodAgentFlagsAccepted(t *testing.T) {
	w := script(t, `echo "coord=$HYPERPOD_SIGNAL_COORDINATION"`)
	r := hpr(t, nil, "--server-host", "0.0.0.0", "--server-port", "8080", "--server-log-level", "info",
		"--server-shutdown-timeout", "60", "--inprocess-restart", "--inprocess-timeout", "30",
		"--shutdown-signal", "SIGKILL", "--shutdown-timeout", "15", "--no-python", w)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"--server-host=0.0.0.0 accepted", "--server-port=8080 accepted", "--server-shutdown-timeout=60 accepted",
		"--server-log-level=info sets", "--inprocess-restart/--inprocess-timeout accepted"} {
		if strings.Count(r.stderr, want) != 1 {
			t.Errorf("want one notice %q:\n%s", want, r.stderr)
		}
	}
	if !strings.Contains(r.stdout, "coord=distributed") {
		t.Errorf("workers get HYPERPOD_SIGNAL_COORDINATION=distributed unless set: %q", r.stdout)
	}
	r = hpr(t, []string{"HYPERPOD_SIGNAL_COORDINATION=disabled"}, "--no-python", w)
	if !strings.Contains(r.stdout, "coord=disabled") {
		t.Errorf("the launcher's HYPERPOD_SIGNAL_COORDINATION must be kept: %q", r.stdout)
	}
	// --rdzv-backend hyperpod with an endpoint rendezvouses as c10d.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r = hprCtx(t, ctx, nil, "--rdzv-backend", "hyperpod", "--rdzv-endpoint", "127.0.0.1:"+strconv.Itoa(freePort(t)),
		"--rdzv-id", "hp", "--no-python", w)
	if r.code != 0 || !strings.Contains(r.stderr, "rendezvousing as c10d") || !strings.Contains(r.stderr, "hosting the c10d rendezvous") {
		t.Errorf("--rdzv-backend hyperpod: exit %d\n%s", r.code, r.stderr)
	}
}

// Workers write to hyperpodrun's own terminal when nothing redirects, tees
// or filters them, as under torchrun: isatty() is true, \r progress bars
// work. Teed streams go through a pipe (as torchrun's tail does).
func TestWorkersInheritTheTerminal(t *testing.T) {
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("script(1) not installed")
	}
	w := script(t, `[ -t 1 ] && echo "out-tty-$LOCAL_RANK" || echo "out-pipe-$LOCAL_RANK"; [ -t 2 ] && echo "err-tty-$LOCAL_RANK" >&2 || echo "err-pipe-$LOCAL_RANK" >&2`)
	run := func(extra string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		line := binary + " --nproc-per-node 2 " + extra + " --no-python " + w
		out, err := exec.CommandContext(ctx, "script", "-qec", line, "/dev/null").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		return strings.ReplaceAll(string(out), "\r\n", "\n")
	}
	out := run("")
	for _, want := range []string{"out-tty-0", "out-tty-1", "err-tty-0", "err-tty-1"} {
		if !strings.Contains(out, want) {
			t.Errorf("no redirect/tee: want %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "[default") {
		t.Errorf("lines prefixed without --tee:\n%s", out)
	}
	out = run("--tee 1")
	for _, want := range []string{"[default0]:out-pipe-0", "[default1]:out-pipe-1", "err-tty-0"} {
		if !strings.Contains(out, want) {
			t.Errorf("--tee 1: want %s:\n%s", want, out)
		}
	}
}

// Without PYTHON_EXEC: the first python3 on PATH that has torch, else the
// activated environment's, else python3; the first log line says which.
func TestInterpreterChoice(t *testing.T) {
	torchPython(t)
	fake := func(dir, name string) string {
		os.MkdirAll(dir, 0o755)
		p := filepath.Join(dir, "python3")
		os.WriteFile(p, []byte("#!/bin/sh\necho \"interpreter="+name+"\"\n"), 0o755)
		return p
	}
	tmp := t.TempDir()
	noTorch := fake(filepath.Join(tmp, "a", "bin"), "no-torch")
	venv := filepath.Join(tmp, "venv")
	venvPy := fake(filepath.Join(venv, "bin"), "venv")
	scriptPy := filepath.Join(tmp, "s.py")
	os.WriteFile(scriptPy, []byte("import sys; print('interpreter=' + sys.executable)\n"), 0o644)
	for _, tc := range []struct {
		name, path, venv, want, why string
	}{
		{"torch on PATH after one without", filepath.Dir(noTorch) + ":/usr/bin", venv, "interpreter=/usr/bin/python3", "has torch"},
		{"activated venv", filepath.Dir(noTorch), venv, "interpreter=venv", "VIRTUAL_ENV=" + venv},
		{"plain python3", filepath.Dir(noTorch), "", "interpreter=no-torch", "none has torch"},
	} {
		r := hpr(t, []string{"PYTHON_EXEC=", "PATH=" + tc.path, "VIRTUAL_ENV=" + tc.venv, "CONDA_PREFIX="}, scriptPy)
		if r.code != 0 || !strings.Contains(r.stdout, tc.want) {
			t.Errorf("%s: exit %d stdout %q stderr %s", tc.name, r.code, r.stdout, r.stderr)
			continue
		}
		first, _, _ := strings.Cut(r.stderr, "\n")
		if !strings.Contains(first, "python interpreter") || !strings.Contains(first, tc.why) {
			t.Errorf("%s: first log line %q should say which interpreter and why (%q)", tc.name, first, tc.why)
		}
	}
	_ = venvPy
}

// The same polluted pod line under torch's own torchrun and under
// hyperpodrun: the workers' environments match, apart from values that
// legitimately differ (paths of the log dirs, our HYPERPODRUN_ additions).
func TestPollutedEnvironmentMatchesTorchrun(t *testing.T) {
	py := torchPython(t)
	shim := repoFile(t, "bench/torchrun/torchrun_py311.py")
	out := t.TempDir()
	w := script(t, `tr '\0' '\n' < /proc/$$/environ > "$OUT/$WHO.$LOCAL_RANK"`)
	port := strconv.Itoa(freePort(t))
	polluted := []string{"RANK=0", "WORLD_SIZE=1", "MASTER_PORT=29777", "MASTER_ADDR=10.9.9.9", "LOCAL_RANK=7",
		"LOCAL_WORLD_SIZE=1", "GROUP_RANK=3", "ROLE_RANK=3", "ROLE_NAME=polluted", "GROUP_WORLD_SIZE=9",
		"ROLE_WORLD_SIZE=9", "TORCHELASTIC_RESTART_COUNT=4", "TORCHELASTIC_MAX_RESTARTS=9",
		"TORCHELASTIC_RUN_ID=polluted", "TORCHELASTIC_ERROR_FILE=/tmp/polluted.json", "OUT=" + out,
		"PYTHON_EXEC=" + py, "LOGLEVEL=WARNING"}
	args := []string{"--nnodes", "1", "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port", port,
		"--nproc_per_node", "2", "--max_restarts", "1", "--rdzv_id", "job7", "--role", "trainer", "--no_python", w}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	tr := exec.CommandContext(ctx, py, append([]string{shim, "--log_dir", t.TempDir()}, args...)...)
	tr.Env = append(append(os.Environ(), polluted...), "WHO=torchrun")
	if b, err := tr.CombinedOutput(); err != nil {
		t.Fatalf("torchrun: %v\n%s", err, b)
	}
	r := hprCtx(t, ctx, append(polluted, "WHO=hyperpodrun"), append([]string{"--log_dir", t.TempDir()}, args...)...)
	if r.code != 0 {
		t.Fatalf("hyperpodrun exit %d\n%s", r.code, r.stderr)
	}
	// Values that legitimately differ: log-dir paths, and the agent store
	// (hyperpodrun hosts no TCPStore: README, "Differences from torchrun").
	differs := map[string]bool{"TORCHELASTIC_ERROR_FILE": true, "TORCHELASTIC_USE_AGENT_STORE": true, "WHO": true, "PYTHONPATH": true}
	// Only ours: our own variables, HyperPod's coordination mode and torch
	// 2.2's name of the NCCL setting (1.13 reads NCCL_ASYNC_ERROR_HANDLING).
	ours := func(k string) bool {
		return strings.HasPrefix(k, "HYPERPODRUN_") || k == "HYPERPOD_SIGNAL_COORDINATION" ||
			k == "TORCH_NCCL_ASYNC_ERROR_HANDLING" || k == "TRACEPARENT" || k == "PYTHONPATH"
	}
	for lr := 0; lr < 2; lr++ {
		te := readEnvFile(t, filepath.Join(out, "torchrun."+strconv.Itoa(lr)))
		he := readEnvFile(t, filepath.Join(out, "hyperpodrun."+strconv.Itoa(lr)))
		var diffs []string
		for k, v := range te {
			hv, ok := he[k]
			switch {
			case !ok:
				diffs = append(diffs, "missing "+k+"="+v)
			case !differs[k] && hv != v:
				diffs = append(diffs, k+": torchrun "+strconv.Quote(v)+", hyperpodrun "+strconv.Quote(hv))
			}
		}
		for k, v := range he {
			if _, ok := te[k]; !ok && !ours(k) {
				diffs = append(diffs, "extra "+k+"="+v)
			}
		}
		sort.Strings(diffs)
		if len(diffs) > 0 {
			t.Errorf("local rank %d: workers' environments differ:\n  %s", lr, strings.Join(diffs, "\n  "))
		}
		if he["RANK"] != strconv.Itoa(lr) || he["WORLD_SIZE"] != "2" || he["MASTER_PORT"] != port {
			t.Errorf("local rank %d: RANK=%s WORLD_SIZE=%s MASTER_PORT=%s", lr, he["RANK"], he["WORLD_SIZE"], he["MASTER_PORT"])
		}
	}
}

// Losing the hosting node loses a c10d rendezvous (README): the other node
// stops its workers at once (it cannot prove its lease) and fails.
func TestC10dLosingTheHostFailsTheJob(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the survivor's etcd retries (about a minute)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	out := t.TempDir()
	w := script(t, `echo $$ >> "`+out+`/pids.$GROUP_RANK"; trap 'exit 0' USR1; while true; do sleep 0.05; done`)
	ep := "127.0.0.1:" + strconv.Itoa(freePort(t))
	args := []string{"--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", ep,
		"--rdzv-id", "c10d-loss", "--no-python", w}
	host := exec.CommandContext(ctx, binary, args...)
	var hostErr syncBuffer
	host.Stderr = &hostErr
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	defer host.Process.Kill()
	hostExited := make(chan struct{})
	go func() { host.Wait(); close(hostExited) }()
	waitFor(t, 30*time.Second, "the host to serve the endpoint", func() bool {
		return strings.Contains(hostErr.String(), "hosting the c10d rendezvous")
	})
	done := make(chan result, 1)
	go func() { done <- hprCtx(t, ctx, nil, args...) }()
	waitFor(t, 60*time.Second, "both nodes' workers", func() bool {
		_, e0 := os.Stat(filepath.Join(out, "pids.0"))
		_, e1 := os.Stat(filepath.Join(out, "pids.1"))
		return e0 == nil && e1 == nil
	})
	// The host's workers die with it (Pdeathsig); the survivor's must be
	// stopped by its agent (fencing) within seconds.
	host.Process.Kill()
	<-hostExited
	start := time.Now()
	for _, f := range []string{"pids.0", "pids.1"} {
		pidsGone(t, filepath.Join(out, f))
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the survivor's workers outlived the host by %s", took)
	}
	select {
	case r := <-done:
		if r.code == 0 {
			t.Errorf("the survivor exited 0 after losing the rendezvous host:\n%s", r.stderr)
		}
	case <-ctx.Done():
		t.Fatal("the survivor did not give up after losing the rendezvous host")
	}
}

// syncBuffer is a bytes.Buffer a test may read while a process writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The hosting node needs hyperpodrun-rdzv-host; without it, a clear refusal.
func TestC10dHostWithoutTheHostProgram(t *testing.T) {
	dir := t.TempDir()
	lone := filepath.Join(dir, "hyperpodrun")
	b, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lone, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(lone, "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:"+strconv.Itoa(freePort(t)),
		"--rdzv-id", "x", "--no-python", script(t, "true"))
	cmd.Env = append(os.Environ(), "PATH="+dir+":/usr/bin:/bin")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "hyperpodrun-rdzv-host next to hyperpodrun") {
		t.Errorf("exit %v:\n%s", err, out)
	}
}

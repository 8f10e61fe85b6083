package checkpoint

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
	"github.com/hyperpodrun/hyperpodrun/internal/syncbuf"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// pythonWithTorch returns a Python that can import torch.distributed, or
// skips the test. PYTHON_EXEC overrides the default /usr/bin/python3 (where
// Debian's torch lives on the test machines).
func pythonWithTorch(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("real PyTorch workers: skipped in -short mode")
	}
	py := os.Getenv("PYTHON_EXEC")
	if py == "" {
		py = "/usr/bin/python3"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, py, "-c", "import torch.distributed as d; assert d.is_available()").CombinedOutput(); err != nil {
		t.Skipf("%s cannot import torch.distributed: %v\n%s", py, err, out)
	}
	return py
}

// syncBuffer collects a process's stderr for failure messages.
type syncBuffer = syncbuf.Buffer

// stepLine is what train_elastic.py prints on rank 0 after every step.
var stepLine = regexp.MustCompile(`^step=(\d+) world_size=(\d+) loss=([0-9.eE+-]+|nan|inf)$`)

type stepLog struct {
	step, world int
	loss        float64
}

func parseStep(l string) (stepLog, bool) {
	m := stepLine.FindStringSubmatch(l)
	if m == nil {
		return stepLog{}, false
	}
	s, _ := strconv.Atoi(m[1])
	w, _ := strconv.Atoi(m[2])
	loss, _ := strconv.ParseFloat(m[3], 64)
	return stepLog{s, w, loss}, true
}

// workerGroup is one attempt of the example at some world size, launched
// the way hyperpodrun does (torchrun's variables plus ours).
type workerGroup struct {
	cmds   []*exec.Cmd
	rank0  *lineWaiter
	stderr *syncBuffer
	steps  []stepLog
}

func startWorkers(t *testing.T, py string, world int, extraEnv map[string]string, args ...string) *workerGroup {
	t.Helper()
	script, err := filepath.Abs("../examples/pytorch/train_elastic.py")
	if err != nil {
		t.Fatal(err)
	}
	base := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "HYPERPODRUN_") && !strings.HasPrefix(kv, "PYTHONPATH=") {
			base = append(base, kv)
		}
	}
	port := testutil.FreePort(t)
	g := &workerGroup{stderr: &syncBuffer{}}
	for rank := 0; rank < world; rank++ {
		cmd := exec.Command(py, append([]string{script}, args...)...)
		cmd.Env = append(append([]string{}, base...),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port),
			"RANK="+strconv.Itoa(rank), "LOCAL_RANK="+strconv.Itoa(rank),
			"WORLD_SIZE="+strconv.Itoa(world), "LOCAL_WORLD_SIZE="+strconv.Itoa(world),
			"OMP_NUM_THREADS=1")
		for k, v := range extraEnv {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stderr = g.stderr
		if rank == 0 {
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			g.rank0 = newLineWaiter(out)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		g.cmds = append(g.cmds, cmd)
	}
	t.Cleanup(func() {
		for _, c := range g.cmds {
			c.Process.Kill()
			c.Wait()
		}
	})
	return g
}

// waitStep waits until rank 0 has logged step >= n.
func (g *workerGroup) waitStep(t *testing.T, n int) {
	t.Helper()
	g.rank0.waitFor(t, 60*time.Second, fmt.Sprintf("step %d", n), func(l string) bool {
		s, ok := parseStep(l)
		if ok {
			g.steps = append(g.steps, s)
		}
		return ok && s.step >= n
	})
}

func (g *workerGroup) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	for _, c := range g.cmds {
		if err := c.Process.Signal(sig); err != nil {
			t.Fatalf("signal worker: %v", err)
		}
	}
}

// wait waits for every worker to exit and returns rank 0's step lines. With
// ok, every worker must exit 0; otherwise any exit is accepted.
func (g *workerGroup) wait(t *testing.T, ok bool) []stepLog {
	t.Helper()
	done := make(chan struct{})
	timer := time.AfterFunc(90*time.Second, func() {
		for _, c := range g.cmds {
			c.Process.Kill()
		}
	})
	defer timer.Stop()
	go func() {
		for l := range g.rank0.lines {
			if s, ok := parseStep(l); ok {
				g.steps = append(g.steps, s)
			}
		}
		close(done)
	}()
	<-done // rank 0's stdout is fully read before Wait closes it
	for rank, c := range g.cmds {
		if err := c.Wait(); err != nil && ok {
			t.Fatalf("rank %d: %v\nstderr:\n%s", rank, err, g.stderr.String())
		}
	}
	return g.steps
}

// elasticJob drives train_elastic.py the way the agent does: a control
// channel whose reports commit to a real etcd store, rounds of worker
// groups, and an uninterrupted 1-rank reference run to compare losses with.
type elasticJob struct {
	py, pkg, root string
	total         int
	store         *Store
	ch            *control.Channel
	round         atomic.Int64
	ref           []stepLog

	mu       sync.Mutex
	stopping []control.Report
}

func newElasticJob(t *testing.T, job string, total int) *elasticJob {
	t.Helper()
	j := &elasticJob{py: pythonWithTorch(t), root: t.TempDir(), total: total}
	j.pkg, _ = filepath.Abs("python")
	// Reference: one rank, never interrupted, no agent (this also exercises
	// the script's fallback import of the helper from the repository).
	ref := startWorkers(t, j.py, 1, nil, "--steps", strconv.Itoa(total), "--ckpt-dir", filepath.Join(j.root, "ref"), "--global-batch", "12")
	j.ref = ref.wait(t, true)
	if len(j.ref) != total {
		t.Fatalf("reference run logged %d steps, want %d", len(j.ref), total)
	}
	j.store = NewStore(etcdClient(t), "", uniqueJob(job))
	commit := j.store.ReportHandler(j.round.Load)
	ch, err := control.NewChannel(filepath.Join(j.root, "ctl"), control.WithHandler(func(ctx context.Context, r control.Report) error {
		if r.Type == control.ReportStopping {
			j.mu.Lock()
			j.stopping = append(j.stopping, r)
			j.mu.Unlock()
		}
		return commit(ctx, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	j.ch = ch
	return j
}

// start starts the next round at world size world, handed rec.
func (j *elasticJob) start(t *testing.T, world int, rec *Record, extra ...string) *workerGroup {
	t.Helper()
	if err := j.ch.ClearEvent(); err != nil {
		t.Fatal(err)
	}
	j.round.Add(1)
	j.mu.Lock()
	j.stopping = nil
	j.mu.Unlock()
	env := map[string]string{"PYTHONPATH": j.pkg, control.EnvRound: strconv.FormatInt(j.round.Load(), 10)}
	for k, v := range j.ch.Env() {
		env[k] = v
	}
	for k, v := range rec.Env() {
		env[k] = v
	}
	args := append([]string{"--steps", strconv.Itoa(j.total), "--ckpt-dir", filepath.Join(j.root, "ckpt"), "--global-batch", "12"}, extra...)
	return startWorkers(t, j.py, world, env, args...)
}

// announce announces a resize to newWorld and signals the group.
func (j *elasticJob) announce(t *testing.T, g *workerGroup, kind control.EventKind, newWorld int) {
	t.Helper()
	if err := j.ch.Announce(control.Event{Kind: kind, NewWorldSize: newWorld, Round: j.round.Load(), Deadline: time.Now().Add(30 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	g.signal(t, syscall.SIGUSR1)
}

// latest returns the committed record, which must exist.
func (j *elasticJob) latest(t *testing.T) *Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := j.store.Latest(ctx)
	if err != nil || rec == nil {
		t.Fatalf("no committed checkpoint: %+v, %v", rec, err)
	}
	return rec
}

// checkStopped checks that a cooperative round ended with every rank
// stopping at the committed step, which is rank 0's last logged step.
func (j *elasticJob) checkStopped(t *testing.T, world int, steps []stepLog) *Record {
	t.Helper()
	rec := j.latest(t)
	last := steps[len(steps)-1]
	if rec.Step != int64(last.step) || rec.WorldSize != world || rec.Round != j.round.Load() {
		t.Fatalf("committed %+v in round %d, but rank 0 last logged step %d at world size %d", rec, j.round.Load(), last.step, world)
	}
	if rec.Step >= int64(j.total) {
		t.Fatalf("the event was not seen before the end (committed step %d)", rec.Step)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	ranks, detected := map[int]bool{}, map[int]bool{}
	for _, r := range j.stopping {
		if r.Detected {
			detected[r.Rank] = true
			continue
		}
		if r.Step != rec.Step {
			t.Fatalf("rank %d stopped after step %d, committed %d", r.Rank, r.Step, rec.Step)
		}
		ranks[r.Rank] = true
	}
	if len(ranks) != world {
		t.Fatalf("%d of %d ranks reported stopping: %+v", len(ranks), world, j.stopping)
	}
	if len(detected) != world {
		t.Fatalf("%d of %d ranks told the agent when they detected the event: %+v", len(detected), world, j.stopping)
	}
	return rec
}

// checkLosses compares every logged step's loss with the reference run.
func (j *elasticJob) checkLosses(t *testing.T, steps []stepLog) {
	t.Helper()
	for _, s := range steps {
		want := j.ref[s.step-1].loss
		if math.Abs(s.loss-want) > 1e-4*math.Max(1, math.Abs(want)) {
			t.Fatalf("step %d (world size %d) loss %.6f, uninterrupted run %.6f", s.step, s.world, s.loss, want)
		}
	}
}

// checkResumed checks that a round logged the steps right after from,
// contiguously, at world size world.
func checkResumed(t *testing.T, steps []stepLog, from int64, world int) {
	t.Helper()
	for i, s := range steps {
		if s.step != int(from)+1+i || s.world != world {
			t.Fatalf("round resumed from step %d should log steps %d.. at world size %d, logged %+v", from, from+1, world, steps)
		}
	}
}

// The example resized 3 -> 2 -> 3 through the real control channel and etcd
// store: at each event all ranks stop at the same step, that step is
// committed before they exit, the restart at the new size resumes from
// exactly the next step, the job ends after the configured number of steps,
// and every step's loss equals that of an uninterrupted 1-rank run (same
// global batch at every size, optimizer state restored: no jump back).
func TestPyTorchExampleResizesWithoutLosingAStep(t *testing.T) {
	const total = 20
	j := newElasticJob(t, "job-pytorch-resize", total)

	g1 := j.start(t, 3, nil, "--step-time", "0.1")
	g1.waitStep(t, 4)
	j.announce(t, g1, control.ScaleDown, 2)
	steps1 := g1.wait(t, true)
	checkResumed(t, steps1, 0, 3)
	rec1 := j.checkStopped(t, 3, steps1)

	g2 := j.start(t, 2, rec1, "--step-time", "0.1")
	g2.waitStep(t, int(rec1.Step)+3)
	j.announce(t, g2, control.ScaleUp, 3)
	steps2 := g2.wait(t, true)
	checkResumed(t, steps2, rec1.Step, 2)
	rec2 := j.checkStopped(t, 2, steps2)

	g3 := j.start(t, 3, rec2)
	steps3 := g3.wait(t, true)
	checkResumed(t, steps3, rec2.Step, 3)
	if steps3[len(steps3)-1].step != total {
		t.Fatalf("job ended at step %d, want %d", steps3[len(steps3)-1].step, total)
	}
	if rec := j.latest(t); rec.Step != total || rec.WorldSize != 3 {
		t.Fatalf("final record %+v", rec)
	}
	j.checkLosses(t, append(append(steps1, steps2...), steps3...))
}

// Workers that ignore the elastic signal keep training until the agent
// escalates; the restart resumes from the last periodic commit (never from
// the uncommitted steps after it) and still ends at the configured count.
func TestPyTorchExampleIgnoringTheSignalResumesFromLastCommit(t *testing.T) {
	const total = 14
	j := newElasticJob(t, "job-pytorch-ignore", total)

	g1 := j.start(t, 2, nil, "--step-time", "0.1", "--ckpt-every", "3", "--ignore-signal")
	g1.waitStep(t, 4)
	j.announce(t, g1, control.Preemption, 3)
	at := g1.steps[len(g1.steps)-1].step
	g1.waitStep(t, at+2) // still training: the signal was ignored
	g1.signal(t, syscall.SIGTERM)
	steps1 := g1.wait(t, false)
	for _, c := range g1.cmds {
		if c.ProcessState.Success() {
			t.Fatalf("a worker ignoring the signal exited 0")
		}
	}
	rec := j.latest(t)
	last := steps1[len(steps1)-1].step
	if rec.Step%3 != 0 || rec.Step > int64(last) || int64(last)-rec.Step >= 3+1 {
		t.Fatalf("committed %+v; last logged step %d with --ckpt-every 3", rec, last)
	}
	j.mu.Lock()
	n := len(j.stopping)
	j.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d ranks reported stopping while ignoring the signal", n)
	}

	g2 := j.start(t, 3, rec)
	steps2 := g2.wait(t, true)
	checkResumed(t, steps2, rec.Step, 3)
	if steps2[len(steps2)-1].step != total {
		t.Fatalf("job ended at step %d, want %d", steps2[len(steps2)-1].step, total)
	}
	j.checkLosses(t, append(steps1, steps2...))
}

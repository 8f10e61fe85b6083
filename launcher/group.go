// Package launcher runs one node's training workers the way torchrun does:
// each worker in its own process group with torchrun's environment, console
// output as torchrun's (inherited, or line-prefixed "[default0]:" when teed), redirects and tee to per-attempt log
// files, torch's error.json files read back for the root cause, and
// shutdown that escalates to SIGKILL and leaves no process behind.
package launcher

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Group is the running workers of one attempt on this node.
type Group struct {
	spec     Spec
	asg      Assignment
	dir      string // attempt dir, "" when no log dir
	workers  []*worker
	exited   chan struct{} // closed when every worker has exited
	failed   chan struct{} // closed at the first failed worker
	failOnce sync.Once

	filteredOut, filteredErr *lockedFile // torch 2.x duplicate filters
	numaCPUs                 [][]int     // per local rank, with --numa-binding
	numactl                  string      // numactl's path, "" for sched_setaffinity
	wd                       *Watchdog   // guards the workers' process groups; may be nil
	onSpawn                  func(pid, localRank int)

	mu       sync.Mutex
	stopping bool // failures after Stop began are not the workers' own
	failures []Failure
}

type worker struct {
	localRank, rank int
	pid             int
	errorFile       string
	done            chan struct{} // closed after exit and output drained
	exit            exitInfo
	exitTime        time.Time
	output          sync.WaitGroup
	pipes           []*os.File // read ends, closed after drain
}

// consoleMu serialises console writes so lines from workers never interleave.
var consoleMu sync.Mutex

// StartOption configures Start.
type StartOption func(*Group)

// GuardedBy puts every worker's process group under wd from the moment it
// is spawned until it has exited: wd kills them if its deadline passes
// (see Watchdog). The caller keeps wd and closes it.
func GuardedBy(wd *Watchdog) StartOption { return func(g *Group) { g.wd = wd } }

// OnSpawn calls f with each worker's pid (its process group id) and local
// rank right
// after it is spawned, before the next one is.
func OnSpawn(f func(pid, localRank int)) StartOption { return func(g *Group) { g.onSpawn = f } }

// Start spawns spec.NProcPerNode workers for one attempt.
func Start(spec Spec, a Assignment, opts ...StartOption) (*Group, error) {
	if err := spec.validate(a); err != nil {
		return nil, err
	}
	if spec.Stdout == nil {
		spec.Stdout = os.Stdout
	}
	if spec.Stderr == nil {
		spec.Stderr = os.Stderr
	}
	if spec.Role == "" {
		spec.Role = "default"
	}
	if spec.Host == "" {
		spec.Host, _ = os.Hostname()
	}
	g := &Group{spec: spec, asg: a, exited: make(chan struct{}), failed: make(chan struct{})}
	for _, o := range opts {
		o(g)
	}
	if g.wd != nil {
		g.wd.Reset()
	}
	if spec.LogDir != "" {
		g.dir = filepath.Join(spec.LogDir, "attempt_"+strconv.Itoa(a.Attempt))
	}
	base := envMap(os.Environ())
	for k, v := range spec.Env {
		base[k] = v
	}
	for k, v := range a.Env {
		base[k] = v
	}
	if a.Prewarm {
		// Not even an inherited RANK: a prewarmed worker holds none.
		for _, k := range RoundEnv {
			delete(base, k)
		}
	}
	argv := spec.argv()
	path, err := lookPath(argv[0])
	if err != nil {
		return nil, err
	}
	if spec.NUMABinding != "" {
		if g.numaCPUs, _, err = NUMAPlan(spec.NUMABinding, spec.NProcPerNode); err != nil {
			return nil, err
		}
		g.numactl = numactlPath()
	}
	teedOut, teedErr := false, false
	for lr := 0; lr < spec.NProcPerNode; lr++ {
		teedOut = teedOut || spec.Tee.For(lr).Has(StdOut)
		teedErr = teedErr || spec.Tee.For(lr).Has(StdErr)
	}
	if g.filteredOut, err = openFiltered(g.dir, "filtered_stdout.log", spec.DuplicateStdoutFilters, teedOut); err != nil {
		return nil, err
	}
	if g.filteredErr, err = openFiltered(g.dir, "filtered_stderr.log", spec.DuplicateStderrFilters, teedErr); err != nil {
		g.filteredOut.close()
		return nil, err
	}
	for lr := 0; lr < spec.NProcPerNode; lr++ {
		w, err := g.startWorker(path, argv, base, lr)
		if err != nil {
			g.Stop(syscall.SIGKILL, 0)
			return nil, err
		}
		g.workers = append(g.workers, w)
	}
	go g.monitor()
	return g, nil
}

func lookPath(name string) (string, error) {
	if filepath.Base(name) != name {
		return name, nil
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("cannot run %q: not found on PATH (set PYTHON_EXEC for the Python interpreter, or give a path)", name)
}

func (g *Group) startWorker(path string, argv []string, base map[string]string, lr int) (*worker, error) {
	w := &worker{localRank: lr, rank: g.asg.BaseRank + lr, done: make(chan struct{})}
	if g.asg.Prewarm {
		w.rank = -1 // none until Reassign
	}
	var rankDir string
	if g.dir != "" {
		rankDir = filepath.Join(g.dir, strconv.Itoa(lr))
		if err := os.MkdirAll(rankDir, 0o755); err != nil {
			return nil, fmt.Errorf("create log dir: %w", err)
		}
		w.errorFile = filepath.Join(rankDir, "error.json")
		// An attempt's directory is reused after a membership change: an
		// earlier group's error file must not be read as this one's.
		if err := os.Remove(w.errorFile); err != nil && !os.IsNotExist(err) {
			return nil, fmt.Errorf("remove the previous error file: %w", err)
		}
	}
	layers := []map[string]string{base}
	if g.spec.RankEnv != nil {
		layers = append(layers, g.spec.RankEnv(lr))
	}
	layers = append(layers, g.spec.WorkerEnv(g.asg, lr, w.errorFile))
	env := mergeEnv(layers...)

	s := g.newWorkerStreams(w, lr, rankDir)
	defer s.closeAfterStart()
	stdout, err := s.stream(StdOut, "stdout.log", g.spec.Stdout, g.filteredOut)
	if err != nil {
		return nil, err
	}
	stderr, err := s.stream(StdErr, "stderr.log", g.spec.Stderr, g.filteredErr)
	if err != nil {
		return nil, err
	}
	attr := &syscall.ProcAttr{
		Env:   env,
		Files: []uintptr{os.Stdin.Fd(), stdout.Fd(), stderr.Fd()},
		Sys: &syscall.SysProcAttr{
			Setpgid: true,
			// A worker must not outlive its agent: if hyperpodrun dies
			// (even SIGKILLed), the kernel kills the worker, so a new round
			// can never meet a stale holder of the same rank.
			Pdeathsig: syscall.SIGKILL,
		},
	}
	reap.mu.Lock() // hold off the reaper's delivery until we registered
	pid, err := g.forker(path, argv, attr, lr)()
	reap.mu.Unlock()
	if err != nil {
		for _, r := range w.pipes {
			r.Close()
		}
		return nil, fmt.Errorf("start worker %d (%s): %w", lr, path, err)
	}
	w.pid = pid
	if g.wd != nil {
		// An error means the watchdog is gone; the agent notices
		// (Watchdog.Alive) and starts another for its next workers.
		_ = g.wd.Guard(pid)
	}
	if g.onSpawn != nil {
		g.onSpawn(pid, lr)
	}
	go g.awaitExit(w, reap.wait(pid))
	return w, nil
}

// forker returns how local rank lr's worker is started: a plain fork and
// exec, or bound to its NUMA node's CPUs (through numactl when there is
// one).
func (g *Group) forker(path string, argv []string, attr *syscall.ProcAttr, lr int) func() (int, error) {
	fork := func() (int, error) { return syscall.ForkExec(path, argv, attr) }
	if g.numaCPUs == nil {
		return fork
	}
	cpus := g.numaCPUs[lr]
	if g.numactl != "" {
		bound := append([]string{g.numactl, "--physcpubind=" + formatCPUList(cpus)}, argv...)
		return func() (int, error) { return syscall.ForkExec(g.numactl, bound, attr) }
	}
	return func() (int, error) { return forkExecBound(cpus, fork) }
}

// awaitExit waits for worker w's exit, cleans up after it (what it left in
// its process group, its output pipes, the watchdog's guard), records a
// failure of its own and closes w.done.
func (g *Group) awaitExit(w *worker, exitCh <-chan exitInfo) {
	w.exit = <-exitCh
	w.exitTime = time.Now()
	// Whether this exit is the worker's own failure is decided now: once
	// Stop began, exits are caused by us.
	g.mu.Lock()
	ownExit := !g.stopping
	g.mu.Unlock()
	// Kill whatever the worker left in its process group (forked
	// children) so the pipes reach EOF and nothing outlives it.
	syscall.Kill(-w.pid, syscall.SIGKILL)
	if g.wd != nil {
		_ = g.wd.Release(w.pid)
	}
	drained := make(chan struct{})
	go func() { w.output.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(5 * time.Second):
		// A descendant that left the group still holds the pipe.
		for _, r := range w.pipes {
			r.Close()
		}
		<-drained
	}
	for _, r := range w.pipes {
		r.Close()
	}
	if ownExit && !w.succeeded() {
		g.recordFailure(w)
	}
	close(w.done)
}

// workerStreams sets up one worker's stdout and stderr.
type workerStreams struct {
	w           *worker
	rankDir     string
	prefix      []byte
	showConsole bool
	redir, tee  Std
	// toClose: our copies of the files the child gets, closed once it
	// started.
	toClose []*os.File
}

func (g *Group) newWorkerStreams(w *worker, lr int, rankDir string) *workerStreams {
	s := &workerStreams{
		w:           w,
		rankDir:     rankDir,
		prefix:      []byte(g.linePrefix(lr)),
		showConsole: g.spec.RanksFilter == nil || g.spec.RanksFilter[lr],
		redir:       g.spec.Redirects.For(lr),
		tee:         g.spec.Tee.For(lr),
	}
	if g.dir == "" {
		s.redir, s.tee = StdNone, StdNone
	}
	return s
}

func (s *workerStreams) closeAfterStart() {
	for _, f := range s.toClose {
		f.Close()
	}
}

// stream sets up one of stdout (1) / stderr (2), as torchrun does: a
// file passed straight to the child when redirected; a pipe we copy to
// the file and (prefixed) to the console when teed; else the console
// itself, inherited (torchrun's workers write to its own stdout/stderr,
// so a terminal stays a terminal and lines are not prefixed).
func (s *workerStreams) stream(which Std, name string, console io.Writer, filtered *lockedFile) (*os.File, error) {
	var file *os.File
	if s.redir.Has(which) || s.tee.Has(which) {
		f, err := os.OpenFile(filepath.Join(s.rankDir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("open worker log: %w", err)
		}
		if s.redir.Has(which) && !s.tee.Has(which) {
			s.toClose = append(s.toClose, f)
			return f, nil // file only: the child writes it directly
		}
		file = f
	}
	var out io.Writer
	if s.showConsole {
		out = console
	}
	if file == nil {
		if f, ok := out.(*os.File); ok {
			return f, nil // inherited: the worker writes to our console
		}
		if out == nil {
			f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
			if err != nil {
				return nil, fmt.Errorf("open %s: %w", os.DevNull, err)
			}
			s.toClose = append(s.toClose, f)
			return f, nil
		}
	}
	r, wr, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create pipe: %w", err)
	}
	s.toClose = append(s.toClose, wr)
	w := s.w
	w.pipes = append(w.pipes, r)
	w.output.Add(1)
	go func() {
		defer w.output.Done()
		if file == nil {
			// Not teed: the console as the worker wrote it, unprefixed.
			io.Copy(out, r)
			return
		}
		copyLines(r, file, out, s.prefix, filtered)
		file.Close()
	}()
	return wr, nil
}

// copyLines copies r line by line to file (as is), console (prefixed) and,
// for lines matching its filters, filtered (prefixed).
func copyLines(r io.Reader, file io.Writer, console io.Writer, prefix []byte, filtered *lockedFile) {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if file != nil {
				file.Write(line)
			}
			complete := line[len(line)-1] == '\n' || errors.Is(err, bufio.ErrBufferFull)
			if console != nil {
				// One write per line: a worker writing straight to the
				// same terminal (an untee'd stream) cannot land between
				// the prefix and its line.
				buf = append(append(buf[:0], prefix...), line...)
				if !complete {
					buf = append(buf, '\n')
				}
				consoleMu.Lock()
				console.Write(buf)
				consoleMu.Unlock()
			}
			filtered.writeIfMatch(prefix, line, complete)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// lockedFile is a file shared by every worker of the attempt (torch 2.x's
// filtered_stdout.log / filtered_stderr.log), with the filter strings.
type lockedFile struct {
	mu      sync.Mutex
	f       *os.File
	filters [][]byte
}

func (l *lockedFile) writeIfMatch(prefix, line []byte, complete bool) {
	if l == nil {
		return
	}
	for _, f := range l.filters {
		if bytes.Contains(line, f) {
			l.mu.Lock()
			l.f.Write(prefix)
			l.f.Write(line)
			if !complete {
				l.f.Write([]byte{'\n'})
			}
			l.mu.Unlock()
			return
		}
	}
}

func (l *lockedFile) close() {
	if l != nil {
		l.f.Close()
	}
}

// openFiltered opens <dir>/name for the filters of a teed stream, or
// returns nil when there are no filters or nothing is teed.
func openFiltered(dir, name string, filters []string, teed bool) (*lockedFile, error) {
	if dir == "" || len(filters) == 0 || !teed {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create log dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	l := &lockedFile{f: f}
	for _, s := range filters {
		l.filters = append(l.filters, []byte(s))
	}
	return l, nil
}

// linePrefix is the console prefix of a teed line of local rank lr.
func (g *Group) linePrefix(lr int) string {
	t := g.spec.LinePrefixTemplate
	if t == "" {
		return "[" + g.spec.Role + strconv.Itoa(lr) + "]:"
	}
	// Python's string.Template.safe_substitute: $name and ${name}; unknown
	// names are left as they are.
	vals := map[string]string{
		"role_name":     g.spec.Role,
		"rank":          strconv.Itoa(g.asg.BaseRank + lr),
		"local_rank":    strconv.Itoa(lr),
		"group_rank":    strconv.Itoa(g.asg.GroupRank),
		"restart_count": strconv.Itoa(g.asg.RestartCount),
	}
	out := os.Expand(strings.ReplaceAll(t, "$$", "\x00"), func(k string) string {
		if v, ok := vals[k]; ok {
			return v
		}
		return "${" + k + "}"
	})
	return strings.ReplaceAll(out, "\x00", "$")
}

func (w *worker) succeeded() bool {
	return w.exit.status.Exited() && w.exit.status.ExitStatus() == 0
}

func (g *Group) recordFailure(w *worker) {
	g.mu.Lock()
	f := Failure{
		LocalRank: w.localRank, Rank: w.rank, PID: w.pid, Host: g.spec.Host, // under g.mu: Reassign changes rank
		Time: w.exitTime, ErrorFile: w.errorFile,
	}
	if w.exit.status.Signaled() {
		f.Signal = w.exit.status.Signal()
		f.ExitCode = -int(f.Signal)
	} else {
		f.ExitCode = w.exit.status.ExitStatus()
	}
	f.readErrorFile()
	g.failures = append(g.failures, f)
	g.mu.Unlock()
	g.failOnce.Do(func() { close(g.failed) })
}

func (g *Group) monitor() {
	for _, w := range g.workers {
		<-w.done
	}
	g.filteredOut.close()
	g.filteredErr.close()
	close(g.exited)
}

// Exited is closed when every worker has exited and its output is drained.
func (g *Group) Exited() <-chan struct{} { return g.exited }

// Failed is closed when the first worker fails (non-zero exit or signal).
func (g *Group) Failed() <-chan struct{} { return g.failed }

// Signal sends sig to every live worker's process group.
func (g *Group) Signal(sig syscall.Signal) {
	for _, w := range g.workers {
		select {
		case <-w.done:
		default:
			syscall.Kill(-w.pid, sig)
		}
	}
}

// Stop ends every worker: sig to each process group, then SIGKILL after
// timeout. It returns when all have exited. Exits caused by Stop are not
// recorded as failures.
func (g *Group) Stop(sig syscall.Signal, timeout time.Duration) {
	g.mu.Lock()
	g.stopping = true
	g.mu.Unlock()
	if len(g.workers) == 0 {
		return
	}
	g.Signal(sig)
	if sig != syscall.SIGKILL {
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-g.exited:
			return
		case <-t.C:
		}
	}
	g.Signal(syscall.SIGKILL)
	<-g.exited
}

// Result reports how the attempt ended. Call it after Exited is closed.
func (g *Group) Result() Result {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := Result{Failures: append([]Failure(nil), g.failures...)}
	sort.Slice(r.Failures, func(i, j int) bool { return r.Failures[i].Rank < r.Failures[j].Rank })
	for i := range r.Failures {
		if r.RootCause == nil || r.Failures[i].Time.Before(r.RootCause.Time) {
			r.RootCause = &r.Failures[i]
		}
	}
	for _, w := range g.workers {
		if ru := w.exit.rusage.Maxrss; ru > r.MaxRSSKiB {
			r.MaxRSSKiB = ru
		}
	}
	return r
}

// Reassigned is one live worker's part of a new assignment (Reassign).
type Reassigned struct {
	PID, LocalRank, Rank int
	// Env is the worker's torchrun environment under the new assignment
	// (RANK, WORLD_SIZE, MASTER_ADDR/PORT, ...) plus the assignment's Env.
	Env map[string]string
}

// Reassign gives the group's running workers a new assignment without
// restarting them (in-process resize): it records the new ranks (failure
// summaries name them) and returns each live worker's environment under a,
// which the caller hands to the worker. Workers that have exited are left
// out; ok is false then (the group cannot be carried over whole).
func (g *Group) Reassign(a Assignment) (out []Reassigned, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asg = a
	ok = true
	for _, w := range g.workers {
		select {
		case <-w.done:
			ok = false
			continue
		default:
		}
		w.rank = a.BaseRank + w.localRank
		env := g.spec.WorkerEnv(a, w.localRank, w.errorFile)
		for k, v := range a.Env {
			env[k] = v
		}
		out = append(out, Reassigned{PID: w.pid, LocalRank: w.localRank, Rank: w.rank, Env: env})
	}
	return out, ok
}

// PIDs lists the workers that have not exited (each is its own process
// group's leader).
func (g *Group) PIDs() []int {
	var out []int
	for _, w := range g.workers {
		select {
		case <-w.done:
		default:
			out = append(out, w.pid)
		}
	}
	return out
}

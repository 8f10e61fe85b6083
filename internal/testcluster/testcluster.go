// Package testcluster runs several hyperpodrun nodes as real processes on
// one machine and follows rank 0's "step=N world_size=W loss=L" lines, for
// end-to-end tests and the recovery/scale benchmarks.
package testcluster

import (
	"bufio"
	"fmt"
	"github.com/hyperpodrun/hyperpodrun/launcher"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Step is one step line of a rank 0.
type Step struct {
	Node  string
	Step  int
	World int
	Loss  float64
	At    time.Time
}

// Line is one output line of a node with the time it was read.
type Line struct {
	Node string
	Text string
	At   time.Time
}

var stepRE = regexp.MustCompile(`step=(\d+) world_size=(\d+) loss=([0-9.eE+-]+)`)

// Cluster runs hyperpodrun nodes sharing one command line.
type Cluster struct {
	Binary string
	Args   []string
	Env    []string

	mu    sync.Mutex
	steps []Step
	lines []Line
	logs  map[string]*strings.Builder
	nodes map[string]*exec.Cmd
	waits map[string]chan struct{}
}

// New returns a cluster running binary with args on every node.
func New(binary string, env []string, args ...string) *Cluster {
	return &Cluster{Binary: binary, Args: args, Env: env, logs: map[string]*strings.Builder{},
		nodes: map[string]*exec.Cmd{}, waits: map[string]chan struct{}{}}
}

// Start launches node name in its own process group.
func (c *Cluster) Start(name string) error {
	cmd := exec.Command(c.Binary, c.Args...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return err
	}
	c.mu.Lock()
	b := &strings.Builder{}
	c.logs[name+"#"+strconv.Itoa(len(c.logs))] = b
	c.nodes[name] = cmd
	done := make(chan struct{})
	c.waits[name] = done
	c.mu.Unlock()
	go func() { cmd.Wait(); pw.Close(); close(done) }()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line, now := sc.Text(), time.Now()
			c.mu.Lock()
			b.WriteString(line + "\n")
			c.lines = append(c.lines, Line{name, line, now})
			// Rank 0's step lines: unprefixed, as torchrun prints a worker's
			// output, or "[default0]:" when teed.
			if m := stepRE.FindStringSubmatch(line); m != nil && (strings.HasPrefix(line, "step=") || strings.HasPrefix(line, "[default0]:")) {
				s, _ := strconv.Atoi(m[1])
				w, _ := strconv.Atoi(m[2])
				l, _ := strconv.ParseFloat(m[3], 64)
				c.steps = append(c.steps, Step{name, s, w, l, now})
			}
			c.mu.Unlock()
		}
		io.Copy(io.Discard, pr)
	}()
	return nil
}

// PID returns the hyperpodrun pid of a running node (0 if none).
func (c *Cluster) PID(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cmd := c.nodes[name]; cmd != nil {
		return cmd.Process.Pid
	}
	return 0
}

// Running lists the names of the nodes started and not yet killed or waited.
func (c *Cluster) Running() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for n := range c.nodes {
		out = append(out, n)
	}
	return out
}

// Kill SIGKILLs a node's hyperpodrun (its workers die with it through
// Pdeathsig) and waits for it.
func (c *Cluster) Kill(name string) {
	c.mu.Lock()
	cmd, done := c.nodes[name], c.waits[name]
	delete(c.nodes, name)
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// KillAll kills every node.
func (c *Cluster) KillAll() {
	for _, n := range c.Running() {
		c.Kill(n)
	}
}

// Wait waits for a node to exit and returns its exit code.
func (c *Cluster) Wait(name string, timeout time.Duration) (int, error) {
	c.mu.Lock()
	done, cmd := c.waits[name], c.nodes[name]
	c.mu.Unlock()
	if cmd == nil {
		return 0, fmt.Errorf("node %s is not running", name)
	}
	select {
	case <-done:
	case <-time.After(timeout):
		return 0, fmt.Errorf("node %s did not exit within %s", name, timeout)
	}
	c.mu.Lock()
	delete(c.nodes, name)
	c.mu.Unlock()
	return cmd.ProcessState.ExitCode(), nil
}

// WaitStep waits for a step line after since that satisfies cond.
func (c *Cluster) WaitStep(timeout time.Duration, since time.Time, cond func(Step) bool) (Step, error) {
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		for _, s := range c.steps {
			if s.At.After(since) && cond(s) {
				c.mu.Unlock()
				return s, nil
			}
		}
		c.mu.Unlock()
		if time.Now().After(deadline) {
			return Step{}, fmt.Errorf("timed out after %s", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Steps returns every step line so far.
func (c *Cluster) Steps() []Step {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Step(nil), c.steps...)
}

// Lines returns every output line so far.
func (c *Cluster) Lines() []Line {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Line(nil), c.lines...)
}

// Logs returns each node run's output.
func (c *Cluster) Logs() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]string{}
	for k, b := range c.logs {
		out[k] = b.String()
	}
	return out
}

// ChildPIDs lists the live (non-zombie) children of pid.
var ChildPIDs = launcher.ChildPIDs

// Alive reports whether pid is a live, non-zombie process.
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

// TorchPython returns a Python with torch.distributed ($TORCH_PYTHON, then
// /usr/bin/python3), or "".
func TorchPython() string {
	for _, py := range []string{os.Getenv("TORCH_PYTHON"), "/usr/bin/python3"} {
		if py != "" && exec.Command(py, "-c", "import torch.distributed").Run() == nil {
			return py
		}
	}
	return ""
}

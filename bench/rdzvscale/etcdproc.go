package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdembed"
)

// etcd in a process of its own (-etcd-process): a deployment never runs
// etcd in its clients' process, and in one process the 10,000 simulated
// nodes' garbage collections stop etcd too. The bench runs itself again
// as the server ($RDZVSCALE_SERVE_ETCD=1: an embedded etcd, fsync off, that
// prints its endpoint and lives until its stdin closes; with
// $RDZVSCALE_SERVE_ETCD_CPUPROFILE, it writes its CPU profile there), reads etcd's CPU
// time from /proc and its counters from its /metrics.

const serveEnv = "RDZVSCALE_SERVE_ETCD"

// serveEtcd is the child's main: it starts etcd, prints "ENDPOINT <url>",
// and stops etcd once stdin reaches EOF.
func serveEtcd() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	srv, err := etcdembed.Start(ctx, etcdembed.Options{UnsafeNoFsync: true})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdzvscale etcd: %v\n", err)
		return 1
	}
	if path := os.Getenv(serveEnv + "_CPUPROFILE"); path != "" {
		if f, err := os.Create(path); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				defer func() { pprof.StopCPUProfile(); f.Close() }()
			}
		}
	}
	fmt.Printf("ENDPOINT %s\n", srv.Endpoints[0])
	_, _ = io.Copy(io.Discard, os.Stdin)
	srv.Close()
	return 0
}

// etcdServer is the etcd a size runs against: in this process or another.
type etcdServer struct {
	endpoints []string
	embedded  *etcdembed.Server // in this process
	cmd       *exec.Cmd         // in a process of its own
	stdin     io.Closer
}

// startEtcd starts one etcd for a size, in a process of its own when
// process is set.
func startEtcd(ctx context.Context, process bool) (*etcdServer, error) {
	if !process {
		srv, err := etcdembed.Start(ctx, etcdembed.Options{UnsafeNoFsync: true})
		if err != nil {
			return nil, err
		}
		return &etcdServer{endpoints: srv.Endpoints, embedded: srv}, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), serveEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start etcd process: %w", err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	ep, ok := strings.CutPrefix(strings.TrimSpace(line), "ENDPOINT ")
	if err != nil || !ok {
		stdin.Close()
		_ = cmd.Wait()
		return nil, fmt.Errorf("etcd process: no endpoint (read %q: %v)", line, err)
	}
	return &etcdServer{endpoints: []string{ep}, cmd: cmd, stdin: stdin}, nil
}

// Close stops etcd and waits for it.
func (s *etcdServer) Close() {
	if s.embedded != nil {
		s.embedded.Close()
		return
	}
	s.stdin.Close()
	_ = s.cmd.Wait()
}

// cpu is the etcd process's CPU time so far (0 in this process: it is
// counted with the nodes').
func (s *etcdServer) cpu() time.Duration {
	if s.cmd == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command's name (which may hold spaces) in
	// parentheses: utime and stime are the 14th and 15th of the line.
	rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const clockTick = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clockTick
}

// gather is the etcd server's metrics: this process's registry, or the
// process's /metrics.
func (s *etcdServer) gather() ([]*dto.MetricFamily, error) {
	if s.cmd == nil {
		return prometheus.DefaultGatherer.Gather()
	}
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(s.endpoints[0] + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	m, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := make([]*dto.MetricFamily, 0, len(m))
	for _, mf := range m {
		out = append(out, mf)
	}
	slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out, nil
}

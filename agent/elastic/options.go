// Package elastic is hyperpodrun's elastic agent, the part of the
// hyperpodrun process (one per node of one job) that plays torch's
// elastic agent: it turns a rendezvous decision into running workers
// (package launcher), restarts them on failure, and (elastic mode) follows
// the job through rounds on etcd, announcing planned changes to its workers
// through the scale sync signal (package checkpoint).
//
// It is not the node agent: that is package agent/node/nodeagent (the
// hyperpod-agent daemon, one per node for the whole fleet), whose runner
// (agent/node/jobrunner) starts this package's hyperpodrun for each job the
// coordinator places on its node.
package elastic

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hyperpodrun/hyperpodrun/launcher"
)

// Options is everything hyperpodrun's command line decides.
type Options struct {
	Spec launcher.Spec

	MinNodes, MaxNodes int
	RdzvBackend        string // static, etcd (etcd-v2 is an alias: etcd v3 serves it)
	// RegisterTimeout bounds how long a node that lost etcd keeps trying
	// to rejoin (0: the join timeout).
	RegisterTimeout time.Duration
	RdzvEndpoint    string
	RdzvID          string
	RdzvConf        string
	Standalone      bool
	MaxRestarts     int
	MonitorInterval time.Duration
	NodeRank        int
	MasterAddr      string
	MasterPort      int
	LocalAddr       string
	BaseLogDir      string // --log-dir; empty means a fresh temporary dir

	ShutdownSignal  syscall.Signal // sent to workers when hyperpodrun stops them itself
	ShutdownTimeout time.Duration  // then SIGKILL
	GracefulTimeout time.Duration  // planned changes: wait for workers to checkpoint and exit
	ElasticSignal   syscall.Signal // announces a planned change (SIGUSR1)

	// NoAgentStore: workers create their own TCPStore on rank 0, as
	// torchrun without an agent store; otherwise the node holding group
	// rank 0 serves the round's TCPStore (c10dstore) before any worker
	// starts, and workers get TORCHELASTIC_USE_AGENT_STORE=True.
	NoAgentStore bool

	// InProcessResize keeps the workers of nodes that stay alive across a
	// planned change (and a lost member): they leave their process group,
	// ask for their next assignment on the control channel
	// (hyperpodrun_elastic.reconfigure()) and re-form the group on the next
	// round's store, instead of exiting and being restarted. Workers that
	// do not ask within --graceful-timeout are restarted as without it.
	InProcessResize bool
	// PrewarmTimeout, with InProcessResize, lets a node that joins a job
	// already training start its workers before it registers (they import
	// torch and wait for their first assignment on the control channel),
	// so the survivors stop only once the new workers are ready; after
	// PrewarmTimeout the node registers anyway. Zero: no prewarm (the
	// workers start after the round, as on the restart path).
	PrewarmTimeout time.Duration

	// HangTimeout (--hang-timeout) is how long a worker that sent a
	// heartbeat (the Python helper's, from elastic_event_detected()) may go
	// without the next before it is taken for hung: its stacks are dumped
	// into the log directory and the node's workers fail (hang.go). Zero:
	// not watched.
	HangTimeout time.Duration
	// HangStartupTimeout (--hang-startup-timeout) is how long after its
	// round's start a worker may go without its first heartbeat before it
	// is taken for hung, when the worker of its local rank sent heartbeats
	// in an earlier round or attempt of this hyperpodrun (its loop calls
	// the helper; hang.go). Zero: start-up not watched. Without a
	// HangTimeout the workers send no heartbeats and nothing is watched.
	HangStartupTimeout time.Duration

	PreTrain  []string // script and args, run once before the first start
	PostTrain []string // run after the workers succeed

	// Signals delivers the signals hyperpodrun received (SIGTERM, SIGINT,
	// SIGHUP, SIGQUIT); they are forwarded to the workers.
	Signals <-chan os.Signal
	Logger  *slog.Logger
	Stderr  io.Writer
}

// ParseNNodes parses --nnodes: "N" or "MIN:MAX".
func ParseNNodes(v string) (min, max int, err error) {
	lo, hi, ranged := strings.Cut(strings.TrimSpace(v), ":")
	min, err1 := strconv.Atoi(lo)
	max = min
	var err2 error
	if ranged {
		max, err2 = strconv.Atoi(hi)
	}
	switch {
	case err1 != nil || err2 != nil:
		return 0, 0, fmt.Errorf("--nnodes %q: want a node count like 2 or a range MIN:MAX like 1:4", v)
	case min < 1:
		return 0, 0, fmt.Errorf("--nnodes %q: the minimum must be at least 1", v)
	case max < min:
		return 0, 0, fmt.Errorf("--nnodes %q: the maximum %d is below the minimum %d; write MIN:MAX, e.g. %d:%d", v, max, min, max, min)
	}
	return min, max, nil
}

// RunLogDir creates the run's log directory as torchrun does:
// <base>/<run-id>_<random> (base defaults to a fresh torchelastic_<random>
// directory under the system's temporary directory), so a run never
// mixes its files with an earlier one's. Attempts go under it as
// attempt_<restart count>/<local rank>/.
func RunLogDir(base, runID string) (string, error) {
	if base == "" {
		d, err := os.MkdirTemp("", "torchelastic_")
		if err != nil {
			return "", fmt.Errorf("create log dir: %w", err)
		}
		base = d
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", fmt.Errorf("create log dir %s: %w (choose another --log-dir)", base, err)
	}
	name, err := os.MkdirTemp(base, runID+"_")
	if err != nil {
		return "", fmt.Errorf("create log dir under %s: %w (choose another --log-dir)", base, err)
	}
	return name, nil
}

// RandomID returns a random run id for --standalone (torchrun uses a uuid4).
func RandomID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// FreePort asks the kernel for a free TCP port on addr.
func FreePort(addr string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// splitHostPort splits "host:port"; a bare host keeps defPort.
func splitHostPort(ep string, defPort int) (string, int, error) {
	host, p, err := net.SplitHostPort(ep)
	if err != nil {
		return ep, defPort, nil
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("%q: the port must be a number 0-65535", ep)
	}
	return host, port, nil
}

// defaults fills what a library caller may leave unset. Zero timeouts are
// kept: they mean "do not wait".
func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ShutdownSignal == 0 {
		o.ShutdownSignal = syscall.SIGTERM
	}
	if o.ElasticSignal == 0 {
		o.ElasticSignal = syscall.SIGUSR1
	}
}

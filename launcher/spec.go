package launcher

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Spec describes the workers of one node: what to run and how. It stays the
// same across restarts and rounds; Assignment carries what changes.
type Spec struct {
	// Entrypoint is the training script, module (Module) or program (NoPython).
	Entrypoint string
	// Args are passed to the entrypoint untouched.
	Args []string
	// Module runs the entrypoint as "python -m".
	Module bool
	// NoPython runs the entrypoint directly instead of through Python.
	NoPython bool
	// RunPath runs the entrypoint through runpy.run_path, like torchrun --run-path.
	RunPath bool
	// PythonExec is the interpreter (torchrun: $PYTHON_EXEC, else sys.executable).
	PythonExec string
	// NProcPerNode is the number of local workers.
	NProcPerNode int
	// Role is the worker role name (torchrun's --role, "default").
	Role string
	// RunID is TORCHELASTIC_RUN_ID (the rendezvous id).
	RunID string
	// MaxRestarts is reported to workers as TORCHELASTIC_MAX_RESTARTS.
	MaxRestarts int
	// LogDir is the run's log directory (<log-dir>/<run-id>); empty keeps
	// no files: no redirects, tee or error files then.
	LogDir string
	// Redirects sends a local rank's streams to files only.
	Redirects StdSpec
	// Tee sends a local rank's streams to files and the console.
	Tee StdSpec
	// RanksFilter limits console output to these local ranks (nil: all).
	RanksFilter map[int]bool
	// Env is extra environment given to every worker. It overrides the
	// inherited environment; the torchrun variables override it.
	Env map[string]string
	// RankEnv, when set, adds environment for one local rank (device
	// pinning: CUDA_VISIBLE_DEVICES or NEURON_RT_VISIBLE_CORES).
	RankEnv func(localRank int) map[string]string
	// Stdout and Stderr are the console (default os.Stdout/os.Stderr). A
	// stream that is neither redirected nor teed is the worker's own when
	// the console is an *os.File: the worker inherits it (a terminal stays a
	// terminal), as under torchrun.
	Stdout, Stderr io.Writer
	// LinePrefixTemplate is torch 2.x's --log-line-prefix-template: the
	// prefix of teed console lines, with ${role_name}, ${rank},
	// ${local_rank}, ${group_rank} and ${restart_count} substituted. Empty:
	// "[${role_name}${local_rank}]:", torchrun's.
	LinePrefixTemplate string
	// DuplicateStdoutFilters and DuplicateStderrFilters (torch 2.x): teed
	// lines containing any of these strings are also written, prefixed, to
	// <attempt dir>/filtered_stdout.log / filtered_stderr.log (all ranks).
	DuplicateStdoutFilters, DuplicateStderrFilters []string
	// VirtualLocalRank gives every worker LOCAL_RANK=0 (torch 2.x
	// --virtual-local-rank); RankEnv gives each its one visible device.
	VirtualLocalRank bool
	// NUMABinding binds each worker's CPUs (torch 2.x --numa-binding: node,
	// socket, exclusive, core-complex), through numactl when it is on PATH,
	// else sched_setaffinity. Empty: no binding.
	NUMABinding string
	// Host is reported in failure summaries (default: the hostname).
	Host string
	// UseAgentStore is TORCHELASTIC_USE_AGENT_STORE: the elastic agent
	// serves the round's store on rank 0's node (true), unless
	// --no-agent-store; otherwise workers create it on global rank 0.
	UseAgentStore bool
	// ShutdownTimeout is how long Stop waits after the first signal before
	// SIGKILL (default 30s, torchrun's).
	ShutdownTimeout time.Duration
}

// Assignment is what a rendezvous round decided for this node's workers.
type Assignment struct {
	GroupRank      int // this node's rank (GROUP_RANK)
	GroupWorldSize int // number of nodes (GROUP_WORLD_SIZE)
	BaseRank       int // global rank of local rank 0
	WorldSize      int // total workers (WORLD_SIZE)
	MasterAddr     string
	MasterPort     int
	RestartCount   int // TORCHELASTIC_RESTART_COUNT
	// Attempt numbers the log directory attempt_<n>: the job's restart
	// count, as torchrun numbers it, so workers started again after a
	// membership change (no restart) write into the same attempt's files
	// (appending; a stale error.json is removed first).
	Attempt int
	// Env is added to every worker for this attempt only (checkpoint to
	// resume from, TRACEPARENT, the control channel).
	Env map[string]string
	// Prewarm starts workers ahead of their round (in-process resize: a
	// joining node's workers start Python and import torch before the
	// node registers): they get no rank, world size, master or restart
	// count (none of RoundEnv's variables, not even inherited ones) and
	// wait for their first assignment (Group.Reassign) on the control
	// channel. The rank fields above are ignored.
	Prewarm bool
}

// RoundEnv lists the variables of WorkerEnv that depend on the round
// (a prewarmed worker has none of them until it is assigned).
var RoundEnv = []string{"RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE",
	"ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"}

// Validate reports a problem with the spec or assignment as a clear error.
func (s *Spec) validate(a Assignment) error {
	switch {
	case s.Entrypoint == "":
		return fmt.Errorf("no training script given: usage is hyperpodrun [options] script.py [script args]")
	case s.NProcPerNode < 1:
		return fmt.Errorf("--nproc-per-node must be at least 1, got %d", s.NProcPerNode)
	case a.Prewarm:
		return nil // no ranks yet
	case a.WorldSize < s.NProcPerNode:
		return fmt.Errorf("world size %d is smaller than the %d local workers", a.WorldSize, s.NProcPerNode)
	case a.BaseRank < 0 || a.BaseRank+s.NProcPerNode > a.WorldSize:
		return fmt.Errorf("ranks %d..%d do not fit world size %d", a.BaseRank, a.BaseRank+s.NProcPerNode-1, a.WorldSize)
	}
	return nil
}

// argv returns the worker's command line, the way torchrun builds it.
func (s *Spec) argv() []string {
	if s.NoPython {
		return append([]string{s.Entrypoint}, s.Args...)
	}
	py := s.PythonExec
	if py == "" {
		py = os.Getenv("PYTHON_EXEC")
	}
	if py == "" {
		py = "python3"
	}
	switch {
	case s.Module:
		return append([]string{py, "-u", "-m", s.Entrypoint}, s.Args...)
	case s.RunPath:
		// torchrun --run-path runs the script in-process with runpy; the
		// worker-side equivalent is runpy.run_path with the script's argv.
		code := "import runpy,sys; sys.argv=sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
		return append([]string{py, "-u", "-c", code, s.Entrypoint}, s.Args...)
	default:
		return append([]string{py, "-u", s.Entrypoint}, s.Args...)
	}
}

// WorkerEnv returns the environment variables hyperpodrun sets for one local
// worker, exactly torchrun's set (DESIGN.md), without the inherited
// environment. errorFile may be empty.
func (s *Spec) WorkerEnv(a Assignment, localRank int, errorFile string) map[string]string {
	rank := a.BaseRank + localRank
	role := s.Role
	if role == "" {
		role = "default"
	}
	env := map[string]string{
		"LOCAL_RANK":                      strconv.Itoa(localRank),
		"RANK":                            strconv.Itoa(rank),
		"GROUP_RANK":                      strconv.Itoa(a.GroupRank),
		"ROLE_RANK":                       strconv.Itoa(rank),
		"ROLE_NAME":                       role,
		"LOCAL_WORLD_SIZE":                strconv.Itoa(s.NProcPerNode),
		"WORLD_SIZE":                      strconv.Itoa(a.WorldSize),
		"GROUP_WORLD_SIZE":                strconv.Itoa(a.GroupWorldSize),
		"ROLE_WORLD_SIZE":                 strconv.Itoa(a.WorldSize),
		"MASTER_ADDR":                     a.MasterAddr,
		"MASTER_PORT":                     strconv.Itoa(a.MasterPort),
		"TORCHELASTIC_RESTART_COUNT":      strconv.Itoa(a.RestartCount),
		"TORCHELASTIC_MAX_RESTARTS":       strconv.Itoa(s.MaxRestarts),
		"TORCHELASTIC_RUN_ID":             s.RunID,
		"TORCHELASTIC_USE_AGENT_STORE":    pyBool(s.UseAgentStore),
		"TORCH_NCCL_ASYNC_ERROR_HANDLING": envOr("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
		// torch before 2.2 reads only the old name.
		"NCCL_ASYNC_ERROR_HANDLING": envOr("NCCL_ASYNC_ERROR_HANDLING", "1"),
		"TORCHELASTIC_ERROR_FILE":   errorFile,
	}
	if s.VirtualLocalRank {
		env["LOCAL_RANK"] = "0"
	}
	if a.Prewarm {
		for _, k := range RoundEnv {
			delete(env, k)
		}
	}
	if _, set := os.LookupEnv("OMP_NUM_THREADS"); !set && s.NProcPerNode > 1 {
		env["OMP_NUM_THREADS"] = "1"
	}
	return env
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

func envOr(k, def string) string {
	if v, ok := os.LookupEnv(k); ok {
		return v
	}
	return def
}

// SignalName renders a signal the way torchrun's failure summary does
// ("SIGKILL").
func SignalName(sig syscall.Signal) string {
	if n, ok := signalNames[sig]; ok {
		return n
	}
	return "SIG" + strconv.Itoa(int(sig))
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
	syscall.SIGILL: "SIGILL", syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT",
	syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL",
	syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
	syscall.SIGCHLD: "SIGCHLD", syscall.SIGCONT: "SIGCONT", syscall.SIGSTOP: "SIGSTOP",
	syscall.SIGTSTP: "SIGTSTP", syscall.SIGXCPU: "SIGXCPU", syscall.SIGXFSZ: "SIGXFSZ",
}

// ParseSignal accepts "SIGTERM", "TERM" or a number.
func ParseSignal(v string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(v); err == nil && n > 0 && n < 65 {
		return syscall.Signal(n), nil
	}
	for sig, name := range signalNames {
		if v == name || "SIG"+v == name {
			return sig, nil
		}
	}
	return 0, fmt.Errorf("%q is not a signal: use a name like SIGTERM or SIGUSR1, or a number", v)
}

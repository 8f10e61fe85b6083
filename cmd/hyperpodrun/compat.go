package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/devices/local"
	"github.com/hyperpodrun/hyperpodrun/launcher"
)

// torch 2.x's launcher flags.

// defaultLogsSpecs are the names under which torch registers its only
// torchrun.logs_specs entry point.
var defaultLogsSpecs = map[string]bool{
	"":                 true,
	"default":          true,
	"DefaultLogsSpecs": true,
	"torch.distributed.elastic.multiprocessing:DefaultLogsSpecs":     true,
	"torch.distributed.elastic.multiprocessing.api:DefaultLogsSpecs": true,
}

func torch2Flags(c *cli.Context, cl *cmdline, devKind string) error {
	o := &cl.opts
	bad := func(format string, a ...any) error { return &usageError{fmt.Errorf(format, a...)} }
	if ls := c.String("logs-specs"); !defaultLogsSpecs[ls] {
		return bad("--logs-specs %q: hyperpodrun writes torch's default log layout (<log-dir>/<run-id>/attempt_<n>/<local_rank>/) and cannot load a custom torchrun.logs_specs entry point; drop the option, or use --redirects/--tee/--log-dir", ls)
	}
	if c.Bool("virtual-local-rank") {
		o.Spec.VirtualLocalRank = true
		kind, pinned := devKind, o.Spec.RankEnv
		o.Spec.RankEnv = func(lr int) map[string]string {
			env := map[string]string{}
			if pinned != nil {
				for k, v := range pinned(lr) {
					env[k] = v
				}
			}
			name, value := virtualDevice(kind, lr)
			env[name] = value
			return env
		}
	}
	numa, err := launcher.ParseNUMABinding(c.String("numa-binding"))
	if err != nil {
		return bad("%v", err)
	}
	o.Spec.NUMABinding = numa
	if cl.signals, err = parseSignals(c.String("signals-to-handle")); err != nil {
		return bad("%v", err)
	}
	switch h := c.String("event-log-handler"); h {
	case "null", "":
	case "console":
		// torch's console handler logs the agent's events; hyperpodrun's
		// log (stderr) already carries every one of them.
	default:
		return bad("--event-log-handler %q: choose null or console (hyperpodrun's events go to its log and, with OTEL_* set, to OpenTelemetry)", h)
	}
	o.Spec.DuplicateStdoutFilters = commaList(c.String("duplicate-stdout-filters"))
	o.Spec.DuplicateStderrFilters = commaList(c.String("duplicate-stderr-filters"))
	o.Spec.LinePrefixTemplate = c.String("log-line-prefix-template")
	return nil
}

// virtualDevice is the one device local rank lr sees with
// --virtual-local-rank: entry lr of the launcher's own list when it has one
// (a device plugin set it), else device lr.
func virtualDevice(kind string, lr int) (string, string) {
	name := "CUDA_VISIBLE_DEVICES"
	switch kind {
	case local.ProcNeuron:
		name = "NEURON_RT_VISIBLE_CORES"
	case procXPU:
		name = "ZE_AFFINITY_MASK"
	}
	var list []string
	for _, e := range strings.Split(os.Getenv(name), ",") {
		if e = strings.TrimSpace(e); e != "" {
			list = append(list, e)
		}
	}
	if lr < len(list) {
		return name, list[lr]
	}
	return name, strconv.Itoa(lr)
}

func commaList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// parseSignals parses --signals-to-handle: "SIGTERM,SIGINT,..." or numbers.
func parseSignals(v string) ([]os.Signal, error) {
	var out []os.Signal
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		sig, err := launcher.ParseSignal(s)
		if err != nil {
			return nil, fmt.Errorf("--signals-to-handle: %v", err)
		}
		if sig == syscall.SIGKILL || sig == syscall.SIGSTOP {
			return nil, fmt.Errorf("--signals-to-handle: %s cannot be caught; remove it", launcher.SignalName(sig))
		}
		out = append(out, sig)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--signals-to-handle %q: give at least one signal, e.g. SIGTERM,SIGINT", v)
	}
	return out, nil
}

// procXPU is --nproc-per-node xpu: one worker per Intel GPU.
const procXPU = "xpu"

// drmRoot is where Intel GPUs are counted (tests point it at a fixture).
var drmRoot = "/sys/class/drm"

// countXPUs counts Intel GPUs (PCI vendor 0x8086 render nodes), what
// torch.xpu.device_count() sees through Level Zero.
func countXPUs() int {
	m, _ := filepath.Glob(filepath.Join(drmRoot, "renderD*", "device", "vendor"))
	n := 0
	for _, f := range m {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == "0x8086" {
			n++
		}
	}
	return n
}

// SageMaker HyperPod's agent flags.

func hyperpodFlags(c *cli.Context, cl *cmdline) error {
	for _, name := range []string{"server-host", "server-port", "server-shutdown-timeout"} {
		if c.IsSet(name) {
			cl.notices = append(cl.notices, fmt.Sprintf("--%s=%s accepted and unused: hyperpodrun runs no agent server; the coordinator drives it through etcd, and workers talk to it over HYPERPODRUN_CONTROL_SOCKET", name, c.String(name)))
		}
	}
	if v := c.String("server-log-level"); v != "" {
		var l slog.Level
		switch strings.ToLower(v) {
		case "debug":
			l = slog.LevelDebug
		case "info":
			l = slog.LevelInfo
		case "warning", "warn":
			l = slog.LevelWarn
		case "error", "critical", "fatal":
			l = slog.LevelError
		default:
			return &usageError{fmt.Errorf("--server-log-level %q: choose debug, info, warning or error", v)}
		}
		cl.level = &l
		cl.notices = append(cl.notices, "--server-log-level="+v+" sets hyperpodrun's own log level (it runs no agent server)")
	}
	if c.IsSet("inprocess-restart") || c.IsSet("inprocess-timeout") {
		cl.notices = append(cl.notices, "--inprocess-restart/--inprocess-timeout accepted: hyperpodrun restarts workers as processes, from the last committed checkpoint; planned changes wait --graceful-timeout for workers to checkpoint")
	}
	return nil
}

// --rdzv-conf keys torch accepts that hyperpodrun's etcd rendezvous has no
// use for: accepted with a notice. local_addr becomes --local-addr and
// is_host decides which node hosts a c10d rendezvous; both are kept.
var torchOnlyConf = map[string]string{
	"read_timeout":           "the etcd client's dial_timeout and lease_ttl bound every wait",
	"close_timeout":          "rounds close at max nodes or after last_call_timeout",
	"keep_alive_interval":    "liveness is an etcd lease (lease_ttl)",
	"keep_alive_max_attempt": "liveness is an etcd lease (lease_ttl)",
	"heartbeat_timeout":      "liveness is an etcd lease (lease_ttl)",
	"store_type":             "the rendezvous store is etcd",
	"use_libuv":              "the rendezvous store is etcd",
	"etcd_prefix":            "use prefix",
	"ttl":                    "use lease_ttl",
}

// splitRdzvConf drops the torch-only keys of --rdzv-conf with a notice each,
// keeping is_host for c10d. Truly unknown keys stay, and the rendezvous
// refuses them naming the valid keys: a misspelt lease_ttl must not silently
// do nothing.
func splitRdzvConf(conf string, c10d bool) (string, []string, error) {
	var kept, notes []string
	for _, kv := range strings.Split(conf, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if k == "is_host" {
			if _, err := strconv.ParseBool(strings.TrimSpace(v)); err != nil && !isPyBool(v) {
				return "", nil, fmt.Errorf("--rdzv-conf is_host=%s: want true or false", v)
			}
			if !c10d {
				notes = append(notes, "--rdzv-conf is_host accepted and unused: only the c10d backend hosts its rendezvous")
				continue
			}
		}
		if why, ok := torchOnlyConf[k]; ok {
			notes = append(notes, fmt.Sprintf("--rdzv-conf %s accepted and unused (%s)", k, why))
			continue
		}
		kept = append(kept, kv)
	}
	return strings.Join(kept, ","), notes, nil
}

func isPyBool(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "yes", "no", "y", "n", "on", "off", "1", "0":
		return true
	}
	return false
}

// confValue returns the value of key in a key=value,... list.
func confValue(conf, key string) (string, bool) {
	for _, kv := range strings.Split(conf, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// dropConf removes key from a key=value,... list.
func dropConf(conf, key string) string {
	var kept []string
	for _, kv := range strings.Split(conf, ",") {
		if k, _, _ := strings.Cut(kv, "="); strings.TrimSpace(k) != key && strings.TrimSpace(kv) != "" {
			kept = append(kept, kv)
		}
	}
	return strings.Join(kept, ",")
}

package devices

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Process kinds returned by LocalProcs and taken by PinEnv.
const (
	// ProcGPU: one worker per NVIDIA GPU (CUDA_VISIBLE_DEVICES).
	ProcGPU = "gpu"
	// ProcNeuron: one worker per logical NeuronCore (NEURON_RT_VISIBLE_CORES).
	ProcNeuron = "neuron"
	// ProcCPU: CPU workers, nothing to pin.
	ProcCPU = "cpu"
)

const (
	envCUDAVisible   = "CUDA_VISIBLE_DEVICES"
	envNeuronVisible = "NEURON_RT_VISIBLE_CORES"
)

// LocalProcs resolves torchrun's --nproc-per-node on this machine:
//
//	"<n>"  n workers, kind "" (no discovery, so launching stays fast)
//	"gpu"  one per visible NVIDIA GPU; an error if there is none
//	       (torchrun: "Cuda is not available.")
//	"cpu"  one per logical CPU (torchrun: os.cpu_count())
//	"auto" GPUs if any; else logical NeuronCores if any (our addition;
//	       torchrun knows only CUDA); else 1 (issue 5: one CPU worker, where
//	       torchrun would start one per CPU)
//
// GPUs are visible as torch counts them: all of them, or the prefix of
// CUDA_VISIBLE_DEVICES that names real GPUs (indices, or GPU-/MIG- UUIDs).
// NeuronCores honour NEURON_RT_VISIBLE_CORES the same way.
func LocalProcs(ctx context.Context, mode string) (n int, kind string, err error) {
	return LocalProcsWith(ctx, mode, Options{})
}

// LocalProcsWith is LocalProcs reading the machine through opts.
func LocalProcsWith(ctx context.Context, mode string, opts Options) (n int, kind string, err error) {
	mode = strings.TrimSpace(mode)
	if v, convErr := strconv.Atoi(mode); convErr == nil {
		if v <= 0 {
			return 0, "", fmt.Errorf("--nproc-per-node=%d: must be positive", v)
		}
		return v, "", nil
	}
	switch mode {
	case "cpu":
		c, err := cpuCount(ctx, opts)
		return c, ProcCPU, err
	case "gpu":
		g, reason, err := visibleGPUs(ctx, opts)
		if err != nil {
			return 0, "", err
		}
		if g == 0 {
			return 0, "", fmt.Errorf("--nproc-per-node=gpu but no NVIDIA GPU is available (%s)", reason)
		}
		return g, ProcGPU, nil
	case "auto":
		g, _, err := visibleGPUs(ctx, opts)
		if err != nil {
			return 0, "", err
		}
		if g > 0 {
			return g, ProcGPU, nil
		}
		c, err := visibleNeuronCores(ctx, opts)
		if err != nil {
			return 0, "", err
		}
		if c > 0 {
			return c, ProcNeuron, nil
		}
		return 1, ProcCPU, nil
	default:
		return 0, "", fmt.Errorf("unsupported --nproc-per-node value %q (want a positive number, gpu, cpu or auto)", mode)
	}
}

func cpuCount(ctx context.Context, opts Options) (int, error) {
	h, err := opts.host().HostInfo(ctx)
	if err != nil {
		return 0, fmt.Errorf("--nproc-per-node: %w", err)
	}
	if h.VCPUs <= 0 {
		return 1, nil
	}
	return h.VCPUs, nil
}

func visibleGPUs(ctx context.Context, opts Options) (int, string, error) {
	if opts.DisableNVML {
		return 0, "NVIDIA discovery disabled", nil
	}
	accs, _, reasons, err := discoverNVIDIA(ctx, opts.nvml())
	if err != nil {
		return 0, "", fmt.Errorf("--nproc-per-node: %w", err)
	}
	reason := strings.Join(reasons, "; ")
	cvd, set := lookupEnv(opts, envCUDAVisible)
	if !set {
		return len(accs), reason, nil
	}
	n := countVisibleGPUs(cvd, accs)
	if n == 0 {
		reason = fmt.Sprintf("%s=%q selects none of the %d GPUs", envCUDAVisible, cvd, len(accs))
	}
	return n, reason, nil
}

// countVisibleGPUs applies CUDA's CUDA_VISIBLE_DEVICES rule: entries are
// read in order and the list ends at the first one that is not a device.
func countVisibleGPUs(cvd string, accs []Accelerator) int {
	seen := map[string]bool{}
	n := 0
	for _, e := range strings.Split(cvd, ",") {
		e = strings.TrimSpace(e)
		id := ""
		switch {
		case strings.HasPrefix(e, "GPU-") || strings.HasPrefix(e, "MIG-"):
			id = matchUUID(e, accs)
		default:
			if i, err := strconv.Atoi(e); err == nil && i >= 0 && i < len(accs) {
				id = accs[i].UUID + "#" + strconv.Itoa(i)
			}
		}
		if id == "" || seen[id] {
			break
		}
		seen[id] = true
		n++
	}
	return n
}

// matchUUID finds the GPU or MIG device a (possibly abbreviated) UUID names.
func matchUUID(prefix string, accs []Accelerator) string {
	found := ""
	for _, a := range accs {
		cands := []string{a.UUID}
		if a.MIG != nil {
			for _, m := range a.MIG.Devices {
				cands = append(cands, m.UUID)
			}
		}
		for _, u := range cands {
			if u != "" && strings.HasPrefix(u, prefix) {
				if found != "" && found != u {
					return "" // ambiguous
				}
				found = u
			}
		}
	}
	return found
}

func visibleNeuronCores(ctx context.Context, opts Options) (int, error) {
	if opts.DisableNeuron {
		return 0, nil
	}
	accs, _, err := discoverNeuron(ctx, opts.neuronRoot(), opts.devRoot(), opts.getenv)
	if err != nil {
		return 0, fmt.Errorf("--nproc-per-node: %w", err)
	}
	total := 0
	for _, a := range accs {
		total += a.LogicalCores
	}
	v, set := lookupEnv(opts, envNeuronVisible)
	if !set {
		return total, nil
	}
	cores, err := parseCoreList(v)
	if err != nil {
		return 0, fmt.Errorf("--nproc-per-node: %s: %w", envNeuronVisible, err)
	}
	n := 0
	for _, c := range cores {
		if c < total {
			n++
		}
	}
	return n, nil
}

func lookupEnv(opts Options, k string) (string, bool) {
	if opts.Getenv != nil {
		v := opts.Getenv(k)
		return v, v != ""
	}
	return os.LookupEnv(k)
}

// parseCoreList parses NEURON_RT_VISIBLE_CORES: "3", "0-7", "0,2,4-5".
func parseCoreList(s string) ([]int, error) {
	var out []int
	seen := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi := part, part
		if a, b, ok := strings.Cut(part, "-"); ok {
			lo, hi = strings.TrimSpace(a), strings.TrimSpace(b)
		}
		l, err1 := strconv.Atoi(lo)
		h, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || l < 0 || h < l || h-l > 4096 {
			return nil, fmt.Errorf("invalid core range %q in %q", part, s)
		}
		for c := l; c <= h; c++ {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// PinEnv is the environment that pins local rank localRank of nproc workers
// to its devices: CUDA_VISIBLE_DEVICES for ProcGPU, NEURON_RT_VISIBLE_CORES
// for ProcNeuron, nothing for other kinds or an out-of-range rank.
//
// When the agent's own environment already restricts the devices (a
// Kubernetes device plugin or the user set CUDA_VISIBLE_DEVICES or
// NEURON_RT_VISIBLE_CORES), ranks share out that list: each gets an equal
// contiguous slice (len/nproc entries), or entry localRank mod len when
// there are fewer entries than workers. Otherwise rank r gets device r.
func PinEnv(kind string, localRank, nproc int) map[string]string {
	return pinEnv(os.LookupEnv, kind, localRank, nproc)
}

func pinEnv(lookup func(string) (string, bool), kind string, localRank, nproc int) map[string]string {
	if localRank < 0 || nproc <= 0 || localRank >= nproc {
		return nil
	}
	switch kind {
	case ProcGPU:
		var list []string
		if v, ok := lookup(envCUDAVisible); ok && strings.TrimSpace(v) != "" {
			for _, e := range strings.Split(v, ",") {
				if e = strings.TrimSpace(e); e != "" {
					list = append(list, e)
				}
			}
		}
		if len(list) == 0 {
			return map[string]string{envCUDAVisible: strconv.Itoa(localRank)}
		}
		return map[string]string{envCUDAVisible: strings.Join(share(list, localRank, nproc), ",")}
	case ProcNeuron:
		if v, ok := lookup(envNeuronVisible); ok && strings.TrimSpace(v) != "" {
			cores, err := parseCoreList(v)
			if err == nil && len(cores) > 0 {
				return map[string]string{envNeuronVisible: formatCores(share(cores, localRank, nproc))}
			}
		}
		return map[string]string{envNeuronVisible: strconv.Itoa(localRank)}
	default:
		return nil
	}
}

func share[T any](list []T, rank, nproc int) []T {
	if len(list) < nproc {
		return []T{list[rank%len(list)]}
	}
	k := len(list) / nproc
	return list[rank*k : (rank+1)*k]
}

// formatCores writes a core list as NEURON_RT_VISIBLE_CORES does: "4",
// "4-7", or "1,3,5".
func formatCores(cores []int) string {
	c := append([]int(nil), cores...)
	sort.Ints(c)
	contiguous := true
	for i := 1; i < len(c); i++ {
		if c[i] != c[i-1]+1 {
			contiguous = false
			break
		}
	}
	if len(c) == 1 {
		return strconv.Itoa(c[0])
	}
	if contiguous {
		return fmt.Sprintf("%d-%d", c[0], c[len(c)-1])
	}
	s := make([]string, len(c))
	for i, v := range c {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

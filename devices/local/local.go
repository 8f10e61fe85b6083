// Package local is what a launcher needs to know about this machine's
// devices: how many workers --nproc-per-node gpu, cpu or auto means here,
// and the environment that pins a local rank to its devices
// (CUDA_VISIBLE_DEVICES, NEURON_RT_VISIBLE_CORES).
//
// It reads only files: NVIDIA GPUs from the driver's /proc/driver/nvidia/gpus
// (one directory per GPU, its UUID in "information"), Neuron devices from
// the driver's sysfs tree, CPUs from /proc/cpuinfo. It links neither NVML
// (go-nvml) nor gopsutil, so hyperpodrun stays small and starts fast; the
// node daemon's full discovery (health, MIG, memory, flavors) is package
// devices, which resolves --nproc-per-node through the same rules (Resolve)
// with NVML as its GPU source.
//
// One difference from NVML: MIG device UUIDs are not in /proc, so here a
// MIG-... entry of CUDA_VISIBLE_DEVICES counts as one device without being
// checked against the GPUs' MIG devices.
package local

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Process kinds returned by LocalProcs and Resolve, and taken by PinEnv.
const (
	// ProcGPU: one worker per NVIDIA GPU (CUDA_VISIBLE_DEVICES).
	ProcGPU = "gpu"
	// ProcNeuron: one worker per logical NeuronCore (NEURON_RT_VISIBLE_CORES).
	ProcNeuron = "neuron"
	// ProcCPU: CPU workers, nothing to pin.
	ProcCPU = "cpu"
)

// Environment variables that restrict the visible devices.
const (
	// EnvCUDAVisible is CUDA's device list.
	EnvCUDAVisible = "CUDA_VISIBLE_DEVICES"
	// EnvNeuronVisible is the Neuron runtime's core list.
	EnvNeuronVisible = "NEURON_RT_VISIBLE_CORES"
)

// GPU is one NVIDIA GPU as CUDA_VISIBLE_DEVICES can name it.
type GPU struct {
	// UUID is "GPU-..."; empty when unknown.
	UUID string
	// MIG are the UUIDs ("MIG-...") of its MIG devices, when known.
	MIG []string
}

// Sources read the machine for Resolve; it calls only what the mode needs.
type Sources struct {
	// GPUs lists the NVIDIA GPUs in index order; reason says why there are
	// none. migUnchecked: MIG UUIDs are unknown, so a MIG-... entry of
	// CUDA_VISIBLE_DEVICES counts as a device.
	GPUs func(ctx context.Context) (gpus []GPU, reason string, migUnchecked bool, err error)
	// NeuronCores is the number of logical NeuronCores.
	NeuronCores func(ctx context.Context) (int, error)
	// CPUs is the number of logical CPUs.
	CPUs func(ctx context.Context) (int, error)
	// Getenv reads the environment; ok false means unset (default
	// os.LookupEnv).
	Getenv func(string) (string, bool)
}

func (s Sources) lookup(k string) (string, bool) {
	if s.Getenv != nil {
		return s.Getenv(k)
	}
	return os.LookupEnv(k)
}

// Resolve applies torchrun's --nproc-per-node rules to the machine that
// src reads:
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
func Resolve(ctx context.Context, mode string, src Sources) (n int, kind string, err error) {
	mode = strings.TrimSpace(mode)
	if v, convErr := strconv.Atoi(mode); convErr == nil {
		if v <= 0 {
			return 0, "", fmt.Errorf("--nproc-per-node=%d: must be positive", v)
		}
		return v, "", nil
	}
	switch mode {
	case "cpu":
		c, err := src.CPUs(ctx)
		if err != nil {
			return 0, "", fmt.Errorf("--nproc-per-node: %w", err)
		}
		if c <= 0 {
			c = 1
		}
		return c, ProcCPU, nil
	case "gpu":
		g, reason, err := visibleGPUs(ctx, src)
		if err != nil {
			return 0, "", err
		}
		if g == 0 {
			return 0, "", fmt.Errorf("--nproc-per-node=gpu but no NVIDIA GPU is available (%s)", reason)
		}
		return g, ProcGPU, nil
	case "auto":
		g, _, err := visibleGPUs(ctx, src)
		if err != nil {
			return 0, "", err
		}
		if g > 0 {
			return g, ProcGPU, nil
		}
		c, err := visibleNeuronCores(ctx, src)
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

func visibleGPUs(ctx context.Context, src Sources) (int, string, error) {
	gpus, reason, migUnchecked, err := src.GPUs(ctx)
	if err != nil {
		return 0, "", fmt.Errorf("--nproc-per-node: %w", err)
	}
	cvd, set := src.lookup(EnvCUDAVisible)
	if !set {
		return len(gpus), reason, nil
	}
	n := CountVisibleGPUs(cvd, gpus, migUnchecked)
	if n == 0 {
		reason = fmt.Sprintf("%s=%q selects none of the %d GPUs", EnvCUDAVisible, cvd, len(gpus))
	}
	return n, reason, nil
}

// CountVisibleGPUs applies CUDA's CUDA_VISIBLE_DEVICES rule: entries are
// read in order and the list ends at the first one that is not a device (or
// repeats one). With migUnchecked, a MIG-... entry counts as a device.
func CountVisibleGPUs(cvd string, gpus []GPU, migUnchecked bool) int {
	seen := map[string]bool{}
	n := 0
	for _, e := range strings.Split(cvd, ",") {
		e = strings.TrimSpace(e)
		id := ""
		switch {
		case migUnchecked && strings.HasPrefix(e, "MIG-"):
			id = e
		case strings.HasPrefix(e, "GPU-") || strings.HasPrefix(e, "MIG-"):
			id = matchUUID(e, gpus)
		default:
			if i, err := strconv.Atoi(e); err == nil && i >= 0 && i < len(gpus) {
				id = gpus[i].UUID + "#" + strconv.Itoa(i)
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
func matchUUID(prefix string, gpus []GPU) string {
	found := ""
	for _, g := range gpus {
		for _, u := range append([]string{g.UUID}, g.MIG...) {
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

func visibleNeuronCores(ctx context.Context, src Sources) (int, error) {
	total, err := src.NeuronCores(ctx)
	if err != nil {
		return 0, fmt.Errorf("--nproc-per-node: %w", err)
	}
	v, set := src.lookup(EnvNeuronVisible)
	if !set {
		return total, nil
	}
	cores, err := ParseCoreList(v)
	if err != nil {
		return 0, fmt.Errorf("--nproc-per-node: %s: %w", EnvNeuronVisible, err)
	}
	n := 0
	for _, c := range cores {
		if c < total {
			n++
		}
	}
	return n, nil
}

// ParseCoreList parses NEURON_RT_VISIBLE_CORES: "3", "0-7", "0,2,4-5".
func ParseCoreList(s string) ([]int, error) {
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

// LogicalCores is the number of logical NeuronCores the Neuron runtime
// exposes on a device with physical cores of model deviceName, under
// NEURON_LOGICAL_NC_CONFIG=lnc (0: the runtime's default, 2 on Trainium2
// and later, 1 before).
func LogicalCores(physical int, deviceName string, lnc int) int {
	size := lnc
	if size == 0 {
		size = defaultLNC(deviceName)
	}
	if size > 1 && physical%size == 0 {
		return physical / size
	}
	return physical
}

// defaultLNC is the Neuron runtime's default logical core size: 2 on
// Trainium2 and later, 1 before.
func defaultLNC(deviceName string) int {
	n := strings.ToLower(deviceName)
	if strings.HasPrefix(n, "trainium") {
		if gen, err := strconv.Atoi(strings.TrimPrefix(n, "trainium")); err == nil && gen >= 2 {
			return 2
		}
	}
	return 1
}

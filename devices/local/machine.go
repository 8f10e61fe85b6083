package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

// Default roots LocalProcs reads.
const (
	// DefaultNVIDIAProcRoot has one directory per GPU the NVIDIA driver
	// manages, named by PCI address, with an "information" file.
	DefaultNVIDIAProcRoot = "/proc/driver/nvidia/gpus"
	// DefaultNeuronSysfsRoot has one neuron<N> directory per Neuron device.
	DefaultNeuronSysfsRoot = "/sys/devices/virtual/neuron_device"
	// neuronLNCEnv selects the logical NeuronCore size (1 or 2).
	neuronLNCEnv = "NEURON_LOGICAL_NC_CONFIG"
	// maxFile bounds what is read from one /proc or sysfs file.
	maxFile = 64 << 10
)

// Options says where LocalProcsWith looks. The zero value reads the real
// machine.
type Options struct {
	// NVIDIAProcRoot is the driver's GPU directory (default
	// DefaultNVIDIAProcRoot).
	NVIDIAProcRoot string
	// NeuronSysfsRoot is the Neuron driver's sysfs directory (default
	// DefaultNeuronSysfsRoot).
	NeuronSysfsRoot string
	// CPUInfo is the cpuinfo file (default $HOST_PROC/cpuinfo or
	// /proc/cpuinfo, as gopsutil reads it).
	CPUInfo string
	// Getenv reads the environment (default os.LookupEnv).
	Getenv func(string) (string, bool)
}

func orDefault(v, d string) string {
	if v != "" {
		return v
	}
	return d
}

// LocalProcs resolves --nproc-per-node on this machine (see Resolve).
func LocalProcs(ctx context.Context, mode string) (n int, kind string, err error) {
	return LocalProcsWith(ctx, mode, Options{})
}

// LocalProcsWith is LocalProcs reading the machine through opts.
func LocalProcsWith(ctx context.Context, mode string, opts Options) (n int, kind string, err error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.LookupEnv
	}
	cpuinfo := opts.CPUInfo
	if cpuinfo == "" {
		cpuinfo = filepath.Join(orDefault(os.Getenv("HOST_PROC"), "/proc"), "cpuinfo")
	}
	return Resolve(ctx, mode, Sources{
		GPUs: func(context.Context) ([]GPU, string, bool, error) {
			g, reason, err := ProcGPUs(orDefault(opts.NVIDIAProcRoot, DefaultNVIDIAProcRoot))
			return g, reason, true, err
		},
		NeuronCores: func(context.Context) (int, error) {
			lnc, _ := getenv(neuronLNCEnv)
			return SysfsNeuronCores(orDefault(opts.NeuronSysfsRoot, DefaultNeuronSysfsRoot), lnc)
		},
		CPUs:   func(context.Context) (int, error) { return CPUCount(cpuinfo) },
		Getenv: getenv,
	})
}

// ProcGPUs lists the GPUs under the NVIDIA driver's proc directory, in PCI
// address order (NVML's index order). A missing directory is the normal
// no-driver case: no GPUs and a reason.
func ProcGPUs(root string) ([]GPU, string, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Sprintf("no NVIDIA driver (%s does not exist)", root), nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("nvidia: %s: %w", root, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	var gpus []GPU
	for _, name := range names {
		file := filepath.Join(root, name, "information")
		data, err := readSmall(file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, "", fmt.Errorf("nvidia: %w", err)
		}
		g := GPU{}
		for _, line := range strings.Split(data, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "GPU UUID" {
				g.UUID = strings.TrimSpace(v)
			}
		}
		gpus = append(gpus, g)
	}
	if len(gpus) == 0 {
		return nil, fmt.Sprintf("the NVIDIA driver lists no GPU under %s", root), nil
	}
	return gpus, "", nil
}

var neuronDirRE = regexp.MustCompile(`^neuron(\d+)$`)

// SysfsNeuronCores counts the logical NeuronCores of the devices under the
// Neuron driver's sysfs root, with NEURON_LOGICAL_NC_CONFIG=lncEnv ("", "1"
// or "2"). A missing root is the normal no-driver case (0).
func SysfsNeuronCores(root, lncEnv string) (int, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("neuron: %s: %w", root, err)
	}
	lnc := 0
	if v := strings.TrimSpace(lncEnv); v == "1" || v == "2" {
		lnc, _ = strconv.Atoi(v)
	}
	total := 0
	var errs []error
	for _, e := range entries {
		if !neuronDirRE.MatchString(e.Name()) {
			continue
		}
		dir := filepath.Join(root, e.Name())
		name, err := readSmall(filepath.Join(dir, "info", "architecture", "device_name"))
		if err != nil {
			errs = append(errs, fmt.Errorf("neuron: %w", err))
			continue
		}
		coreFile := filepath.Join(dir, "core_count")
		s, err := readSmall(coreFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("neuron: %w", err))
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || n > 128 {
			errs = append(errs, fmt.Errorf("neuron: %s: invalid core count %q (want 1-128)", coreFile, strings.TrimSpace(s)))
			continue
		}
		total += LogicalCores(n, strings.TrimSpace(name), lnc)
	}
	return total, errors.Join(errs...)
}

// CPUCount counts the logical CPUs as gopsutil does (the "processor" lines
// of cpuinfo), which is the machine's count (Python's os.cpu_count(), what
// torchrun uses), not the process's affinity mask. Without a readable
// cpuinfo it falls back to Go's count.
func CPUCount(cpuinfo string) (int, error) {
	f, err := os.Open(cpuinfo)
	if err != nil {
		return runtime.NumCPU(), nil
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, _, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "processor" {
			n++
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", cpuinfo, err)
	}
	if n == 0 {
		return runtime.NumCPU(), nil
	}
	return n, nil
}

func readSmall(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return "", fmt.Errorf("%s: read: %w", path, err)
	}
	if len(b) > maxFile {
		return "", fmt.Errorf("%s: larger than %d bytes", path, maxFile)
	}
	return string(b), nil
}

package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// procGPUs writes the NVIDIA driver's /proc/driver/nvidia/gpus for n GPUs,
// as driver 550 prints "information".
func procGPUs(t *testing.T, n int) (string, []string) {
	root := filepath.Join(t.TempDir(), "gpus")
	var uuids []string
	for i := 0; i < n; i++ {
		uuid := fmt.Sprintf("GPU-%08x-1111-2222-3333-44444444444%d", 0xa0+i, i)
		uuids = append(uuids, uuid)
		write(t, filepath.Join(root, fmt.Sprintf("0000:%02x:00.0", 0x07+i*0x10), "information"), fmt.Sprintf(
			"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t %s\nVideo BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nBus Location: \t 0000:%02x:00.0\nDevice Minor: \t %d\nGPU Excluded:\t No\n",
			uuid, 0x07+i*0x10, i))
	}
	return root, uuids
}

func envOf(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

// --nproc-per-node gpu counts the GPUs the driver lists in /proc as torch
// does under CUDA_VISIBLE_DEVICES (the NVML-based count in package devices
// gives the same answers on the same machine): the prefix of valid entries.
func TestLocalProcsFromProc(t *testing.T) {
	root, uuids := procGPUs(t, 8)
	for _, c := range []struct {
		cvd  *string
		want int
	}{
		{nil, 8},
		{ptr("0,1,2,3"), 4},
		{ptr("3,1"), 2},
		{ptr("0,1,9,2"), 2},            // stops at the first invalid entry
		{ptr("0,0,1"), 1},              // and at a repeat
		{ptr(uuids[1][:12] + ",5"), 2}, // abbreviated UUID
		{ptr("MIG-4f6b1c2a-0000-0000-0000-000000000000"), 1}, // MIG UUIDs are not in /proc: counted, not checked
		{ptr("GPU-nope,0"), 0},
		{ptr("-1"), 0},
	} {
		env := map[string]string{}
		if c.cvd != nil {
			env[EnvCUDAVisible] = *c.cvd
		}
		opts := Options{NVIDIAProcRoot: root, NeuronSysfsRoot: filepath.Join(t.TempDir(), "none"), Getenv: envOf(env)}
		n, kind, err := LocalProcsWith(context.Background(), "gpu", opts)
		if c.want == 0 {
			if err == nil || !strings.Contains(err.Error(), "no NVIDIA GPU") {
				t.Errorf("CUDA_VISIBLE_DEVICES=%q: gpu mode gave %d %v, want an error", *c.cvd, n, err)
			}
			if n, kind, err := LocalProcsWith(context.Background(), "auto", opts); err != nil || n != 1 || kind != ProcCPU {
				t.Errorf("CUDA_VISIBLE_DEVICES=%q: auto = %d %q %v, want one CPU worker", *c.cvd, n, kind, err)
			}
			continue
		}
		if err != nil || n != c.want || kind != ProcGPU {
			t.Errorf("CUDA_VISIBLE_DEVICES=%v: %d %q %v, want %d", c.cvd, n, kind, err, c.want)
		}
	}
}

func ptr(s string) *string { return &s }

// Without the NVIDIA driver, gpu mode says why; auto goes on to Neuron
// devices (logical cores: Trainium2 pairs its 8 physical cores by default),
// then to one CPU worker; cpu mode counts cpuinfo's processors.
func TestLocalProcsNoGPU(t *testing.T) {
	dir := t.TempDir()
	neuron := filepath.Join(dir, "neuron_device")
	for i := 0; i < 2; i++ {
		write(t, filepath.Join(neuron, fmt.Sprintf("neuron%d", i), "core_count"), "8")
		write(t, filepath.Join(neuron, fmt.Sprintf("neuron%d", i), "info", "architecture", "device_name"), "Trainium2\n")
	}
	cpuinfo := filepath.Join(dir, "cpuinfo")
	write(t, cpuinfo, "processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\n\nprocessor\t: 2\n")
	opts := Options{NVIDIAProcRoot: filepath.Join(dir, "nvidia"), NeuronSysfsRoot: neuron, CPUInfo: cpuinfo, Getenv: envOf(nil)}
	ctx := context.Background()

	if _, _, err := LocalProcsWith(ctx, "gpu", opts); err == nil || !strings.Contains(err.Error(), "no NVIDIA driver") {
		t.Errorf("gpu without a driver: %v, want an error naming the missing driver", err)
	}
	if n, kind, err := LocalProcsWith(ctx, "auto", opts); err != nil || n != 8 || kind != ProcNeuron {
		t.Errorf("auto on two Trainium2: %d %q %v, want 8 neuron", n, kind, err)
	}
	opts.Getenv = envOf(map[string]string{"NEURON_LOGICAL_NC_CONFIG": "1", EnvNeuronVisible: "0-3,40"})
	if n, kind, err := LocalProcsWith(ctx, "auto", opts); err != nil || n != 4 || kind != ProcNeuron {
		t.Errorf("auto with LNC=1 and visible cores 0-3,40: %d %q %v, want 4 neuron", n, kind, err)
	}
	write(t, filepath.Join(neuron, "neuron1", "core_count"), "lots")
	if _, _, err := LocalProcsWith(ctx, "auto", opts); err == nil || !strings.Contains(err.Error(), "core_count") {
		t.Errorf("malformed core_count: %v, want an error naming the file", err)
	}
	opts.NeuronSysfsRoot = filepath.Join(dir, "none")
	if n, kind, err := LocalProcsWith(ctx, "auto", opts); err != nil || n != 1 || kind != ProcCPU {
		t.Errorf("auto with nothing: %d %q %v, want 1 cpu", n, kind, err)
	}
	if n, kind, err := LocalProcsWith(ctx, "cpu", opts); err != nil || n != 3 || kind != ProcCPU {
		t.Errorf("cpu: %d %q %v, want 3 cpu", n, kind, err)
	}
	if n, kind, err := LocalProcsWith(ctx, " 6 ", opts); err != nil || n != 6 || kind != "" {
		t.Errorf("a number: %d %q %v", n, kind, err)
	}
	for _, bad := range []string{"0", "-2", "tpu"} {
		if _, _, err := LocalProcsWith(ctx, bad, opts); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

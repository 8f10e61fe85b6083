package devices

import (
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// A DGX A100 (go-nvml's fake) with MIG enabled on GPU 2: every GPU is listed
// with its identity, the MIG GPU with its MIG devices and profiles.
func TestDiscoverDGXA100WithMIG(t *testing.T) {
	srv := newDGXA100(t)
	gpu2 := srv.Devices[2].(*dgxa100.Device)
	enableMIG(t, gpu2,
		[]int{nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_3_SLICE},
		[]int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE})

	inv, err := Discover(ctxT(t), gpuOpts(t, srv))
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if inv.Node != "gpu-node" || inv.Flavor != "nvidia-a100-40gb" || len(inv.Flavors) != 1 {
		t.Fatalf("node %q flavor %q flavors %v, want gpu-node nvidia-a100-40gb", inv.Node, inv.Flavor, inv.Flavors)
	}
	if inv.NVIDIADriver != "550.54.15" {
		t.Errorf("driver %q", inv.NVIDIADriver)
	}
	if inv.VCPUs != 96 || inv.MemoryBytes != 1152<<30 || inv.BootID != testHost.BootID || inv.Hostname != "node-a" {
		t.Errorf("host fields: %+v", inv)
	}
	gpus := inv.GPUs()
	if len(gpus) != 8 || len(inv.NeuronDevices()) != 0 {
		t.Fatalf("got %d GPUs, %d Neuron devices; want 8, 0", len(gpus), len(inv.NeuronDevices()))
	}
	for i, g := range gpus {
		want := srv.Devices[i].(*dgxa100.Device)
		if g.Index != i || g.UUID != want.UUID || g.Minor != i || g.MemoryBytes != 40<<30 {
			t.Errorf("GPU %d: %+v", i, g)
		}
		if g.PCIBusID != "0000"+want.PciBusID || g.DevicePath != "/dev/nvidia"+strconv.Itoa(i) {
			t.Errorf("GPU %d: bus %q path %q", i, g.PCIBusID, g.DevicePath)
		}
		if !g.Healthy || g.Name != "Mock NVIDIA A100-SXM4-40GB" || g.Flavor != "nvidia-a100-40gb" {
			t.Errorf("GPU %d: %+v", i, g)
		}
		if g.MIG == nil {
			t.Fatalf("GPU %d: MIG state missing", i)
		}
		if (i == 2) != g.MIG.Enabled {
			t.Errorf("GPU %d: MIG enabled = %v", i, g.MIG.Enabled)
		}
	}
	migs := gpus[2].MIG.Devices
	var profiles []string
	for _, m := range migs {
		profiles = append(profiles, m.Profile)
		if !strings.HasPrefix(m.UUID, "MIG-") || !m.Healthy || m.MemoryBytes == 0 {
			t.Errorf("MIG device %+v", m)
		}
	}
	if got := strings.Join(profiles, " "); got != "1g.5gb 1g.5gb 1c.3g.20gb" {
		t.Errorf("MIG profiles %q, want 1g.5gb 1g.5gb 1c.3g.20gb", got)
	}
	if migs[2].GPUInstance != 2 || migs[2].ComputeInstance != 0 {
		t.Errorf("MIG device 2 at gi %d ci %d", migs[2].GPUInstance, migs[2].ComputeInstance)
	}
	if !hasReason(inv, "no Neuron driver") {
		t.Errorf("reasons %q lack the missing Neuron driver", inv.Reasons)
	}

	// hyperpodrun --nproc-per-node gpu|auto on this node.
	for _, mode := range []string{"gpu", "auto"} {
		n, kind, err := LocalProcsWith(ctxT(t), mode, gpuOpts(t, srv))
		if err != nil || n != 8 || kind != ProcGPU {
			t.Errorf("LocalProcs(%s) = %d %q %v, want 8 gpu", mode, n, kind, err)
		}
	}
}

// Broken or partial NVML answers never panic: a lost GPU is listed
// unhealthy, a failing device count is an error naming the call, and
// methods the driver lacks are skipped.
func TestDiscoverNVMLFaults(t *testing.T) {
	t.Run("lost GPU", func(t *testing.T) {
		srv := newDGXA100(t)
		srv.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
			if i == 3 {
				return nil, nvml.ERROR_GPU_IS_LOST
			}
			return srv.Devices[i], nvml.SUCCESS
		}
		inv, err := Discover(ctxT(t), gpuOpts(t, srv))
		if err != nil {
			t.Fatalf("Discover: %v", err)
		}
		g := inv.GPUs()[3]
		if g.Healthy || !strings.Contains(g.HealthReason, "GPU_IS_LOST") || g.Flavor != "nvidia-a100-40gb" {
			t.Errorf("lost GPU: %+v", g)
		}
		if inv.Healthy(KindNVIDIA) != 7 || !hasReason(inv, "GPU 3 unhealthy") {
			t.Errorf("healthy %d, reasons %q", inv.Healthy(KindNVIDIA), inv.Reasons)
		}
	})
	t.Run("UUID unreadable", func(t *testing.T) {
		srv := newDGXA100(t)
		srv.Devices[1].(*dgxa100.Device).GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_UNKNOWN }
		inv, err := Discover(ctxT(t), gpuOpts(t, srv))
		if err != nil {
			t.Fatal(err)
		}
		if g := inv.GPUs()[1]; g.Healthy || !strings.Contains(g.HealthReason, "nvmlDeviceGetUUID") {
			t.Errorf("GPU 1: %+v", g)
		}
	})
	t.Run("uncorrectable ECC", func(t *testing.T) {
		srv := newDGXA100(t)
		srv.Devices[5].(*dgxa100.Device).GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
			return 2, nvml.SUCCESS
		}
		inv, err := Discover(ctxT(t), gpuOpts(t, srv))
		if err != nil {
			t.Fatal(err)
		}
		if g := inv.GPUs()[5]; g.Healthy || !strings.Contains(g.HealthReason, "2 uncorrectable ECC errors") {
			t.Errorf("GPU 5: %+v", g)
		}
	})
	t.Run("device count fails", func(t *testing.T) {
		srv := newDGXA100(t)
		srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		inv, err := Discover(ctxT(t), gpuOpts(t, srv))
		if err == nil || !strings.Contains(err.Error(), "nvmlDeviceGetCount") {
			t.Fatalf("err = %v, want one naming nvmlDeviceGetCount", err)
		}
		if inv == nil || len(inv.GPUs()) != 0 || inv.Flavor != FlavorCPU {
			t.Errorf("partial inventory %+v", inv)
		}
	})
	t.Run("absurd device count", func(t *testing.T) {
		srv := newDGXA100(t)
		srv.DeviceGetCountFunc = func() (int, nvml.Return) { return -5, nvml.SUCCESS }
		if _, err := Discover(ctxT(t), gpuOpts(t, srv)); err == nil || !strings.Contains(err.Error(), "-5") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("MIG handles unsupported", func(t *testing.T) {
		srv := dgxa100.New() // the bare fake has no MIG device handles
		dev := srv.Devices[0].(*dgxa100.Device)
		enableMIG(t, dev, []int{nvml.GPU_INSTANCE_PROFILE_7_SLICE}, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE})
		inv, err := Discover(ctxT(t), gpuOpts(t, srv))
		if err != nil {
			t.Fatal(err)
		}
		if g := inv.GPUs()[0]; !g.MIG.Enabled || len(g.MIG.Devices) != 0 || !g.Healthy {
			t.Errorf("GPU 0: %+v", g)
		}
		if !hasReason(inv, "MIG devices cannot be listed") {
			t.Errorf("reasons %q", inv.Reasons)
		}
	})
	t.Run("empty fake", func(t *testing.T) {
		// Every method unset: nvmlInit itself "panics" inside the fake.
		inv, err := Discover(ctxT(t), gpuOpts(t, &mock.Interface{}))
		if err != nil {
			t.Fatal(err)
		}
		if len(inv.GPUs()) != 0 || !hasReason(inv, "nvmlInit failed") {
			t.Errorf("inventory %+v", inv)
		}
	})
	t.Run("driver not loaded", func(t *testing.T) {
		srv := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }}
		inv, err := Discover(ctxT(t), gpuOpts(t, srv))
		if err != nil || !hasReason(inv, "kernel driver not loaded") {
			t.Errorf("err %v reasons %q", err, inv.Reasons)
		}
	})
}

func TestGPUFlavor(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		name string
		mem  uint64
		want string
	}{
		{"NVIDIA H100 80GB HBM3", 81559 << 20, "nvidia-h100-80gb"},
		{"NVIDIA A100-SXM4-40GB", 40 * gib, "nvidia-a100-40gb"},
		{"NVIDIA A100-SXM4-80GB", 80 * gib, "nvidia-a100-80gb"},
		{"Mock NVIDIA A100-SXM4-40GB", 40 * gib, "nvidia-a100-40gb"},
		{"NVIDIA H200", 143771 << 20, "nvidia-h200-141gb"},
		{"NVIDIA H100 NVL", 95830 << 20, "nvidia-h100-94gb"},
		{"NVIDIA L4", 23034 << 20, "nvidia-l4-24gb"},
		{"Tesla V100-SXM2-16GB", 16 * gib, "nvidia-v100-16gb"},
		{"NVIDIA RTX A6000", 49140 << 20, "nvidia-rtx-a6000-48gb"},
		{"NVIDIA B200", 183359 << 20, "nvidia-b200-180gb"},
		{"", 0, "nvidia-unknown"},
	} {
		if got := GPUFlavor(c.name, c.mem); got != c.want {
			t.Errorf("GPUFlavor(%q, %d) = %q, want %q", c.name, c.mem, got, c.want)
		}
	}
}

func hasReason(inv *Inventory, sub string) bool {
	for _, r := range inv.Reasons {
		if strings.Contains(r, sub) {
			return true
		}
	}
	return false
}

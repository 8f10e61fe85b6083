package devices

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestRealNVML runs discovery against the machine's own NVIDIA driver. It
// skips, saying why, where libnvidia-ml.so.1 or a GPU is missing (CI, dev
// machines); on a GPU machine it checks every GPU is seen and healthy.
func TestRealNVML(t *testing.T) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Skipf("no usable NVML on this machine (%s): %v", nvmlInitReason(ret), ret)
	}
	count, ret := lib.DeviceGetCount()
	lib.Shutdown()
	if ret != nvml.SUCCESS || count == 0 {
		t.Skipf("NVML loaded but no GPU present (count %d, %v)", count, ret)
	}

	ctx := ctxT(t)
	m := WatchHealth(ctx, Options{}, quiet)
	defer m.Close()
	inv, err := Discover(ctx, Options{Health: m})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	out, _ := json.MarshalIndent(inv, "", "  ")
	t.Logf("inventory:\n%s", out)
	gpus := inv.GPUs()
	if len(gpus) != count {
		t.Fatalf("%d GPUs discovered, NVML counts %d", len(gpus), count)
	}
	for _, g := range gpus {
		if !strings.HasPrefix(g.UUID, "GPU-") || g.MemoryBytes == 0 || g.PCIBusID == "" || g.Minor < 0 {
			t.Errorf("GPU %d incomplete: %+v", g.Index, g)
		}
		if !strings.HasPrefix(g.Flavor, "nvidia-") || !strings.HasSuffix(g.Flavor, "gb") {
			t.Errorf("GPU %d flavor %q", g.Index, g.Flavor)
		}
		if !g.Healthy {
			t.Errorf("GPU %d unhealthy: %s", g.Index, g.HealthReason)
		}
	}
	if inv.NVIDIADriver == "" || inv.Flavor != gpus[0].Flavor {
		t.Errorf("driver %q flavor %q", inv.NVIDIADriver, inv.Flavor)
	}
	if _, set := os.LookupEnv("CUDA_VISIBLE_DEVICES"); !set {
		n, kind, err := LocalProcs(ctx, "gpu")
		if err != nil || n != count || kind != ProcGPU {
			t.Errorf("LocalProcs(gpu) = %d %q %v, want %d", n, kind, err, count)
		}
	}
	t.Logf("health monitor reasons: %q", m.Reasons())
}

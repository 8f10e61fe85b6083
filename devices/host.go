package devices

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/shirou/gopsutil/v3/cpu"
	"github.com/shirou/gopsutil/v3/host"
	"github.com/shirou/gopsutil/v3/mem"
)

// HostInfo is the host's capacity and identity.
type HostInfo struct {
	Hostname    string
	BootID      string
	VCPUs       int
	MemoryBytes uint64
}

// HostSource reports the host's capacity and identity.
type HostSource interface {
	HostInfo(ctx context.Context) (HostInfo, error)
}

// HostFunc adapts a function to HostSource.
type HostFunc func(ctx context.Context) (HostInfo, error)

// HostInfo calls f.
func (f HostFunc) HostInfo(ctx context.Context) (HostInfo, error) { return f(ctx) }

// StaticHost is a HostSource that always reports h (tests, simulations).
func StaticHost(h HostInfo) HostSource {
	return HostFunc(func(context.Context) (HostInfo, error) { return h, nil })
}

// SystemHost reads the real host through gopsutil. Like gopsutil it honours
// HOST_PROC, so a containerised agent can point it at the host's /proc.
type SystemHost struct{}

// HostInfo reads hostname, logical CPU count, total memory and boot id.
// The CPU count is the machine's (what Python's os.cpu_count() reports,
// which torchrun uses), not the process's affinity mask.
func (SystemHost) HostInfo(ctx context.Context) (HostInfo, error) {
	var h HostInfo
	info, err := host.InfoWithContext(ctx)
	if err != nil {
		return h, fmt.Errorf("host info: %w", err)
	}
	h.Hostname = info.Hostname
	n, err := cpu.CountsWithContext(ctx, true)
	if err != nil {
		return h, fmt.Errorf("host cpu count: %w", err)
	}
	h.VCPUs = n
	vm, err := mem.VirtualMemoryWithContext(ctx)
	if err != nil {
		return h, fmt.Errorf("host memory: %w", err)
	}
	h.MemoryBytes = vm.Total
	procRoot := os.Getenv("HOST_PROC")
	if procRoot == "" {
		procRoot = "/proc"
	}
	bootIDFile := filepath.Join(procRoot, "sys/kernel/random/boot_id")
	if b, err := os.ReadFile(bootIDFile); err == nil {
		h.BootID = strings.TrimSpace(string(b))
	}
	return h, nil
}

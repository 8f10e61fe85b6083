package devices

import (
	"context"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// SystemHost reads this machine through gopsutil: the CPU count Python's
// os.cpu_count() reports, the kernel's total memory and its boot id.
func TestSystemHostReadsThisMachine(t *testing.T) {
	h, err := SystemHost{}.HostInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if h.VCPUs < 1 || h.VCPUs < runtime.NumCPU() {
		t.Errorf("VCPUs %d, but this process can run on %d", h.VCPUs, runtime.NumCPU())
	}
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		t.Fatal(err)
	}
	if want := uint64(si.Totalram) * uint64(si.Unit); h.MemoryBytes != want {
		t.Errorf("MemoryBytes %d, kernel says %d", h.MemoryBytes, want)
	}
	if name, _ := os.Hostname(); h.Hostname != name {
		t.Errorf("Hostname %q, want %q", h.Hostname, name)
	}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if h.BootID == "" || h.BootID != strings.TrimSpace(string(boot)) {
		t.Errorf("BootID %q, /proc says %q", h.BootID, boot)
	}
}

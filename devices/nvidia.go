package devices

import (
	"bytes"
	"context"
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML calls go through these guards: go-nvml's fakes (pkg/nvml/mock) panic
// on any method a test did not set, and a binding bug must not take the node
// agent down. A panic reads as ERROR_FUNCTION_NOT_FOUND, which is what
// go-nvml itself returns for a symbol the installed driver lacks.

func guard0(f func() nvml.Return) (ret nvml.Return) {
	defer func() {
		if recover() != nil {
			ret = nvml.ERROR_FUNCTION_NOT_FOUND
		}
	}()
	return f()
}

func guard1[T any](f func() (T, nvml.Return)) (v T, ret nvml.Return) {
	defer func() {
		if recover() != nil {
			var zero T
			v, ret = zero, nvml.ERROR_FUNCTION_NOT_FOUND
		}
	}()
	return f()
}

func guard2[T, U any](f func() (T, U, nvml.Return)) (v T, u U, ret nvml.Return) {
	defer func() {
		if recover() != nil {
			var zt T
			var zu U
			v, u, ret = zt, zu, nvml.ERROR_FUNCTION_NOT_FOUND
		}
	}()
	return f()
}

// nvmlInitReason turns a failed nvmlInit into the reason shown for a node
// without usable NVIDIA GPUs.
func nvmlInitReason(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "nvidia: NVML library libnvidia-ml.so.1 not found (no NVIDIA driver on this node, or the container lacks the NVIDIA runtime)"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "nvidia: NVIDIA kernel driver not loaded"
	case nvml.ERROR_NO_PERMISSION:
		return "nvidia: no permission to open the NVIDIA driver"
	default:
		return fmt.Sprintf("nvidia: nvmlInit failed: %v", ret)
	}
}

// discoverNVIDIA lists the GPUs NVML sees. Missing NVML or driver is a
// reason, not an error; a GPU that fails its queries is listed unhealthy.
func discoverNVIDIA(ctx context.Context, lib nvml.Interface) (accs []Accelerator, driver string, reasons []string, err error) {
	if ret := guard0(lib.Init); ret != nvml.SUCCESS {
		return nil, "", []string{nvmlInitReason(ret)}, nil
	}
	defer guard0(lib.Shutdown)

	if v, ret := guard1(lib.SystemGetDriverVersion); ret == nvml.SUCCESS {
		driver = v
	}
	count, ret := guard1(lib.DeviceGetCount)
	if ret != nvml.SUCCESS {
		return nil, driver, nil, fmt.Errorf("nvidia: nvmlDeviceGetCount: %v", ret)
	}
	if count < 0 || count > 1024 {
		return nil, driver, nil, fmt.Errorf("nvidia: nvmlDeviceGetCount returned %d devices", count)
	}
	if count == 0 {
		reasons = append(reasons, "nvidia: NVML loaded but reports no GPUs")
	}
	for i := 0; i < count; i++ {
		if err := ctx.Err(); err != nil {
			return nil, driver, nil, fmt.Errorf("nvidia: %w", err)
		}
		acc, rs := readGPU(lib, i)
		accs = append(accs, acc)
		reasons = append(reasons, rs...)
	}
	fillUnknownGPUFlavors(accs)
	return accs, driver, reasons, nil
}

func readGPU(lib nvml.Interface, index int) (Accelerator, []string) {
	acc := Accelerator{Kind: KindNVIDIA, Index: index, Minor: -1, Healthy: true}
	var reasons []string
	unhealthy := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		acc.Healthy = false
		if acc.HealthReason != "" {
			acc.HealthReason += "; "
		}
		acc.HealthReason += msg
	}
	dev, ret := guard1(func() (nvml.Device, nvml.Return) { return lib.DeviceGetHandleByIndex(index) })
	if ret != nvml.SUCCESS || dev == nil {
		unhealthy("nvmlDeviceGetHandleByIndex: %v", ret)
		reasons = append(reasons, fmt.Sprintf("nvidia: GPU %d unhealthy: %s", index, acc.HealthReason))
		return acc, reasons
	}
	if uuid, ret := guard1(dev.GetUUID); ret == nvml.SUCCESS {
		acc.UUID = uuid
	} else {
		unhealthy("nvmlDeviceGetUUID: %v", ret)
	}
	if name, ret := guard1(dev.GetName); ret == nvml.SUCCESS {
		acc.Name = name
	}
	if m, ret := guard1(dev.GetMemoryInfo); ret == nvml.SUCCESS {
		acc.MemoryBytes = m.Total
	}
	if p, ret := guard1(dev.GetPciInfo); ret == nvml.SUCCESS {
		acc.PCIBusID = cString(p.BusId[:])
	}
	if minor, ret := guard1(dev.GetMinorNumber); ret == nvml.SUCCESS && minor >= 0 {
		acc.Minor = minor
		acc.DevicePath = fmt.Sprintf("/dev/nvidia%d", minor)
	}
	if acc.Name != "" {
		acc.Flavor = GPUFlavor(acc.Name, acc.MemoryBytes)
	}

	// Uncorrectable (double-bit) ECC errors since the driver loaded: the GPU
	// needs a reset before it can be trusted again.
	if n, ret := guard1(func() (uint64, nvml.Return) {
		return dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	}); ret == nvml.SUCCESS && n > 0 {
		unhealthy("%d uncorrectable ECC errors since the driver loaded", n)
	}

	cur, pending, ret := guard2(dev.GetMigMode)
	if ret == nvml.SUCCESS {
		acc.MIG = &MIG{Enabled: cur == nvml.DEVICE_MIG_ENABLE}
		if pending != cur {
			p := pending == nvml.DEVICE_MIG_ENABLE
			acc.MIG.Pending = &p
		}
		if acc.MIG.Enabled {
			migs, err := readMIGDevices(dev)
			if err != nil {
				reasons = append(reasons, fmt.Sprintf("nvidia: GPU %d: MIG enabled but its MIG devices cannot be listed: %v", index, err))
			}
			acc.MIG.Devices = migs
		}
	}
	if !acc.Healthy {
		reasons = append(reasons, fmt.Sprintf("nvidia: GPU %d unhealthy: %s", index, acc.HealthReason))
	}
	return acc, reasons
}

// readMIGDevices lists a MIG-enabled GPU's MIG devices the way NVIDIA's
// device plugin (go-nvlib) does: every handle up to the maximum count,
// skipping empty slots.
func readMIGDevices(dev nvml.Device) ([]MIGDevice, error) {
	maxCount, ret := guard1(dev.GetMaxMigDeviceCount)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlDeviceGetMaxMigDeviceCount: %v", ret)
	}
	var out []MIGDevice
	for j := 0; j < maxCount && j < 64; j++ {
		mig, ret := guard1(func() (nvml.Device, nvml.Return) { return dev.GetMigDeviceHandleByIndex(j) })
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		if ret != nvml.SUCCESS || mig == nil {
			return out, fmt.Errorf("nvmlDeviceGetMigDeviceHandleByIndex(%d): %v", j, ret)
		}
		m := MIGDevice{Index: j, Healthy: true, GPUInstance: -1, ComputeInstance: -1}
		if u, ret := guard1(mig.GetUUID); ret == nvml.SUCCESS {
			m.UUID = u
		}
		if gi, ret := guard1(mig.GetGpuInstanceId); ret == nvml.SUCCESS {
			m.GPUInstance = gi
		}
		if ci, ret := guard1(mig.GetComputeInstanceId); ret == nvml.SUCCESS {
			m.ComputeInstance = ci
		}
		if a, ret := guard1(mig.GetAttributes); ret == nvml.SUCCESS {
			m.MemoryBytes = a.MemorySizeMB << 20
			m.Profile = migProfile(a)
		}
		out = append(out, m)
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].GPUInstance != out[b].GPUInstance {
			return out[a].GPUInstance < out[b].GPUInstance
		}
		return out[a].ComputeInstance < out[b].ComputeInstance
	})
	return out, nil
}

// migProfile names a MIG device's profile: "1g.5gb", or "1c.3g.20gb" when
// the compute instance uses part of its GPU instance.
func migProfile(a nvml.DeviceAttributes) string {
	if a.GpuInstanceSliceCount == 0 {
		return ""
	}
	gb := (a.MemorySizeMB + 1023) / 1024
	if a.ComputeInstanceSliceCount != 0 && a.ComputeInstanceSliceCount != a.GpuInstanceSliceCount {
		return fmt.Sprintf("%dc.%dg.%dgb", a.ComputeInstanceSliceCount, a.GpuInstanceSliceCount, gb)
	}
	return fmt.Sprintf("%dg.%dgb", a.GpuInstanceSliceCount, gb)
}

// fillUnknownGPUFlavors gives GPUs whose name could not be read (a lost GPU)
// the flavor of their neighbours: GPUs of one node are one model.
func fillUnknownGPUFlavors(accs []Accelerator) {
	known := ""
	for _, a := range accs {
		if a.Flavor != "" {
			known = a.Flavor
			break
		}
	}
	if known == "" {
		known = "nvidia-unknown"
	}
	for i := range accs {
		if accs[i].Flavor == "" {
			accs[i].Flavor = known
		}
		if accs[i].Name == "" {
			accs[i].Name = "unknown"
		}
	}
}

func cString(b []uint8) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

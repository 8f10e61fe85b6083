package devices

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// Fixtures and fakes shared by the devices tests.

var testHost = HostInfo{Hostname: "node-a", BootID: "0f4c1d8e-boot", VCPUs: 96, MemoryBytes: 1152 << 30}

func fixtureRoot(node string) (sysfs, dev string) {
	base := filepath.Join("testdata", "neuron", node)
	return filepath.Join(base, "sys", "devices", "virtual", "neuron_device"), filepath.Join(base, "dev")
}

// noNVML is an NVML whose library is missing, as nvml.New() behaves on a
// machine without the NVIDIA driver.
func noNVML() nvml.Interface {
	return &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
}

// gpuOpts reads a fake DGX A100 and no Neuron devices.
func gpuOpts(t *testing.T, srv nvml.Interface) Options {
	return Options{
		NodeName:        "gpu-node",
		NVML:            srv,
		NeuronSysfsRoot: filepath.Join(t.TempDir(), "absent"),
		DevRoot:         "/dev",
		Host:            StaticHost(testHost),
		Getenv:          func(string) string { return "" },
	}
}

// neuronOpts reads a Neuron fixture and no NVIDIA GPUs.
func neuronOpts(sysfs, dev string) Options {
	return Options{
		NodeName:        "trn-node",
		NVML:            noNVML(),
		NeuronSysfsRoot: sysfs,
		DevRoot:         dev,
		Host:            StaticHost(testHost),
		Getenv:          func(string) string { return "" },
	}
}

// newDGXA100 is go-nvml's fake DGX A100 with what its devices leave out
// filled in as the driver reports it: PCI bus ids, and MIG device handles
// (the fake has GPU and compute instances but no MIG device handles).
func newDGXA100(t *testing.T) *dgxa100.Server {
	t.Helper()
	srv := dgxa100.New()
	for _, d := range srv.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			p.PciDeviceId = 0x20B010DE
			copy(p.BusId[:], fmt.Sprintf("0000%s", dev.PciBusID))
			return p, nvml.SUCCESS
		}
		installMIGHandles(dev)
	}
	return srv
}

// enableMIG turns MIG on for a fake GPU and creates GPU instances with the
// given profiles, each with one compute instance of ciProfile (or of the
// whole GPU instance when ciProfile < 0), through the fake's own MIG API.
func enableMIG(t *testing.T, dev *dgxa100.Device, gis []int, ciProfiles []int) {
	t.Helper()
	if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatalf("SetMigMode: %v", ret)
	}
	for i, giProfile := range gis {
		info, ret := dev.GetGpuInstanceProfileInfo(giProfile)
		if ret != nvml.SUCCESS {
			t.Fatalf("GetGpuInstanceProfileInfo(%d): %v", giProfile, ret)
		}
		gi, ret := dev.CreateGpuInstance(&info)
		if ret != nvml.SUCCESS {
			t.Fatalf("CreateGpuInstance: %v", ret)
		}
		ciProfile := ciProfiles[i]
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			t.Fatalf("GetComputeInstanceProfileInfo(%d): %v", ciProfile, ret)
		}
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
			t.Fatalf("CreateComputeInstance: %v", ret)
		}
	}
}

// installMIGHandles gives a fake GPU nvmlDeviceGetMaxMigDeviceCount and
// nvmlDeviceGetMigDeviceHandleByIndex derived from its GPU/compute instances.
func installMIGHandles(dev *dgxa100.Device) {
	type migDev struct {
		gi, ci         uint32
		giProf, ciProf uint32
	}
	list := func() []migDev {
		dev.RLock()
		defer dev.RUnlock()
		var out []migDev
		for gi := range dev.GpuInstances {
			gi.RLock()
			for ci := range gi.ComputeInstances {
				out = append(out, migDev{gi.Info.Id, ci.Info.Id, gi.Info.ProfileId, ci.Info.ProfileId})
			}
			gi.RUnlock()
		}
		sort.Slice(out, func(i, j int) bool {
			if out[i].gi != out[j].gi {
				return out[i].gi < out[j].gi
			}
			return out[i].ci < out[j].ci
		})
		return out
	}
	dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	dev.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		l := list()
		if i < 0 || i >= 7 {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if i >= len(l) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		m := l[i]
		giInfo := dgxa100.MIGProfiles.GpuInstanceProfiles[int(m.giProf)]
		ciInfo := dgxa100.MIGProfiles.ComputeInstanceProfiles[int(m.giProf)][int(m.ciProf)]
		uuid := fmt.Sprintf("MIG-%s-%d-%d", dev.UUID[4:12], m.gi, m.ci)
		return &mock.Device{
			GetUUIDFunc:              func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return int(m.gi), nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return int(m.ci), nvml.SUCCESS },
			GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
				return nvml.DeviceAttributes{
					GpuInstanceSliceCount:     giInfo.SliceCount,
					ComputeInstanceSliceCount: ciInfo.SliceCount,
					MemorySizeMB:              giInfo.MemorySizeMB,
				}, nvml.SUCCESS
			},
		}, nvml.SUCCESS
	}
}

// fakeEvents is an NVML event set fed by a test.
type fakeEvents struct {
	ch    chan nvml.EventData
	freed chan struct{}
}

// installEvents gives the fake server an event set and its devices event
// registration; send events on the returned channel.
func installEvents(srv *dgxa100.Server) *fakeEvents {
	fe := &fakeEvents{ch: make(chan nvml.EventData, 16), freed: make(chan struct{})}
	set := &mock.EventSet{
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			select {
			case ev := <-fe.ch:
				return ev, nvml.SUCCESS
			case <-time.After(time.Duration(ms) * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() nvml.Return { close(fe.freed); return nvml.SUCCESS },
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	for _, d := range srv.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, nvml.SUCCESS
		}
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	}
	return fe
}

// copyTree copies a fixture so a test can corrupt it.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

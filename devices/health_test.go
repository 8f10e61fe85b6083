package devices

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func waitChanged(t *testing.T, m *HealthMonitor) {
	t.Helper()
	select {
	case <-m.Changed():
	case <-time.After(10 * time.Second):
		t.Fatal("no health change reported within 10s")
	}
}

// Critical XIDs and double-bit ECC events from the NVML event set make the
// GPU (or just the MIG device) unhealthy in the next Discover; the XIDs
// NVIDIA's device plugin ignores do not.
func TestHealthMonitorEvents(t *testing.T) {
	srv := newDGXA100(t)
	gpu2 := srv.Devices[2].(*dgxa100.Device)
	enableMIG(t, gpu2, []int{nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE},
		[]int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE})
	fe := installEvents(srv)
	opts := gpuOpts(t, srv)
	m := WatchHealth(context.Background(), opts, quiet)
	defer m.Close()
	opts.Health = m

	const whole = 0xFFFFFFFF
	// An ignored application XID, then a critical one on GPU 1.
	fe.ch <- nvml.EventData{Device: srv.Devices[0], EventType: nvml.EventTypeXidCriticalError, EventData: 13, GpuInstanceId: whole, ComputeInstanceId: whole}
	fe.ch <- nvml.EventData{Device: srv.Devices[1], EventType: nvml.EventTypeXidCriticalError, EventData: 79, GpuInstanceId: whole, ComputeInstanceId: whole}
	waitChanged(t, m)
	inv, err := Discover(ctxT(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	gpus := inv.GPUs()
	if !gpus[0].Healthy {
		t.Errorf("GPU 0 unhealthy after ignored XID 13: %s", gpus[0].HealthReason)
	}
	if gpus[1].Healthy || gpus[1].HealthReason != "critical XID 79" {
		t.Errorf("GPU 1 after XID 79: healthy=%v %q", gpus[1].Healthy, gpus[1].HealthReason)
	}
	if !hasReason(inv, "GPU 1 unhealthy: critical XID 79") {
		t.Errorf("reasons %q", inv.Reasons)
	}

	// Double-bit ECC on GPU 4; an XID on one MIG device of GPU 2.
	fe.ch <- nvml.EventData{Device: srv.Devices[4], EventType: nvml.EventTypeDoubleBitEccError, GpuInstanceId: whole, ComputeInstanceId: whole}
	waitChanged(t, m)
	fe.ch <- nvml.EventData{Device: srv.Devices[2], EventType: nvml.EventTypeXidCriticalError, EventData: 94, GpuInstanceId: 1, ComputeInstanceId: 0}
	waitChanged(t, m)
	// A single-bit ECC event is not a health problem.
	fe.ch <- nvml.EventData{Device: srv.Devices[6], EventType: nvml.EventTypeSingleBitEccError, GpuInstanceId: whole, ComputeInstanceId: whole}

	deadline := time.Now().Add(10 * time.Second)
	for {
		inv, err = Discover(ctxT(t), opts)
		if err != nil {
			t.Fatal(err)
		}
		if !inv.GPUs()[4].Healthy && !inv.GPUs()[2].MIG.Devices[1].Healthy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GPU 4 / MIG 2:1 still healthy: %+v", inv.GPUs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	gpus = inv.GPUs()
	if gpus[4].HealthReason != "double-bit ECC error" {
		t.Errorf("GPU 4 reason %q", gpus[4].HealthReason)
	}
	if !gpus[2].Healthy || !gpus[2].MIG.Devices[0].Healthy || gpus[2].MIG.Devices[1].HealthReason != "critical XID 94" {
		t.Errorf("GPU 2 MIG: %+v", gpus[2].MIG.Devices)
	}
	if !gpus[6].Healthy || inv.Healthy(KindNVIDIA) != 6 {
		t.Errorf("healthy GPUs %d, GPU 6 %+v", inv.Healthy(KindNVIDIA), gpus[6])
	}
	if got := m.Unhealthy(); len(got) != 2 {
		t.Errorf("Unhealthy() = %v", got)
	}

	m.Close()
	select {
	case <-fe.freed:
	default:
		t.Error("event set not freed by Close")
	}
	m.Close() // idempotent
}

// DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS tune the XIDs exactly as
// in NVIDIA's device plugin.
func TestXIDFilter(t *testing.T) {
	for _, c := range []struct {
		disable, enable string
		ignored         []uint64
		checked         []uint64
		allOff          bool
	}{
		{"", "", []uint64{13, 31, 43, 45, 68, 109}, []uint64{48, 79, 94, 95}, false},
		{"79, 48", "", []uint64{13, 48, 79}, []uint64{94}, false},
		{"", "13", []uint64{31}, []uint64{13, 79}, false},
		{"all", "", nil, nil, true},
		{"xids", "79", []uint64{13, 48}, []uint64{79}, false},
		{"", "all", nil, []uint64{13, 31, 79}, false},
		{"garbage,12x", "", []uint64{13}, []uint64{79}, false},
	} {
		f := newXIDFilter(c.disable, c.enable)
		if f.allDisabled() != c.allOff {
			t.Errorf("disable=%q enable=%q: allDisabled=%v", c.disable, c.enable, f.allDisabled())
		}
		for _, x := range c.ignored {
			if !f.ignored(x) {
				t.Errorf("disable=%q enable=%q: XID %d checked, want ignored", c.disable, c.enable, x)
			}
		}
		for _, x := range c.checked {
			if f.ignored(x) {
				t.Errorf("disable=%q enable=%q: XID %d ignored, want checked", c.disable, c.enable, x)
			}
		}
	}
}

// Without NVML, with health checks off, or when the event set cannot be
// created, the monitor watches nothing, says why, and closes cleanly.
func TestHealthMonitorDegraded(t *testing.T) {
	t.Run("no NVML", func(t *testing.T) {
		m := WatchHealth(context.Background(), gpuOpts(t, noNVML()), quiet)
		m.Close()
		if len(m.Reasons()) != 0 {
			t.Errorf("reasons %q", m.Reasons())
		}
	})
	t.Run("disabled", func(t *testing.T) {
		opts := gpuOpts(t, newDGXA100(t))
		opts.Getenv = func(k string) string {
			if k == "DP_DISABLE_HEALTHCHECKS" {
				return "all"
			}
			return ""
		}
		m := WatchHealth(context.Background(), opts, quiet)
		defer m.Close()
		if r := m.Reasons(); len(r) != 1 || !strings.Contains(r[0], "health checks disabled") {
			t.Errorf("reasons %q", r)
		}
	})
	t.Run("no event set", func(t *testing.T) {
		srv := newDGXA100(t) // the fake has no EventSetCreate
		m := WatchHealth(context.Background(), gpuOpts(t, srv), quiet)
		defer m.Close()
		if r := m.Reasons(); len(r) != 1 || !strings.Contains(r[0], "nvmlEventSetCreate") {
			t.Errorf("reasons %q", r)
		}
		opts := gpuOpts(t, srv)
		opts.Health = m
		inv, err := Discover(ctxT(t), opts)
		if err != nil || inv.Healthy(KindNVIDIA) != 8 || !hasReason(inv, "no GPU health events") {
			t.Errorf("err %v healthy %d reasons %q", err, inv.Healthy(KindNVIDIA), inv.Reasons)
		}
	})
	t.Run("nil event set", func(t *testing.T) {
		srv := newDGXA100(t)
		srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.SUCCESS }
		m := WatchHealth(context.Background(), gpuOpts(t, srv), quiet)
		defer m.Close()
		if r := m.Reasons(); len(r) != 1 || !strings.Contains(r[0], "nvmlEventSetCreate") {
			t.Errorf("reasons %q", r)
		}
	})
	t.Run("context cancel stops it", func(t *testing.T) {
		srv := newDGXA100(t)
		fe := installEvents(srv)
		ctx, cancel := context.WithCancel(context.Background())
		m := WatchHealth(ctx, gpuOpts(t, srv), quiet)
		cancel()
		select {
		case <-m.done:
		case <-time.After(5 * time.Second):
			t.Fatal("monitor still running after cancel")
		}
		m.Close()
		<-fe.freed
	})
}

// A failing event wait makes every GPU suspect, as in the device plugin.
func TestHealthMonitorWaitError(t *testing.T) {
	srv := newDGXA100(t)
	installEvents(srv)
	set, _ := srv.EventSetCreate()
	failedOnce := false
	set.(*mock.EventSet).WaitFunc = func(ms uint32) (nvml.EventData, nvml.Return) {
		if !failedOnce {
			failedOnce = true
			return nvml.EventData{}, nvml.ERROR_UNKNOWN
		}
		time.Sleep(time.Duration(ms) * time.Millisecond)
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
	opts := gpuOpts(t, srv)
	m := WatchHealth(context.Background(), opts, quiet)
	defer m.Close()
	waitChanged(t, m)
	opts.Health = m
	inv, err := Discover(ctxT(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	if inv.Healthy(KindNVIDIA) != 0 || !strings.Contains(inv.GPUs()[7].HealthReason, "nvmlEventSetWait failed") {
		t.Errorf("healthy %d, GPU 7 %q", inv.Healthy(KindNVIDIA), inv.GPUs()[7].HealthReason)
	}
}

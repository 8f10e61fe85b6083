package devices

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// GPU health follows NVIDIA's k8s-device-plugin (internal/rm/health.go): an
// NVML event set registered for critical XID errors, and a GPU is unhealthy
// from its first critical XID on (until the agent restarts), except for the
// XIDs that are application errors after which the GPU is still fine. We
// also treat double-bit ECC events as fatal (the device plugin registers for
// them but acts only on XIDs; a DBE is followed by XID 48 anyway).
//
// The same environment variables tune it:
//
//	DP_DISABLE_HEALTHCHECKS  "all" or "xids": no XID health checks;
//	                         a comma-separated XID list: also ignore these
//	DP_ENABLE_HEALTHCHECKS   a comma-separated XID list (or "all") that is
//	                         checked even if ignored above

const (
	envDisableHealthChecks = "DP_DISABLE_HEALTHCHECKS"
	envEnableHealthChecks  = "DP_ENABLE_HEALTHCHECKS"
)

// IgnoredXIDs are the XIDs NVIDIA's device plugin ignores: application
// errors after which the GPU is still healthy.
var IgnoredXIDs = []uint64{
	13,  // Graphics Engine Exception
	31,  // GPU memory page fault
	43,  // GPU stopped processing
	45,  // Preemptive cleanup, due to previous errors
	68,  // Video processor exception
	109, // Context Switch Timeout Error
}

// allXIDs is the key meaning "every XID" in an xidFilter.
const allXIDs = 0

// xidFilter maps an XID to whether it is ignored; key allXIDs stands for
// every XID (the device plugin's disabledXIDs).
type xidFilter map[uint64]bool

func parseXIDs(s string) xidFilter {
	out := xidFilter{}
	for _, f := range strings.Split(strings.ToLower(s), ",") {
		f = strings.TrimSpace(f)
		if f == "all" || f == "xids" {
			return xidFilter{allXIDs: true}
		}
		if f == "" {
			continue
		}
		if id, err := strconv.ParseUint(f, 10, 64); err == nil {
			out[id] = true
		}
	}
	return out
}

func newXIDFilter(disable, enable string) xidFilter {
	disabled := parseXIDs(disable)
	for _, x := range IgnoredXIDs {
		disabled[x] = true
	}
	for x := range parseXIDs(enable) {
		disabled[x] = false
	}
	return disabled
}

// allDisabled: every XID ignored and none explicitly enabled. (The device
// plugin's code disables everything here even when some XIDs are enabled,
// against its own documentation; we follow the documentation.)
func (f xidFilter) allDisabled() bool {
	if !f[allXIDs] {
		return false
	}
	for _, ignored := range f {
		if !ignored {
			return false
		}
	}
	return true
}

func (f xidFilter) ignored(xid uint64) bool {
	if all, ok := f[allXIDs]; ok && !all {
		return false // DP_ENABLE_HEALTHCHECKS=all
	}
	if d, ok := f[xid]; ok {
		return d
	}
	return f[allXIDs]
}

// healthWait is how long one NVML event wait blocks; it bounds how long
// Close takes.
var healthWait = 500 * time.Millisecond

type migKey struct {
	gpu    string
	gi, ci uint32
}

// HealthMonitor watches NVML events for critical XIDs and double-bit ECC
// errors. Pass it in Options.Health so Discover marks the affected GPUs (or
// MIG devices) unhealthy, and wait on Changed to rediscover at once.
type HealthMonitor struct {
	log     *slog.Logger
	lib     nvml.Interface
	set     nvml.EventSet
	filter  xidFilter
	changed chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
	close   sync.Once

	mu      sync.Mutex
	uuids   map[string]bool // registered GPUs
	gpu     map[string]string
	mig     map[migKey]string
	reasons []string
}

// WatchHealth starts watching the GPUs' health events until ctx is done or
// Close is called. It never fails: without NVML, without GPUs, or with
// health checks disabled it watches nothing and Reasons says why.
func WatchHealth(ctx context.Context, opts Options, log *slog.Logger) *HealthMonitor {
	if log == nil {
		log = slog.Default()
	}
	m := &HealthMonitor{
		log:     log,
		changed: make(chan struct{}, 1),
		done:    make(chan struct{}),
		uuids:   map[string]bool{},
		gpu:     map[string]string{},
		mig:     map[migKey]string{},
	}
	if opts.DisableNVML {
		close(m.done)
		return m
	}
	m.filter = newXIDFilter(opts.getenv(envDisableHealthChecks), opts.getenv(envEnableHealthChecks))
	if m.filter.allDisabled() {
		m.reasons = append(m.reasons, fmt.Sprintf("nvidia: XID health checks disabled (%s=%q)", envDisableHealthChecks, opts.getenv(envDisableHealthChecks)))
		close(m.done)
		return m
	}
	lib := opts.nvml()
	if ret := guard0(lib.Init); ret != nvml.SUCCESS {
		close(m.done) // no NVML: Discover already reports why
		return m
	}
	set, ret := guard1(lib.EventSetCreate)
	if ret != nvml.SUCCESS || set == nil {
		m.reasons = append(m.reasons, fmt.Sprintf("nvidia: no GPU health events: nvmlEventSetCreate: %v", ret))
		guard0(lib.Shutdown)
		close(m.done)
		return m
	}
	m.lib, m.set = lib, set
	m.register()
	ctx, m.cancel = context.WithCancel(ctx)
	go m.run(ctx)
	return m
}

// register adds every GPU to the event set, as the device plugin does: a GPU
// that cannot be registered is unhealthy, unless it is merely too old.
func (m *HealthMonitor) register() {
	count, ret := guard1(m.lib.DeviceGetCount)
	if ret != nvml.SUCCESS {
		m.reasons = append(m.reasons, fmt.Sprintf("nvidia: no GPU health events: nvmlDeviceGetCount: %v", ret))
		return
	}
	const mask = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)
	for i := 0; i < count && i < 1024; i++ {
		dev, ret := guard1(func() (nvml.Device, nvml.Return) { return m.lib.DeviceGetHandleByIndex(i) })
		if ret != nvml.SUCCESS || dev == nil {
			continue // Discover reports the GPU itself
		}
		uuid, ret := guard1(dev.GetUUID)
		if ret != nvml.SUCCESS {
			continue
		}
		m.uuids[uuid] = true
		supported, ret := guard1(dev.GetSupportedEventTypes)
		if ret == nvml.SUCCESS {
			ret = guard0(func() nvml.Return { return dev.RegisterEvents(mask&supported, m.set) })
		}
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
			m.reasons = append(m.reasons, fmt.Sprintf("nvidia: GPU %d does not support health events: %v", i, ret))
		default:
			m.gpu[uuid] = fmt.Sprintf("cannot register for health events: %v", ret)
		}
	}
}

func (m *HealthMonitor) run(ctx context.Context) {
	defer close(m.done)
	for ctx.Err() == nil {
		ev, ret := guard1(func() (nvml.EventData, nvml.Return) { return m.set.Wait(uint32(healthWait / time.Millisecond)) })
		switch ret {
		case nvml.SUCCESS:
			m.handle(ev)
		case nvml.ERROR_TIMEOUT:
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
			m.mu.Lock()
			m.reasons = append(m.reasons, fmt.Sprintf("nvidia: no GPU health events: nvmlEventSetWait: %v", ret))
			m.mu.Unlock()
			m.notify()
			return
		default:
			// The device plugin's rule: an event we cannot read may be the
			// one that mattered, so every GPU is suspect.
			m.markAll(fmt.Sprintf("nvmlEventSetWait failed: %v", ret))
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (m *HealthMonitor) handle(ev nvml.EventData) {
	var reason string
	switch {
	case ev.EventType&nvml.EventTypeXidCriticalError != 0:
		if m.filter.ignored(ev.EventData) {
			m.log.Info("ignoring GPU XID", "xid", ev.EventData)
			return
		}
		reason = fmt.Sprintf("critical XID %d", ev.EventData)
	case ev.EventType&nvml.EventTypeDoubleBitEccError != 0:
		reason = "double-bit ECC error"
	default:
		return
	}
	uuid, ret := guard1(func() (string, nvml.Return) { return ev.Device.GetUUID() })
	if ret != nvml.SUCCESS {
		m.markAll(fmt.Sprintf("%s on a GPU whose UUID cannot be read (%v)", reason, ret))
		return
	}
	m.mu.Lock()
	if !m.uuids[uuid] {
		m.mu.Unlock()
		return
	}
	if ev.GpuInstanceId != 0xFFFFFFFF && ev.ComputeInstanceId != 0xFFFFFFFF {
		k := migKey{uuid, ev.GpuInstanceId, ev.ComputeInstanceId}
		if _, seen := m.mig[k]; !seen {
			m.mig[k] = reason
		}
		m.log.Warn("MIG device unhealthy", "gpu", uuid, "gi", ev.GpuInstanceId, "ci", ev.ComputeInstanceId, "reason", reason)
	} else {
		if _, seen := m.gpu[uuid]; !seen {
			m.gpu[uuid] = reason
		}
		m.log.Warn("GPU unhealthy", "gpu", uuid, "reason", reason)
	}
	m.mu.Unlock()
	m.notify()
}

func (m *HealthMonitor) markAll(reason string) {
	m.mu.Lock()
	for u := range m.uuids {
		if _, seen := m.gpu[u]; !seen {
			m.gpu[u] = reason
		}
	}
	m.mu.Unlock()
	m.log.Warn("all GPUs marked unhealthy", "reason", reason)
	m.notify()
}

func (m *HealthMonitor) notify() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// Changed receives a value (coalesced) after a device's health changed.
// It is never closed.
func (m *HealthMonitor) Changed() <-chan struct{} { return m.changed }

// Reasons says what the monitor cannot watch, if anything.
func (m *HealthMonitor) Reasons() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.reasons...)
}

// Apply marks the inventory's GPUs and MIG devices that had health events
// unhealthy and adds the monitor's reasons.
func (m *HealthMonitor) Apply(inv *Inventory) {
	m.mu.Lock()
	defer m.mu.Unlock()
	inv.Reasons = append(inv.Reasons, m.reasons...)
	for i := range inv.Accelerators {
		a := &inv.Accelerators[i]
		if a.Kind != KindNVIDIA || a.UUID == "" {
			continue
		}
		if r, bad := m.gpu[a.UUID]; bad {
			markUnhealthy(&a.Healthy, &a.HealthReason, r)
			inv.Reasons = append(inv.Reasons, fmt.Sprintf("nvidia: GPU %d unhealthy: %s", a.Index, r))
		}
		if a.MIG == nil {
			continue
		}
		for j := range a.MIG.Devices {
			d := &a.MIG.Devices[j]
			if d.GPUInstance < 0 || d.ComputeInstance < 0 {
				continue
			}
			if r, bad := m.mig[migKey{a.UUID, uint32(d.GPUInstance), uint32(d.ComputeInstance)}]; bad {
				markUnhealthy(&d.Healthy, &d.HealthReason, r)
				inv.Reasons = append(inv.Reasons, fmt.Sprintf("nvidia: GPU %d MIG device %d unhealthy: %s", a.Index, d.Index, r))
			}
		}
	}
}

func markUnhealthy(healthy *bool, reason *string, r string) {
	*healthy = false
	if *reason == "" {
		*reason = r
	} else if !strings.Contains(*reason, r) {
		*reason += "; " + r
	}
}

// Unhealthy lists the UUIDs of GPUs with health events, sorted.
func (m *HealthMonitor) Unhealthy() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.gpu))
	for u := range m.gpu {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// Close stops watching and releases the event set. It is safe to call more
// than once.
func (m *HealthMonitor) Close() {
	m.close.Do(func() {
		if m.cancel != nil {
			m.cancel()
		}
		<-m.done
		if m.set != nil {
			guard0(m.set.Free)
			guard0(m.lib.Shutdown)
		}
	})
}

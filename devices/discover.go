package devices

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Options says where Discover looks. The zero value reads the real machine.
type Options struct {
	// NodeName names the node in the inventory (default: the hostname).
	NodeName string
	// NVML is the NVML library. nil means the system's libnvidia-ml.so.1
	// (shared by every caller in the process); tests pass go-nvml's fakes,
	// e.g. pkg/nvml/mock/dgxa100.New().
	NVML nvml.Interface
	// DisableNVML skips NVIDIA discovery.
	DisableNVML bool
	// NeuronSysfsRoot is the Neuron driver's sysfs directory (default
	// DefaultNeuronSysfsRoot).
	NeuronSysfsRoot string
	// DisableNeuron skips Neuron discovery.
	DisableNeuron bool
	// DevRoot is where the host's device nodes can be seen (default "/dev";
	// /host/dev in the DaemonSet): neuron<N> must exist there for a Neuron
	// device to be healthy. Inventories still name them /dev/...
	DevRoot string
	// Host reports CPUs, memory, hostname and boot id (default SystemHost).
	Host HostSource
	// Health, when set, applies the NVML health events it has seen.
	Health *HealthMonitor
	// Getenv reads the environment (default os.Getenv): DP_DISABLE_HEALTHCHECKS,
	// DP_ENABLE_HEALTHCHECKS, NEURON_LOGICAL_NC_CONFIG, CUDA_VISIBLE_DEVICES,
	// NEURON_RT_VISIBLE_CORES.
	Getenv func(string) string
	// Now is the clock for Inventory.UpdatedAt (default time.Now).
	Now func() time.Time
}

var systemNVML = sync.OnceValue(func() nvml.Interface { return nvml.New() })

func (o Options) nvml() nvml.Interface {
	if o.NVML != nil {
		return o.NVML
	}
	return systemNVML()
}

func (o Options) neuronRoot() string {
	if o.NeuronSysfsRoot != "" {
		return o.NeuronSysfsRoot
	}
	return DefaultNeuronSysfsRoot
}

func (o Options) devRoot() string {
	if o.DevRoot != "" {
		return o.DevRoot
	}
	return "/dev"
}

func (o Options) host() HostSource {
	if o.Host != nil {
		return o.Host
	}
	return SystemHost{}
}

func (o Options) getenv(k string) string {
	if o.Getenv != nil {
		return o.Getenv(k)
	}
	return os.Getenv(k)
}

func (o Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// Discover inventories the node: NVIDIA GPUs, Neuron devices, host CPUs and
// memory, and the node's flavors.
//
// A node without an NVIDIA driver or Neuron driver is normal: no devices of
// that kind and a reason in Inventory.Reasons. Malformed inputs (a corrupt
// sysfs file, a failing NVML count) make Discover return an error naming
// what was wrong, together with the inventory it could still build (devices
// it could not fully read are listed unhealthy). Callers that can use a
// partial inventory (the node agent) do; others treat the error as fatal.
// The inventory is nil only when ctx is done or the node name is invalid.
func Discover(ctx context.Context, opts Options) (*Inventory, error) {
	var errs []error
	inv := &Inventory{Accelerators: []Accelerator{}}

	h, err := opts.host().HostInfo(ctx)
	if err != nil {
		errs = append(errs, err)
		inv.Reasons = append(inv.Reasons, "host: "+err.Error())
	}
	inv.Hostname, inv.BootID, inv.VCPUs, inv.MemoryBytes = h.Hostname, h.BootID, h.VCPUs, h.MemoryBytes
	inv.Node = opts.NodeName
	if inv.Node == "" {
		inv.Node = h.Hostname
	}
	if inv.Node == "" {
		inv.Node, _ = os.Hostname()
	}
	if err := ValidateNodeName(inv.Node); err != nil {
		return nil, err
	}

	if !opts.DisableNVML {
		accs, driver, reasons, err := discoverNVIDIA(ctx, opts.nvml())
		if err != nil {
			errs = append(errs, err)
			inv.Reasons = append(inv.Reasons, strings.Split(err.Error(), "\n")...)
		}
		inv.NVIDIADriver = driver
		inv.Accelerators = append(inv.Accelerators, accs...)
		inv.Reasons = append(inv.Reasons, reasons...)
	}
	if !opts.DisableNeuron {
		accs, reasons, err := discoverNeuron(ctx, opts.neuronRoot(), opts.devRoot(), opts.getenv)
		if err != nil {
			errs = append(errs, err)
			inv.Reasons = append(inv.Reasons, strings.Split(err.Error(), "\n")...)
		}
		inv.Accelerators = append(inv.Accelerators, accs...)
		inv.Reasons = append(inv.Reasons, reasons...)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("discover: %w", err)
	}
	if opts.Health != nil {
		opts.Health.Apply(inv)
	}
	inv.Flavors = nodeFlavors(inv.Accelerators)
	inv.Flavor = inv.Flavors[0]
	inv.UpdatedAt = opts.now().UTC()
	return inv, errors.Join(errs...)
}

package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Accelerator kinds.
const (
	// KindNVIDIA is an NVIDIA GPU found through NVML.
	KindNVIDIA = "nvidia-gpu"
	// KindNeuron is an AWS Neuron device (Inferentia, Trainium) found
	// through sysfs.
	KindNeuron = "neuron"
)

// Node states, in Inventory.State.
const (
	// StateReady: the node's agent is running and accepts work.
	StateReady = "ready"
	// StateDraining: the agent is shutting down (SIGTERM); place no new work.
	StateDraining = "draining"
)

// FlavorCPU is the flavor of a node without accelerators.
const FlavorCPU = "cpu"

// Inventory is what one node offers. It is the JSON value of
// <prefix>/nodes/<node> in etcd: the node agent writes it (package devices
// discovers its content), the coordinator, elasticctl and the Kubernetes
// bridge read it. The record lives here, apart from discovery, so its
// readers do not link NVML or gopsutil.
type Inventory struct {
	// Node is the node name (the Kubernetes node name under the DaemonSet).
	Node string `json:"node"`
	// State is StateReady or StateDraining (set by the node agent; empty
	// straight out of Discover).
	State string `json:"state,omitempty"`
	// Flavor is the node's main flavor: the flavor of most of its
	// accelerators, or "cpu". Quotas are per flavor.
	Flavor string `json:"flavor"`
	// Flavors lists every flavor present on the node (sorted, most
	// accelerators first); Flavor is Flavors[0].
	Flavors []string `json:"flavors"`
	// Accelerators are the node's GPUs and Neuron devices, GPUs first, each
	// kind in index order.
	Accelerators []Accelerator `json:"accelerators"`
	// VCPUs is the number of logical CPUs.
	VCPUs int `json:"vcpus"`
	// MemoryBytes is the host's total memory.
	MemoryBytes uint64 `json:"memoryBytes"`
	// Hostname is the host's name as the kernel knows it.
	Hostname string `json:"hostname,omitempty"`
	// BootID changes on every reboot (/proc/sys/kernel/random/boot_id).
	BootID string `json:"bootId,omitempty"`
	// NVIDIADriver is the NVIDIA driver version, when NVML is present.
	NVIDIADriver string `json:"nvidiaDriver,omitempty"`
	// Reasons explain what is missing or degraded: no NVIDIA driver, no
	// Neuron driver, a malformed sysfs file, an unhealthy device, ...
	Reasons []string `json:"reasons,omitempty"`
	// UpdatedAt is when this inventory was discovered.
	UpdatedAt time.Time `json:"updatedAt"`
	// Liveness says what proves the node alive besides the record's own
	// lease: LivenessAliveKey, or empty (the lease alone, as older agents
	// and hand-written records have it).
	Liveness string `json:"liveness,omitempty"`
}

// LivenessAliveKey in Inventory.Liveness: the node counts only while its
// agent's alive/<node> key exists. That key lives under a lease whose id
// only the agent knows (package secretlease), so nobody else can keep a
// dead node alive by sending keepalives for the record's lease, whose id
// every reader of the record sees.
const LivenessAliveKey = "alive-key"

// Accelerator is one GPU or Neuron device.
type Accelerator struct {
	// Kind is KindNVIDIA or KindNeuron.
	Kind string `json:"kind"`
	// Index is the NVML index or the Neuron device number (neuron<N>).
	Index int `json:"index"`
	// Name is the model as reported by the driver, e.g.
	// "NVIDIA H100 80GB HBM3" or "Trainium2".
	Name string `json:"name"`
	// Flavor is the accelerator's flavor, e.g. "nvidia-h100-80gb".
	Flavor string `json:"flavor"`
	// UUID is the GPU UUID ("GPU-..."); for Neuron devices, the serial
	// number when the driver exposes it.
	UUID string `json:"uuid,omitempty"`
	// PCIBusID is the PCI address, e.g. "00000000:07:00.0" (GPUs).
	PCIBusID string `json:"pciBusId,omitempty"`
	// Minor is the device minor number (/dev/nvidia<minor>); -1 if unknown.
	Minor int `json:"minor"`
	// DevicePath is the device node on the host, e.g. /dev/nvidia0 or
	// /dev/neuron0 (whatever devices.Options.DevRoot the agent inspected it under).
	DevicePath string `json:"devicePath,omitempty"`
	// MemoryBytes is the device memory (GPUs).
	MemoryBytes uint64 `json:"memoryBytes,omitempty"`
	// Cores is the number of physical NeuronCores (Neuron devices).
	Cores int `json:"cores,omitempty"`
	// LogicalCores is the number of logical NeuronCores the Neuron runtime
	// exposes (Cores / logical-core size; what NEURON_RT_VISIBLE_CORES counts).
	LogicalCores int `json:"logicalCores,omitempty"`
	// ConnectedDevices are the Neuron devices this one has direct links to.
	ConnectedDevices []int `json:"connectedDevices,omitempty"`
	// Arch is the Neuron architecture (arch_type, e.g. "NDv2"), if known.
	Arch string `json:"arch,omitempty"`
	// MIG is the GPU's MIG state; nil when the GPU has no MIG support.
	MIG *MIG `json:"mig,omitempty"`
	// Healthy is false when the device must not be used.
	Healthy bool `json:"healthy"`
	// HealthReason says why the device is unhealthy.
	HealthReason string `json:"healthReason,omitempty"`
}

// MIG is the Multi-Instance GPU state of one GPU.
type MIG struct {
	// Enabled is the current MIG mode.
	Enabled bool `json:"enabled"`
	// Pending is the mode after the next GPU reset, when different.
	Pending *bool `json:"pending,omitempty"`
	// Devices are the MIG devices (one per compute instance).
	Devices []MIGDevice `json:"devices,omitempty"`
}

// MIGDevice is one MIG device: a compute instance inside a GPU instance.
type MIGDevice struct {
	// Index is the MIG device index on its parent GPU.
	Index int `json:"index"`
	// UUID is the MIG device UUID ("MIG-..."), what CUDA_VISIBLE_DEVICES takes.
	UUID string `json:"uuid,omitempty"`
	// Profile is the MIG profile, e.g. "1g.5gb" or "1c.2g.10gb".
	Profile string `json:"profile,omitempty"`
	// GPUInstance and ComputeInstance identify it on its GPU.
	GPUInstance     int `json:"gpuInstance"`
	ComputeInstance int `json:"computeInstance"`
	// MemoryBytes is the MIG device's memory.
	MemoryBytes uint64 `json:"memoryBytes,omitempty"`
	// Healthy is false after a critical XID on this MIG device.
	Healthy bool `json:"healthy"`
	// HealthReason says why it is unhealthy.
	HealthReason string `json:"healthReason,omitempty"`
}

// GPUs returns the NVIDIA GPUs of the inventory.
func (inv *Inventory) GPUs() []Accelerator { return inv.byKind(KindNVIDIA) }

// NeuronDevices returns the Neuron devices of the inventory.
func (inv *Inventory) NeuronDevices() []Accelerator { return inv.byKind(KindNeuron) }

func (inv *Inventory) byKind(kind string) []Accelerator {
	var out []Accelerator
	for _, a := range inv.Accelerators {
		if a.Kind == kind {
			out = append(out, a)
		}
	}
	return out
}

// Healthy counts the healthy accelerators of a kind.
func (inv *Inventory) Healthy(kind string) int {
	n := 0
	for _, a := range inv.Accelerators {
		if a.Kind == kind && a.Healthy {
			n++
		}
	}
	return n
}

// NeuronCores is the total number of logical NeuronCores on the node.
func (inv *Inventory) NeuronCores() int {
	n := 0
	for _, a := range inv.NeuronDevices() {
		n += a.LogicalCores
	}
	return n
}

// Equal reports whether two inventories describe the same node state,
// ignoring UpdatedAt.
func (inv *Inventory) Equal(other *Inventory) bool {
	if inv == nil || other == nil {
		return inv == other
	}
	a, b := *inv, *other
	a.UpdatedAt, b.UpdatedAt = time.Time{}, time.Time{}
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

// Clone returns a deep copy.
func (inv *Inventory) Clone() *Inventory {
	if inv == nil {
		return nil
	}
	data, err := json.Marshal(inv)
	if err != nil {
		// Inventory holds only plain data; Marshal cannot fail on it.
		c := *inv
		return &c
	}
	var out Inventory
	if err := json.Unmarshal(data, &out); err != nil {
		c := *inv
		return &c
	}
	return &out
}

var nodeNameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$`)

// ValidateNodeName checks that a node name can be an etcd key segment: 1 to
// 253 letters, digits, '.', '_' or '-', starting and ending alphanumeric
// (every Kubernetes node name qualifies).
func ValidateNodeName(name string) error {
	if !nodeNameRE.MatchString(name) {
		return fmt.Errorf("invalid node name %q: want 1-253 characters [A-Za-z0-9._-], starting and ending with a letter or digit", name)
	}
	return nil
}

// ParseInventory decodes and validates an inventory read from etcd. key
// names the value in errors.
func ParseInventory(key string, data []byte) (*Inventory, error) {
	var inv Inventory
	if err := json.Unmarshal(data, &inv); err != nil {
		return nil, fmt.Errorf("inventory %s: malformed JSON: %w", key, err)
	}
	if err := inv.Validate(); err != nil {
		return nil, fmt.Errorf("inventory %s: %w", key, err)
	}
	return &inv, nil
}

// Validate checks the invariants readers rely on.
func (inv *Inventory) Validate() error {
	var errs []error
	if err := ValidateNodeName(inv.Node); err != nil {
		errs = append(errs, err)
	}
	if inv.Flavor == "" {
		errs = append(errs, errors.New("empty flavor"))
	}
	switch inv.State {
	case "", StateReady, StateDraining:
	default:
		errs = append(errs, fmt.Errorf("unknown state %q", inv.State))
	}
	switch inv.Liveness {
	case "", LivenessAliveKey:
	default:
		errs = append(errs, fmt.Errorf("unknown liveness %q", inv.Liveness))
	}
	if inv.VCPUs < 0 {
		errs = append(errs, fmt.Errorf("negative vcpus %d", inv.VCPUs))
	}
	for i, a := range inv.Accelerators {
		switch a.Kind {
		case KindNVIDIA, KindNeuron:
		default:
			errs = append(errs, fmt.Errorf("accelerator %d: unknown kind %q", i, a.Kind))
		}
		if a.Index < 0 {
			errs = append(errs, fmt.Errorf("accelerator %d: negative index %d", i, a.Index))
		}
		if a.Cores < 0 || a.LogicalCores < 0 {
			errs = append(errs, fmt.Errorf("accelerator %d: negative core count", i))
		}
	}
	return errors.Join(errs...)
}

// Package devices finds what a node can offer to training jobs: NVIDIA GPUs
// through NVML (github.com/NVIDIA/go-nvml), AWS Trainium/Inferentia devices
// through the Neuron driver's sysfs tree, and host CPUs and memory through
// gopsutil. It names the node's flavor(s) (nvidia-h100-80gb, trainium2, cpu,
// ...) and produces the api.Inventory that the node agent stores in etcd
// under <prefix>/nodes/<node>, where the coordinator reads it.
//
// The record itself (api.Inventory, its validation and constants) lives in
// package api, so that its readers do not link NVML or gopsutil; what a
// launcher needs (--nproc-per-node, device pinning) is in devices/local.
//
// A machine without an NVIDIA driver or without the Neuron driver is a
// normal case: that part of the inventory is empty and Inventory.Reasons
// says why. Malformed inputs never panic; they give errors naming the file
// or call that was wrong.
package devices

import "github.com/hyperpodrun/hyperpodrun/api"

// The inventory record is api's; these names stay for the node daemon's
// packages that read it next to discovery.
type (
	// Inventory is api.Inventory.
	Inventory = api.Inventory
	// Accelerator is api.Accelerator.
	Accelerator = api.Accelerator
	// MIG is api.MIG.
	MIG = api.MIG
	// MIGDevice is api.MIGDevice.
	MIGDevice = api.MIGDevice
)

// Record constants, as in api.
const (
	// KindNVIDIA is api.KindNVIDIA.
	KindNVIDIA = api.KindNVIDIA
	// KindNeuron is api.KindNeuron.
	KindNeuron = api.KindNeuron
	// StateReady is api.StateReady.
	StateReady = api.StateReady
	// StateDraining is api.StateDraining.
	StateDraining = api.StateDraining
	// FlavorCPU is api.FlavorCPU.
	FlavorCPU = api.FlavorCPU
	// LivenessAliveKey is api.LivenessAliveKey.
	LivenessAliveKey = api.LivenessAliveKey
)

// ValidateNodeName is api.ValidateNodeName.
func ValidateNodeName(name string) error { return api.ValidateNodeName(name) }

// ParseInventory is api.ParseInventory.
func ParseInventory(key string, data []byte) (*Inventory, error) {
	return api.ParseInventory(key, data)
}

package containers

import (
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/hyperpodrun/hyperpodrun/devices"
)

// CDI device kinds (vendor/class) of the accelerators, as the NVIDIA
// container toolkit (nvidia-ctk cdi generate) and a Neuron CDI generator
// name them: "nvidia.com/gpu=<index>", "aws.amazon.com/neuron=<index>".
const (
	CDIKindNVIDIA = "nvidia.com/gpu"
	CDIKindNeuron = "aws.amazon.com/neuron"
)

// Pick chooses the accelerators a job gets on a node: the first n healthy
// ones of the flavor, in index order. The engine places one job per node,
// so the first n are the job's. flavor "" means the node's main flavor.
func Pick(inv *devices.Inventory, flavor string, n int) ([]devices.Accelerator, error) {
	if n <= 0 {
		return nil, nil
	}
	if inv == nil {
		return nil, fmt.Errorf("the node's inventory is unknown: cannot give the job %d accelerator(s)", n)
	}
	if flavor == "" {
		flavor = inv.Flavor
	}
	var out []devices.Accelerator
	for _, a := range inv.Accelerators {
		if a.Healthy && a.Flavor == flavor {
			out = append(out, a)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	if len(out) < n {
		return nil, fmt.Errorf("the job needs %d %s accelerator(s) on this node; it has %d healthy (hyperpod-agent devices lists them)", n, flavor, len(out))
	}
	return out[:n], nil
}

// Plan is how a container gets its accelerators.
type Plan struct {
	// CDI lists the CDI devices to inject (fully qualified names).
	CDI []string
	// Nodes lists host device nodes to add as they are (no CDI spec).
	Nodes []string
	// Env is what the container's processes are told of their devices.
	Env []string
}

// CDIRegistry is what Plan needs of the CDI specs on the node.
type CDIRegistry interface {
	// HasDevice reports whether a spec defines the fully qualified device.
	HasDevice(name string) bool
	// HasKind reports whether any spec defines devices of vendor/class.
	HasKind(kind string) bool
}

// PlanDevices decides how the accelerators reach a container. Where CDI
// specs define the kind (the NVIDIA container toolkit wrote
// nvidia.com/gpu), each accelerator must be a CDI device "<kind>=<index>";
// a missing one is an error naming it and the fix. Where none do, the
// device nodes themselves are added: /dev/nvidia<minor> plus the driver's
// control nodes present under devRoot and NVIDIA_VISIBLE_DEVICES, or
// /dev/neuron<N> plus NEURON_RT_VISIBLE_CORES (the devices' logical cores,
// numbered as the host numbers them).
func PlanDevices(accels []devices.Accelerator, reg CDIRegistry, devRoot string, exists func(string) bool) (Plan, error) {
	var p Plan
	var gpus, neuronCores []string
	for _, a := range accels {
		kind := CDIKindNVIDIA
		if a.Kind == devices.KindNeuron {
			kind = CDIKindNeuron
		}
		if reg != nil && reg.HasKind(kind) {
			name := kind + "=" + strconv.Itoa(a.Index)
			if !reg.HasDevice(name) {
				return Plan{}, fmt.Errorf("CDI device %s is missing: the node's CDI specs define %s devices but not index %d (regenerate them, e.g. nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)", name, kind, a.Index)
			}
			p.CDI = append(p.CDI, name)
		} else {
			path := a.DevicePath
			if path == "" {
				switch {
				case a.Kind == devices.KindNeuron:
					path = filepath.Join(devRoot, "neuron"+strconv.Itoa(a.Index))
				case a.Minor >= 0:
					path = filepath.Join(devRoot, "nvidia"+strconv.Itoa(a.Minor))
				default:
					return Plan{}, fmt.Errorf("GPU %d has no known device node (its minor number is unknown) and no CDI spec names it: install the NVIDIA container toolkit's CDI specs", a.Index)
				}
			}
			if !exists(path) {
				return Plan{}, fmt.Errorf("device node %s of %s %d does not exist on this node", path, a.Kind, a.Index)
			}
			p.Nodes = append(p.Nodes, path)
		}
		switch a.Kind {
		case devices.KindNeuron:
			n := max(a.LogicalCores, 1)
			for c := a.Index * n; c < (a.Index+1)*n; c++ {
				neuronCores = append(neuronCores, strconv.Itoa(c))
			}
		default:
			gpus = append(gpus, strconv.Itoa(a.Index))
		}
	}
	if len(gpus) > 0 && len(p.Nodes) > 0 {
		for _, ctl := range []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"} {
			if path := filepath.Join(devRoot, ctl); exists(path) {
				p.Nodes = append(p.Nodes, path)
			}
		}
	}
	if len(gpus) > 0 {
		p.Env = append(p.Env, "NVIDIA_VISIBLE_DEVICES="+strings.Join(gpus, ","))
	}
	if len(neuronCores) > 0 {
		p.Env = append(p.Env, "NEURON_RT_VISIBLE_CORES="+strings.Join(neuronCores, ","))
	}
	return p, nil
}

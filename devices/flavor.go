package devices

import (
	"sort"

	"github.com/hyperpodrun/hyperpodrun/api"
)

// GPUFlavor is api.GPUFlavor.
func GPUFlavor(name string, memoryBytes uint64) string { return api.GPUFlavor(name, memoryBytes) }

// NeuronFlavor is api.NeuronFlavor.
func NeuronFlavor(deviceName string) string { return api.NeuronFlavor(deviceName) }

// nodeFlavors lists the flavors present, most accelerators first (ties by
// name); a node without accelerators is "cpu".
func nodeFlavors(accs []Accelerator) []string {
	count := map[string]int{}
	for _, a := range accs {
		count[a.Flavor]++
	}
	if len(count) == 0 {
		return []string{FlavorCPU}
	}
	out := make([]string, 0, len(count))
	for f := range count {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool {
		if count[out[i]] != count[out[j]] {
			return count[out[i]] > count[out[j]]
		}
		return out[i] < out[j]
	})
	return out
}

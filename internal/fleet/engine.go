package fleet

import (
	"github.com/hyperpodrun/hyperpodrun/api"
)

// EngineNode is how the coordinator's engine sees a registered node (the
// coordinator's view, elasticctl's dry runs and the simulator alike).
func EngineNode(inv api.Inventory) api.Node {
	n := api.Node{Name: inv.Node, Flavor: inv.Flavor, VCPUs: inv.VCPUs, Memory: api.ByteSize(inv.MemoryBytes),
		Draining: inv.State == api.StateDraining}
	for _, a := range inv.Accelerators {
		if a.Flavor != inv.Flavor {
			continue
		}
		n.Accelerators++
		if !a.Healthy {
			n.UnhealthyAccelerators++
		}
	}
	if n.Flavor == api.FlavorCPU {
		// CPU nodes are scheduled in whole nodes: one unit each.
		n.Accelerators = 1
	}
	return n
}

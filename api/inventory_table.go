package api

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the inventory for people, in the spirit of
// `nvidia-smi -L` and `neuron-ls`: a node summary, one row per accelerator
// (MIG devices indented under their GPU), then the reasons.
func (inv *Inventory) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Node %s  flavor %s  vCPUs %d  memory %s", inv.Node, strings.Join(inv.Flavors, ","), inv.VCPUs, humanBytes(inv.MemoryBytes))
	if inv.State != "" {
		fmt.Fprintf(&b, "  state %s", inv.State)
	}
	if inv.NVIDIADriver != "" {
		fmt.Fprintf(&b, "  NVIDIA driver %s", inv.NVIDIADriver)
	}
	b.WriteString("\n")
	if len(inv.Accelerators) == 0 {
		b.WriteString("No accelerators.\n")
	} else {
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KIND\tINDEX\tNAME\tFLAVOR\tMEMORY\tCORES\tCONNECTED\tBUS/SERIAL\tUUID\tDEVICE\tHEALTH")
		for _, a := range inv.Accelerators {
			kind := "GPU"
			if a.Kind == KindNeuron {
				kind = "NEURON"
			}
			cores := "-"
			if a.Cores > 0 {
				cores = strconv.Itoa(a.Cores)
				if a.LogicalCores != a.Cores {
					cores += fmt.Sprintf(" (%d logical)", a.LogicalCores)
				}
			}
			conn := "-"
			if len(a.ConnectedDevices) > 0 {
				s := make([]string, len(a.ConnectedDevices))
				for i, c := range a.ConnectedDevices {
					s[i] = strconv.Itoa(c)
				}
				conn = strings.Join(s, ",")
			}
			bus := a.PCIBusID
			uuid := a.UUID
			if a.Kind == KindNeuron {
				bus, uuid = a.UUID, ""
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", kind, a.Index, a.Name, a.Flavor,
				orDash(humanBytes(a.MemoryBytes)), cores, conn, orDash(bus), orDash(uuid), orDash(a.DevicePath), health(a.Healthy, a.HealthReason))
			if a.MIG != nil && a.MIG.Enabled {
				for _, m := range a.MIG.Devices {
					fmt.Fprintf(tw, "  MIG\t%d/%d\t%s\t\t%s\t\t\tgi %d ci %d\t%s\t\t%s\n", a.Index, m.Index, orDash(m.Profile),
						orDash(humanBytes(m.MemoryBytes)), m.GPUInstance, m.ComputeInstance, orDash(m.UUID), health(m.Healthy, m.HealthReason))
				}
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, r := range inv.Reasons {
		fmt.Fprintf(&b, "note: %s\n", r)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func health(ok bool, reason string) string {
	if ok {
		return "healthy"
	}
	if reason == "" {
		return "UNHEALTHY"
	}
	return "UNHEALTHY: " + reason
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func humanBytes(n uint64) string {
	if n == 0 {
		return ""
	}
	const unit = 1024
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v := float64(n)
	i := 0
	for v >= unit && i < len(units)-1 {
		v /= unit
		i++
	}
	if v >= 100 || v == float64(int64(v)) {
		return fmt.Sprintf("%.0f %s", v, units[i])
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

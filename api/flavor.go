package api

import (
	"math"
	"regexp"
	"strconv"
	"strings"
)

// Marketed memory sizes (GB) of data-centre GPUs. NVML reports memory in
// bytes, which rarely equals the size in the product name (an H100 80GB has
// 79.6 GiB, an H200 140.4 GiB, an L4 22.5 GiB); when the name carries no
// size, the measured size snaps to the nearest of these within 7%.
var marketedGB = []float64{8, 12, 16, 24, 32, 40, 48, 64, 80, 94, 96, 141, 144, 180, 186, 192, 288}

var (
	gbInNameRE = regexp.MustCompile(`(?i)^(\d+)gb$`)
	nonAlnumRE = regexp.MustCompile(`[^a-z0-9]+`)
)

// GPUFlavor names an NVIDIA GPU model and memory size (the flavor of its
// Accelerator: node agents and the Kubernetes bridge name them alike), e.g.
// "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb",
// "NVIDIA A100-SXM4-40GB" -> "nvidia-a100-40gb",
// "NVIDIA H200" with 140.4 GiB -> "nvidia-h200-141gb".
func GPUFlavor(name string, memoryBytes uint64) string {
	fields := strings.FieldsFunc(strings.ToLower(name), func(r rune) bool {
		return r == ' ' || r == '-' || r == '_' || r == '/'
	})
	model, sizeGB := "", 0
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		if m := gbInNameRE.FindStringSubmatch(f); m != nil {
			if sizeGB == 0 {
				sizeGB, _ = strconv.Atoi(m[1])
			}
			continue
		}
		if model != "" {
			continue
		}
		switch f {
		case "nvidia", "tesla", "mock", "geforce", "quadro":
			continue
		case "rtx":
			// "RTX A6000", "RTX 6000 Ada": the model is the next token.
			if i+1 < len(fields) {
				model = "rtx-" + fields[i+1]
				i++
				continue
			}
		}
		model = f
	}
	if model == "" {
		model = "unknown"
	}
	if sizeGB == 0 && memoryBytes > 0 {
		sizeGB = snapGB(float64(memoryBytes) / (1 << 30))
	}
	flavor := "nvidia-" + sanitize(model)
	if sizeGB > 0 {
		flavor += "-" + strconv.Itoa(sizeGB) + "gb"
	}
	return flavor
}

func snapGB(gib float64) int {
	best, bestDist := 0.0, math.MaxFloat64
	for _, m := range marketedGB {
		if d := math.Abs(gib-m) / m; d < bestDist {
			best, bestDist = m, d
		}
	}
	if bestDist <= 0.07 {
		return int(best)
	}
	return int(math.Round(gib))
}

// NeuronFlavor names a Neuron device model from its sysfs device_name:
// "Trainium2" -> "trainium2", "Inferentia2" -> "inferentia2".
func NeuronFlavor(deviceName string) string {
	f := sanitize(strings.ToLower(strings.TrimSpace(deviceName)))
	if f == "" {
		return "neuron-unknown"
	}
	return f
}

func sanitize(s string) string {
	return strings.Trim(nonAlnumRE.ReplaceAllString(s, "-"), "-")
}

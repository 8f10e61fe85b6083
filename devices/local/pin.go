package local

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// PinEnv is the environment that pins local rank localRank of nproc workers
// to its devices: CUDA_VISIBLE_DEVICES for ProcGPU, NEURON_RT_VISIBLE_CORES
// for ProcNeuron, nothing for other kinds or an out-of-range rank.
//
// When the agent's own environment already restricts the devices (a
// Kubernetes device plugin or the user set CUDA_VISIBLE_DEVICES or
// NEURON_RT_VISIBLE_CORES), ranks share out that list: each gets an equal
// contiguous slice (len/nproc entries), or entry localRank mod len when
// there are fewer entries than workers. Otherwise rank r gets device r.
func PinEnv(kind string, localRank, nproc int) map[string]string {
	return pinEnv(os.LookupEnv, kind, localRank, nproc)
}

func pinEnv(lookup func(string) (string, bool), kind string, localRank, nproc int) map[string]string {
	if localRank < 0 || nproc <= 0 || localRank >= nproc {
		return nil
	}
	switch kind {
	case ProcGPU:
		var list []string
		if v, ok := lookup(EnvCUDAVisible); ok && strings.TrimSpace(v) != "" {
			for _, e := range strings.Split(v, ",") {
				if e = strings.TrimSpace(e); e != "" {
					list = append(list, e)
				}
			}
		}
		if len(list) == 0 {
			return map[string]string{EnvCUDAVisible: strconv.Itoa(localRank)}
		}
		return map[string]string{EnvCUDAVisible: strings.Join(share(list, localRank, nproc), ",")}
	case ProcNeuron:
		if v, ok := lookup(EnvNeuronVisible); ok && strings.TrimSpace(v) != "" {
			cores, err := ParseCoreList(v)
			if err == nil && len(cores) > 0 {
				return map[string]string{EnvNeuronVisible: formatCores(share(cores, localRank, nproc))}
			}
		}
		return map[string]string{EnvNeuronVisible: strconv.Itoa(localRank)}
	default:
		return nil
	}
}

func share[T any](list []T, rank, nproc int) []T {
	if len(list) < nproc {
		return []T{list[rank%len(list)]}
	}
	k := len(list) / nproc
	return list[rank*k : (rank+1)*k]
}

// formatCores writes a core list as NEURON_RT_VISIBLE_CORES does: "4",
// "4-7", or "1,3,5".
func formatCores(cores []int) string {
	c := append([]int(nil), cores...)
	sort.Ints(c)
	contiguous := true
	for i := 1; i < len(c); i++ {
		if c[i] != c[i-1]+1 {
			contiguous = false
			break
		}
	}
	if len(c) == 1 {
		return strconv.Itoa(c[0])
	}
	if contiguous {
		return fmt.Sprintf("%d-%d", c[0], c[len(c)-1])
	}
	s := make([]string, len(c))
	for i, v := range c {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

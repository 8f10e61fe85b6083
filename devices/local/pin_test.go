package local

import (
	"reflect"
	"testing"
)

func TestPinEnv(t *testing.T) {
	env := func(kv map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
	}
	none := env(nil)
	for _, c := range []struct {
		name   string
		lookup func(string) (string, bool)
		kind   string
		rank   int
		nproc  int
		want   map[string]string
	}{
		{"gpu rank 3", none, ProcGPU, 3, 8, map[string]string{"CUDA_VISIBLE_DEVICES": "3"}},
		{"neuron rank 5", none, ProcNeuron, 5, 32, map[string]string{"NEURON_RT_VISIBLE_CORES": "5"}},
		{"cpu", none, ProcCPU, 0, 4, nil},
		{"explicit count", none, "", 0, 4, nil},
		{"rank out of range", none, ProcGPU, 4, 4, nil},
		{"negative rank", none, ProcGPU, -1, 4, nil},
		{"parent GPUs, one each", env(map[string]string{"CUDA_VISIBLE_DEVICES": "4,5,6,7"}), ProcGPU, 2, 4, map[string]string{"CUDA_VISIBLE_DEVICES": "6"}},
		{"parent GPUs, two each", env(map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c,GPU-d"}), ProcGPU, 1, 2, map[string]string{"CUDA_VISIBLE_DEVICES": "GPU-c,GPU-d"}},
		{"fewer GPUs than workers", env(map[string]string{"CUDA_VISIBLE_DEVICES": "0,1"}), ProcGPU, 3, 4, map[string]string{"CUDA_VISIBLE_DEVICES": "1"}},
		{"parent cores, range", env(map[string]string{"NEURON_RT_VISIBLE_CORES": "8-15"}), ProcNeuron, 1, 2, map[string]string{"NEURON_RT_VISIBLE_CORES": "12-15"}},
		{"parent cores, list", env(map[string]string{"NEURON_RT_VISIBLE_CORES": "1,3,5,7"}), ProcNeuron, 0, 2, map[string]string{"NEURON_RT_VISIBLE_CORES": "1,3"}},
		{"bad parent cores", env(map[string]string{"NEURON_RT_VISIBLE_CORES": "x"}), ProcNeuron, 1, 2, map[string]string{"NEURON_RT_VISIBLE_CORES": "1"}},
	} {
		if got := pinEnv(c.lookup, c.kind, c.rank, c.nproc); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: pinEnv = %v, want %v", c.name, got, c.want)
		}
	}
	// The exported form reads the process environment.
	t.Setenv("CUDA_VISIBLE_DEVICES", "2,3")
	if got := PinEnv(ProcGPU, 1, 2); got["CUDA_VISIBLE_DEVICES"] != "3" {
		t.Errorf("PinEnv = %v", got)
	}
}

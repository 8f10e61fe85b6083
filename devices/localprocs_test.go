package devices

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// --nproc-per-node gpu counts GPUs as torch does under CUDA_VISIBLE_DEVICES:
// the prefix of valid entries (indices or UUIDs, MIG UUIDs included).
func TestLocalProcsCUDAVisibleDevices(t *testing.T) {
	srv := newDGXA100(t)
	enableMIG(t, srv.Devices[7].(*dgxa100.Device), []int{nvml.GPU_INSTANCE_PROFILE_1_SLICE}, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE})
	uuid1 := srv.Devices[1].(*dgxa100.Device).UUID
	inv, err := Discover(ctxT(t), gpuOpts(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	mig := inv.GPUs()[7].MIG.Devices[0].UUID
	for _, c := range []struct {
		cvd  string
		want int
	}{
		{"0,1,2,3", 4},
		{"3,1", 2},
		{"0,1,9,2", 2},         // stops at the first invalid entry
		{"0,0,1", 1},           // and at a repeat
		{uuid1[:12] + ",5", 2}, // abbreviated UUID
		{mig, 1},
		{"GPU-nope,0", 0},
		{"-1", 0},
	} {
		opts := gpuOpts(t, srv)
		opts.Getenv = func(k string) string {
			if k == "CUDA_VISIBLE_DEVICES" {
				return c.cvd
			}
			return ""
		}
		n, kind, err := LocalProcsWith(ctxT(t), "gpu", opts)
		if c.want == 0 {
			if err == nil {
				t.Errorf("CUDA_VISIBLE_DEVICES=%q: gpu mode gave %d, want an error", c.cvd, n)
			}
			// auto falls back to one CPU worker (issue 5).
			if n, kind, err := LocalProcsWith(ctxT(t), "auto", opts); err != nil || n != 1 || kind != ProcCPU {
				t.Errorf("CUDA_VISIBLE_DEVICES=%q: auto = %d %q %v", c.cvd, n, kind, err)
			}
			continue
		}
		if err != nil || n != c.want || kind != ProcGPU {
			t.Errorf("CUDA_VISIBLE_DEVICES=%q: %d %q %v, want %d", c.cvd, n, kind, err, c.want)
		}
	}
}

package devices

import (
	"context"
	"os"
	"strings"

	"github.com/hyperpodrun/hyperpodrun/devices/local"
)

// Process kinds returned by LocalProcs (local's, which a launcher uses).
const (
	// ProcGPU is local.ProcGPU.
	ProcGPU = local.ProcGPU
	// ProcNeuron is local.ProcNeuron.
	ProcNeuron = local.ProcNeuron
	// ProcCPU is local.ProcCPU.
	ProcCPU = local.ProcCPU
)

// LocalProcs resolves torchrun's --nproc-per-node on this machine by
// local.Resolve's rules, with NVML as its GPU source (so MIG UUIDs in
// CUDA_VISIBLE_DEVICES are checked). hyperpodrun uses local.LocalProcs,
// which reads the driver's /proc files and links no NVML.
func LocalProcs(ctx context.Context, mode string) (n int, kind string, err error) {
	return LocalProcsWith(ctx, mode, Options{})
}

// LocalProcsWith is LocalProcs reading the machine through opts.
func LocalProcsWith(ctx context.Context, mode string, opts Options) (n int, kind string, err error) {
	return local.Resolve(ctx, mode, local.Sources{
		GPUs: func(ctx context.Context) ([]local.GPU, string, bool, error) {
			if opts.DisableNVML {
				return nil, "NVIDIA discovery disabled", false, nil
			}
			accs, _, reasons, err := discoverNVIDIA(ctx, opts.nvml())
			if err != nil {
				return nil, "", false, err
			}
			gpus := make([]local.GPU, len(accs))
			for i, a := range accs {
				gpus[i].UUID = a.UUID
				if a.MIG != nil {
					for _, m := range a.MIG.Devices {
						gpus[i].MIG = append(gpus[i].MIG, m.UUID)
					}
				}
			}
			return gpus, strings.Join(reasons, "; "), false, nil
		},
		NeuronCores: func(ctx context.Context) (int, error) {
			if opts.DisableNeuron {
				return 0, nil
			}
			accs, _, err := discoverNeuron(ctx, opts.neuronRoot(), opts.devRoot(), opts.getenv)
			total := 0
			for _, a := range accs {
				total += a.LogicalCores
			}
			return total, err
		},
		CPUs: func(ctx context.Context) (int, error) {
			h, err := opts.host().HostInfo(ctx)
			return h.VCPUs, err
		},
		Getenv: func(k string) (string, bool) {
			if opts.Getenv != nil {
				v := opts.Getenv(k)
				return v, v != ""
			}
			return os.LookupEnv(k)
		},
	})
}

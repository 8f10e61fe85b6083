package containers

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hyperpodrun/hyperpodrun/devices"
)

func fakeGPUs(n int) []devices.Accelerator {
	var out []devices.Accelerator
	for i := range n {
		out = append(out, devices.Accelerator{Kind: devices.KindNVIDIA, Index: i, Minor: i, Flavor: "h100", Healthy: true})
	}
	return out
}

type fakeCDI map[string]bool

func (f fakeCDI) HasDevice(name string) bool { return f[name] }
func (f fakeCDI) HasKind(kind string) bool {
	for n := range f {
		if strings.HasPrefix(n, kind+"=") {
			return true
		}
	}
	return false
}

func TestPlanDevices(t *testing.T) {
	gpus := fakeGPUs(4)
	neuron := []devices.Accelerator{{Kind: devices.KindNeuron, Index: 1, LogicalCores: 2, Minor: -1, Healthy: true}}
	all := func(string) bool { return true }
	only := func(paths ...string) func(string) bool {
		return func(p string) bool {
			for _, q := range paths {
				if p == q {
					return true
				}
			}
			return false
		}
	}
	cases := []struct {
		name    string
		accels  []devices.Accelerator
		reg     CDIRegistry
		exists  func(string) bool
		want    Plan
		wantErr string
	}{
		{name: "no accelerators", want: Plan{}},
		{name: "CDI specs name the GPUs", accels: gpus[2:4], reg: fakeCDI{"nvidia.com/gpu=2": true, "nvidia.com/gpu=3": true}, exists: all,
			want: Plan{CDI: []string{"nvidia.com/gpu=2", "nvidia.com/gpu=3"}, Env: []string{"NVIDIA_VISIBLE_DEVICES=2,3"}}},
		{name: "CDI specs lack one GPU", accels: gpus[2:4], reg: fakeCDI{"nvidia.com/gpu=2": true}, exists: all,
			wantErr: "CDI device nvidia.com/gpu=3 is missing"},
		{name: "no CDI: device nodes and control nodes present", accels: gpus[1:2], reg: fakeCDI{}, exists: only("/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"),
			want: Plan{Nodes: []string{"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"}, Env: []string{"NVIDIA_VISIBLE_DEVICES=1"}}},
		{name: "no CDI: a missing device node", accels: gpus[1:2], exists: only(),
			wantErr: "device node /dev/nvidia1 of nvidia-gpu 1 does not exist"},
		{name: "Neuron without CDI: device node and its logical cores", accels: neuron, exists: all,
			want: Plan{Nodes: []string{"/dev/neuron1"}, Env: []string{"NEURON_RT_VISIBLE_CORES=2,3"}}},
		{name: "Neuron with CDI", accels: neuron, reg: fakeCDI{"aws.amazon.com/neuron=1": true}, exists: all,
			want: Plan{CDI: []string{"aws.amazon.com/neuron=1"}, Env: []string{"NEURON_RT_VISIBLE_CORES=2,3"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := PlanDevices(c.accels, c.reg, "/dev", c.exists)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v %v, want %+v", got, err, c.want)
			}
		})
	}
}

func TestPickTakesTheFirstHealthyOfTheFlavor(t *testing.T) {
	inv := &devices.Inventory{Flavor: "h100", Accelerators: fakeGPUs(4)}
	inv.Accelerators[0].Healthy = false
	got, err := Pick(inv, "", 2)
	if err != nil || len(got) != 2 || got[0].Index != 1 || got[1].Index != 2 {
		t.Fatalf("Pick: %+v %v", got, err)
	}
	if _, err := Pick(inv, "", 4); err == nil || !strings.Contains(err.Error(), "needs 4 h100 accelerator(s) on this node; it has 3 healthy") {
		t.Errorf("too few: %v", err)
	}
	if got, err := Pick(inv, "", 0); err != nil || got != nil {
		t.Errorf("none: %v %v", got, err)
	}
	if _, err := Pick(nil, "", 1); err == nil {
		t.Error("nil inventory accepted")
	}
}

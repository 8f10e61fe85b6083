package devices

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// The trn1, trn2 and inf2 fixture trees are read as their nodes: model,
// flavor, cores (logical cores at the runtime's default LNC), topology,
// device nodes, health; and --nproc-per-node auto picks the NeuronCores.
func TestDiscoverNeuronFixtures(t *testing.T) {
	for _, c := range []struct {
		node          string
		devices       int
		name, flavor  string
		cores, lcores int
		conn0         []int
		procs         int
	}{
		{"trn1", 16, "Trainium1", "trainium1", 2, 2, []int{12, 3, 4, 1}, 32},
		{"trn2", 16, "Trainium2", "trainium2", 8, 4, []int{12, 3, 4, 1}, 64},
		{"inf2", 12, "Inferentia2", "inferentia2", 2, 2, []int{11, 1}, 24},
	} {
		t.Run(c.node, func(t *testing.T) {
			sysfs, dev := fixtureRoot(c.node)
			inv, err := Discover(ctxT(t), neuronOpts(sysfs, dev))
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			if inv.Flavor != c.flavor || !reflect.DeepEqual(inv.Flavors, []string{c.flavor}) {
				t.Errorf("flavor %q %v, want %q", inv.Flavor, inv.Flavors, c.flavor)
			}
			nds := inv.NeuronDevices()
			if len(nds) != c.devices || len(inv.GPUs()) != 0 {
				t.Fatalf("%d Neuron devices, %d GPUs; want %d, 0", len(nds), len(inv.GPUs()), c.devices)
			}
			for i, d := range nds {
				if d.Index != i || d.Name != c.name || d.Cores != c.cores || d.LogicalCores != c.lcores || !d.Healthy {
					t.Errorf("neuron%d: %+v", i, d)
				}
				if d.DevicePath != "/dev/neuron"+strconv.Itoa(i) || d.Minor != i || d.UUID == "" {
					t.Errorf("neuron%d: path %q minor %d serial %q", i, d.DevicePath, d.Minor, d.UUID)
				}
			}
			if !reflect.DeepEqual(nds[0].ConnectedDevices, c.conn0) {
				t.Errorf("neuron0 connected %v, want %v", nds[0].ConnectedDevices, c.conn0)
			}
			if inv.NeuronCores() != c.procs {
				t.Errorf("NeuronCores = %d, want %d", inv.NeuronCores(), c.procs)
			}
			if !hasReason(inv, "libnvidia-ml.so.1 not found") {
				t.Errorf("reasons %q lack the missing NVML", inv.Reasons)
			}
			n, kind, err := LocalProcsWith(ctxT(t), "auto", neuronOpts(sysfs, dev))
			if err != nil || n != c.procs || kind != ProcNeuron {
				t.Errorf("LocalProcs(auto) = %d %q %v, want %d neuron", n, kind, err, c.procs)
			}
			if _, _, err := LocalProcsWith(ctxT(t), "gpu", neuronOpts(sysfs, dev)); err == nil || !strings.Contains(err.Error(), "no NVIDIA GPU") {
				t.Errorf("LocalProcs(gpu) err = %v, want no NVIDIA GPU", err)
			}
		})
	}

	t.Run("NEURON_LOGICAL_NC_CONFIG=1 on trn2", func(t *testing.T) {
		opts := neuronOpts(fixtureRoot("trn2"))
		opts.Getenv = func(k string) string {
			if k == "NEURON_LOGICAL_NC_CONFIG" {
				return "1"
			}
			return ""
		}
		inv, err := Discover(ctxT(t), opts)
		if err != nil || inv.NeuronCores() != 128 {
			t.Fatalf("cores %d err %v, want 128 physical", inv.NeuronCores(), err)
		}
	})
	t.Run("NEURON_RT_VISIBLE_CORES", func(t *testing.T) {
		opts := neuronOpts(fixtureRoot("trn1"))
		opts.Getenv = func(k string) string {
			if k == "NEURON_RT_VISIBLE_CORES" {
				return "0-7,30-40"
			}
			return ""
		}
		n, kind, err := LocalProcsWith(ctxT(t), "auto", opts)
		if err != nil || n != 10 || kind != ProcNeuron {
			t.Fatalf("LocalProcs = %d %q %v, want 10 (8 + cores 30,31)", n, kind, err)
		}
	})
}

// A node with neither NVIDIA nor Neuron hardware is a cpu node with reasons,
// not an error; torchrun's gpu mode fails there and auto/cpu use the CPUs.
func TestDiscoverNeitherGPUNorNeuron(t *testing.T) {
	opts := neuronOpts(filepath.Join(t.TempDir(), "no-such-dir"), t.TempDir())
	inv, err := Discover(ctxT(t), opts)
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if inv.Flavor != FlavorCPU || len(inv.Accelerators) != 0 || inv.VCPUs != 96 {
		t.Errorf("inventory %+v", inv)
	}
	if !hasReason(inv, "libnvidia-ml.so.1 not found") || !hasReason(inv, "no Neuron driver") {
		t.Errorf("reasons %q", inv.Reasons)
	}
	if _, _, err := LocalProcsWith(ctxT(t), "gpu", opts); err == nil || !strings.Contains(err.Error(), "libnvidia-ml.so.1 not found") {
		t.Errorf("gpu mode err = %v", err)
	}
	if n, kind, err := LocalProcsWith(ctxT(t), "cpu", opts); err != nil || n != 96 || kind != ProcCPU {
		t.Errorf("LocalProcs(cpu) = %d %q %v, want 96 cpu", n, kind, err)
	}
	// auto with neither GPUs nor Neuron: one worker (issue 5).
	if n, kind, err := LocalProcsWith(ctxT(t), "auto", opts); err != nil || n != 1 || kind != ProcCPU {
		t.Errorf("LocalProcs(auto) = %d %q %v, want 1 cpu", n, kind, err)
	}
	if n, kind, err := LocalProcsWith(ctxT(t), "4", opts); err != nil || n != 4 || kind != "" {
		t.Errorf("LocalProcs(4) = %d %q %v", n, kind, err)
	}
	for _, bad := range []string{"0", "-2", "tpu", ""} {
		if _, _, err := LocalProcsWith(ctxT(t), bad, opts); err == nil {
			t.Errorf("LocalProcs(%q) accepted", bad)
		}
	}

	// The driver loaded but no devices.
	opts.NeuronSysfsRoot = t.TempDir()
	inv, err = Discover(ctxT(t), opts)
	if err != nil || inv.Flavor != FlavorCPU || !hasReason(inv, "no neuron<N> devices") {
		t.Errorf("empty sysfs root: err %v reasons %q", err, inv.Reasons)
	}
}

// Corrupt and partial sysfs trees give errors naming the file; the rest of
// the node is still inventoried and the damaged device is unhealthy.
func TestDiscoverNeuronCorrupt(t *testing.T) {
	const dev3 = "sys/devices/virtual/neuron_device/neuron3"
	for _, c := range []struct {
		name    string
		corrupt func(t *testing.T, root string)
		errFile string // the error must name this file ("" = no error)
		listed  int    // devices listed
		reason  string // neuron3's health reason must contain this
	}{
		{"missing device_name", func(t *testing.T, root string) {
			rm(t, root, dev3+"/info/architecture/device_name")
		}, dev3 + "/info/architecture/device_name", 15, ""},
		{"binary device_name", func(t *testing.T, root string) {
			write(t, root, dev3+"/info/architecture/device_name", "Trai\x00nium2\n")
		}, dev3 + "/info/architecture/device_name", 15, ""},
		{"missing core_count", func(t *testing.T, root string) {
			rm(t, root, dev3+"/core_count")
		}, dev3 + "/core_count", 16, "core_count: missing"},
		{"garbage core_count", func(t *testing.T, root string) {
			write(t, root, dev3+"/core_count", "eight")
		}, dev3 + "/core_count", 16, `invalid core count "eight"`},
		{"zero core_count", func(t *testing.T, root string) {
			write(t, root, dev3+"/core_count", "0")
		}, dev3 + "/core_count", 16, "invalid core count"},
		{"huge core_count", func(t *testing.T, root string) {
			write(t, root, dev3+"/core_count", "99999999999999999999")
		}, dev3 + "/core_count", 16, "invalid core count"},
		{"garbage connected_devices", func(t *testing.T, root string) {
			write(t, root, dev3+"/connected_devices", "15, two, 7\n")
		}, dev3 + "/connected_devices", 16, `invalid device id "two"`},
		{"garbage ECC counter", func(t *testing.T, root string) {
			write(t, root, dev3+"/stats/hardware/mem_ecc_uncorrected", "-1\n")
		}, dev3 + "/stats/hardware/mem_ecc_uncorrected", 16, "invalid counter"},
		{"oversized attribute", func(t *testing.T, root string) {
			write(t, root, dev3+"/core_count", strings.Repeat("8", 5000))
		}, dev3 + "/core_count", 16, "larger than 4096 bytes"},
		{"core_count is a directory", func(t *testing.T, root string) {
			rm(t, root, dev3+"/core_count")
			if err := os.MkdirAll(filepath.Join(root, dev3, "core_count"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, dev3 + "/core_count", 16, "core_count"},
		{"uncorrected ECC errors", func(t *testing.T, root string) {
			write(t, root, dev3+"/stats/hardware/mem_ecc_uncorrected", "3\n")
			write(t, root, dev3+"/stats/hardware/sram_ecc_uncorrected", "1\n")
		}, "", 16, "3 uncorrected HBM ECC errors; 1 uncorrected SRAM ECC errors"},
		{"ECC counter as total/present directory", func(t *testing.T, root string) {
			rm(t, root, dev3+"/stats/hardware/mem_ecc_uncorrected")
			write(t, root, dev3+"/stats/hardware/mem_ecc_uncorrected/total", "5\n")
			write(t, root, dev3+"/stats/hardware/mem_ecc_uncorrected/present", "0\n")
		}, "", 16, "5 uncorrected HBM ECC errors"},
		{"missing device node", func(t *testing.T, root string) {
			rm(t, root, "dev/neuron3")
		}, "", 16, "device node"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := copyTree(t, filepath.Join("testdata", "neuron", "trn2"))
			c.corrupt(t, root)
			sysfs := filepath.Join(root, "sys/devices/virtual/neuron_device")
			inv, err := Discover(ctxT(t), neuronOpts(sysfs, filepath.Join(root, "dev")))
			if c.errFile == "" && err != nil {
				t.Fatalf("Discover: %v", err)
			}
			if c.errFile != "" {
				if err == nil || !strings.Contains(err.Error(), filepath.Join(root, c.errFile)) {
					t.Fatalf("err = %v, want one naming %s", err, c.errFile)
				}
				if !hasReason(inv, filepath.Join(root, c.errFile)) {
					t.Errorf("inventory reasons %q lack the error", inv.Reasons)
				}
				// A caller that cannot use a partial inventory gets the error too.
				if _, _, err := LocalProcsWith(ctxT(t), "auto", neuronOpts(sysfs, filepath.Join(root, "dev"))); err == nil {
					t.Errorf("LocalProcs(auto) ignored the corrupt tree")
				}
			}
			if inv == nil || len(inv.NeuronDevices()) != c.listed {
				t.Fatalf("listed %d devices, want %d", len(inv.NeuronDevices()), c.listed)
			}
			if inv.Flavor != "trainium2" {
				t.Errorf("flavor %q", inv.Flavor)
			}
			if c.reason == "" {
				if inv.Healthy(KindNeuron) != c.listed {
					t.Errorf("%d healthy of %d", inv.Healthy(KindNeuron), c.listed)
				}
				return
			}
			d := inv.NeuronDevices()[3]
			if d.Healthy || !strings.Contains(d.HealthReason, c.reason) {
				t.Errorf("neuron3 healthy=%v reason %q, want %q", d.Healthy, d.HealthReason, c.reason)
			}
			if inv.Healthy(KindNeuron) != 15 {
				t.Errorf("%d healthy, want 15", inv.Healthy(KindNeuron))
			}
		})
	}

	t.Run("root is a file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "neuron_device")
		write(t, filepath.Dir(f), "neuron_device", "x")
		inv, err := Discover(ctxT(t), neuronOpts(f, t.TempDir()))
		if err == nil || !strings.Contains(err.Error(), f) || inv == nil || inv.Flavor != FlavorCPU {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("invalid LNC", func(t *testing.T) {
		opts := neuronOpts(fixtureRoot("trn2"))
		opts.Getenv = func(k string) string {
			if k == "NEURON_LOGICAL_NC_CONFIG" {
				return "3"
			}
			return ""
		}
		inv, err := Discover(ctxT(t), opts)
		if err != nil || inv.NeuronCores() != 64 || !hasReason(inv, "NEURON_LOGICAL_NC_CONFIG") {
			t.Fatalf("cores %d err %v reasons %q", inv.NeuronCores(), err, inv.Reasons)
		}
	})
}

func rm(t *testing.T, root, rel string) {
	t.Helper()
	if err := os.Remove(filepath.Join(root, rel)); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, root, rel, data string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

package devices

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// The inventory survives the trip through etcd's JSON, and what readers get
// back is validated, with errors naming the key.
func TestInventoryJSON(t *testing.T) {
	srv := newDGXA100(t)
	enableMIG(t, srv.Devices[0].(*dgxa100.Device), []int{nvml.GPU_INSTANCE_PROFILE_7_SLICE}, []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE})
	opts := gpuOpts(t, srv)
	opts.Now = func() time.Time { return time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) }
	inv, err := Discover(ctxT(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	inv.State = StateReady
	data, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{`"node":"gpu-node"`, `"flavor":"nvidia-a100-40gb"`, `"flavors":["nvidia-a100-40gb"]`,
		`"vcpus":96`, `"memoryBytes":`, `"healthy":true`, `"pciBusId":"00000000:00:00.0"`, `"mig":{"enabled":true`,
		`"updatedAt":"2026-03-01T12:00:00Z"`, `"state":"ready"`} {
		if !bytes.Contains(data, []byte(field)) {
			t.Errorf("JSON lacks %s: %s", field, data)
		}
	}
	back, err := ParseInventory("/hyperpodrun/nodes/gpu-node", data)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Equal(inv) || !back.UpdatedAt.Equal(inv.UpdatedAt) {
		t.Errorf("round trip changed the inventory")
	}
	c := inv.Clone()
	c.Accelerators[0].Healthy = false
	if inv.Equal(c) || !inv.Accelerators[0].Healthy {
		t.Errorf("Clone is not deep / Equal missed a health change")
	}
	c = inv.Clone()
	c.UpdatedAt = c.UpdatedAt.Add(time.Hour)
	if !inv.Equal(c) {
		t.Errorf("Equal should ignore UpdatedAt")
	}

	for _, bad := range []struct{ data, want string }{
		{`{"node":`, "malformed JSON"},
		{`[1,2]`, "malformed JSON"},
		{`{"node":"a/b","flavor":"cpu"}`, "invalid node name"},
		{`{"node":"n1"}`, "empty flavor"},
		{`{"node":"n1","flavor":"cpu","state":"zombie"}`, `unknown state "zombie"`},
		{`{"node":"n1","flavor":"cpu","accelerators":[{"kind":"tpu"}]}`, `unknown kind "tpu"`},
		{`{"node":"n1","flavor":"cpu","accelerators":[{"kind":"neuron","index":-1}]}`, "negative index"},
		{`{"node":"n1","flavor":"cpu","vcpus":"many"}`, "malformed JSON"},
	} {
		_, err := ParseInventory("/p/nodes/n1", []byte(bad.data))
		if err == nil || !strings.Contains(err.Error(), "/p/nodes/n1") || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseInventory(%s) = %v, want error naming the key and %q", bad.data, err, bad.want)
		}
	}
}

func TestNodeNames(t *testing.T) {
	for _, ok := range []string{"a", "node-1", "ip-10-0-0-1.ec2.internal", "N_1"} {
		if err := ValidateNodeName(ok); err != nil {
			t.Errorf("ValidateNodeName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a/b", "-a", "a-", "a b", strings.Repeat("a", 254), "..", "a\n"} {
		if err := ValidateNodeName(bad); err == nil {
			t.Errorf("ValidateNodeName(%q) accepted", bad)
		}
	}
	if _, err := Discover(ctxT(t), Options{NodeName: "bad/name", DisableNVML: true, DisableNeuron: true, Host: StaticHost(testHost)}); err == nil {
		t.Error("Discover accepted an invalid node name")
	}
}

// A mixed node (GPUs and Neuron devices) lists both; its main flavor is the
// most numerous.
func TestMixedNodeFlavorsAndTable(t *testing.T) {
	opts := gpuOpts(t, newDGXA100(t))
	opts.NeuronSysfsRoot, opts.DevRoot = fixtureRoot("inf2")
	inv, err := Discover(ctxT(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	if inv.Flavor != "inferentia2" || strings.Join(inv.Flavors, ",") != "inferentia2,nvidia-a100-40gb" {
		t.Errorf("flavors %v", inv.Flavors)
	}
	var b bytes.Buffer
	if err := inv.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"Node gpu-node", "vCPUs 96", "memory 1.1 TiB", "NVIDIA driver 550.54.15",
		"GPU     0      Mock NVIDIA A100-SXM4-40GB", "40 GiB", "NEURON  11     Inferentia2", "10,0", "healthy"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "\n") != 1+1+8+12 {
		t.Errorf("table has %d lines:\n%s", strings.Count(out, "\n"), out)
	}

	var cpu bytes.Buffer
	inv = &Inventory{Node: "n", Flavors: []string{"cpu"}, Reasons: []string{"nvidia: none"}}
	if err := inv.WriteTable(&cpu); err != nil || !strings.Contains(cpu.String(), "No accelerators.") || !strings.Contains(cpu.String(), "note: nvidia: none") {
		t.Errorf("cpu table: %q", cpu.String())
	}
}

// Liveness is optional (older agents and hand-written records lack it),
// and a value this coordinator does not know is refused rather than read
// as "the lease alone".
func TestInventoryLiveness(t *testing.T) {
	for _, tc := range []struct {
		name, liveness string
		ok             bool
	}{
		{"absent: the lease alone", "", true},
		{"alive key", LivenessAliveKey, true},
		{"unknown: refused", "heartbeat", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := json.Marshal(Inventory{Node: "n", Flavor: FlavorCPU, Liveness: tc.liveness})
			inv, err := ParseInventory("/k", b)
			if (err == nil) != tc.ok {
				t.Fatalf("ParseInventory(%s) = %v", b, err)
			}
			if tc.ok && inv.Liveness != tc.liveness {
				t.Errorf("liveness %q, want %q", inv.Liveness, tc.liveness)
			}
			if tc.liveness == "" && strings.Contains(string(b), "liveness") {
				t.Errorf("an absent liveness is written: %s", b)
			}
		})
	}
}

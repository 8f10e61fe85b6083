package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The view keeps of a node's inventory what the engine sees and what
// proves the node alive, not its device list: at 20,000 nodes of 8 GPUs
// the whole records were 46 MB of the coordinator's live heap, which it
// holds resident and marks in every collection.
func TestTheViewKeepsNoNodesDeviceList(t *testing.T) {
	const nodes = 2000
	k := fleet.NewKeys("")
	v := newView(k, slog.New(slog.NewTextHandler(io.Discard, nil)))
	kvs := make([]*mvccpb.KeyValue, nodes)
	for i := range kvs {
		inv := devices.Inventory{Node: fmt.Sprintf("node-%05d", i), Flavor: "nvidia-h100-80gb", Flavors: []string{"nvidia-h100-80gb"},
			State: devices.StateReady, VCPUs: 192, MemoryBytes: 2 << 40, Hostname: fmt.Sprintf("ip-10-0-%d-%d.ec2.internal", i/250, i%250),
			BootID: "9f3c1e0a-5b7d-4c2e-8f61-0d2b4a6c8e10", NVIDIADriver: "550.54.15", Liveness: devices.LivenessAliveKey}
		for g := 0; g < 8; g++ {
			inv.Accelerators = append(inv.Accelerators, devices.Accelerator{Kind: devices.KindNVIDIA, Index: g, Name: "NVIDIA H100 80GB HBM3",
				Flavor: "nvidia-h100-80gb", UUID: fmt.Sprintf("GPU-%08x-1f2e-3d4c-5b6a-79880a1b2c3d", i*8+g), PCIBusID: fmt.Sprintf("00000000:%02x:00.0", g),
				Minor: g, DevicePath: fmt.Sprintf("/dev/nvidia%d", g), MemoryBytes: 80 << 30, Healthy: true})
		}
		b, err := json.Marshal(inv)
		if err != nil {
			t.Fatal(err)
		}
		kvs[i] = &mvccpb.KeyValue{Key: []byte(k.Node(inv.Node)), Value: b, Lease: 1}
	}
	per := keptPer(t, v, &fleet.CoordinatorSnapshot{Rev: 1, Nodes: kvs}, "node", nodes, func() int { return len(v.nodes) })
	// Its name, its engine record, its lease and the maps' entries: about
	// 400 bytes (the whole record: about 3,500).
	if per > 1000 {
		t.Errorf("the view keeps %d bytes a node of 8 GPUs; want at most 1,000 (its device list and host details are not the engine's)", per)
	}
}

// The view keeps of a job's spec the job as the engine sees it, not its
// run section (script, arguments, environment, image, mounts: the nodes'
// business): a coordinator holds every job of the fleet.
func TestTheViewKeepsNoJobsRunSection(t *testing.T) {
	const jobs = 2000
	k := fleet.NewKeys("")
	v := newView(k, slog.New(slog.NewTextHandler(io.Discard, nil)))
	kvs := make([]*mvccpb.KeyValue, jobs)
	for i := range kvs {
		p := 0
		spec := fleet.JobSpec{Job: policy.Job{Name: fmt.Sprintf("job-%05d", i), Team: "a", Priority: &p, PerNode: policy.Resources{Accelerators: 8}, MinNodes: 1, MaxNodes: 4, Elastic: true},
			Run: fleet.RunSpec{Script: "/workspace/train/llama/pretrain.py", Args: []string{"--config", "/workspace/configs/llama-70b.yaml", "--data", "s3://datasets/tokens/v7", "--steps", "250000"},
				Image: "registry.internal:5000/ml/llama-train:2026.11.3", Env: map[string]string{}}}
		for e := 0; e < 24; e++ {
			spec.Run.Env[fmt.Sprintf("NCCL_SETTING_%02d", e)] = fmt.Sprintf("value-%d-of-a-typical-length", e)
		}
		b, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		kvs[i] = &mvccpb.KeyValue{Key: []byte(k.Spec("a", spec.Name)), Value: b, CreateRevision: int64(i + 1)}
	}
	per := keptPer(t, v, &fleet.CoordinatorSnapshot{Rev: jobs + 1, Specs: kvs}, "job", jobs, func() int { return len(v.specs) })
	if per > 1500 {
		t.Errorf("the view keeps %d bytes a job; want at most 1,500 (its run section is not the engine's)", per)
	}
}

// keptPer loads snap into v and returns the live heap the load left
// behind per what (n of them, held() of them in the view once loaded).
func keptPer(t *testing.T, v *view, snap *fleet.CoordinatorSnapshot, what string, n int, held func() int) int64 {
	t.Helper()
	grew := heapGrowth(func() { v.load(context.TODO(), nil, snap, time.Now()) })
	runtime.KeepAlive(snap)
	if got := held(); got != n {
		t.Fatalf("the view holds %d of %d %ss", got, n, what)
	}
	per := grew / int64(n)
	t.Logf("the view keeps %d bytes a %s", per, what)
	return per
}

// heapGrowth is the live heap f leaves behind, in bytes (the package's
// tests do not run in parallel).
func heapGrowth(f func()) int64 {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	f()
	runtime.GC()
	runtime.ReadMemStats(&m1)
	return int64(m1.HeapAlloc) - int64(m0.HeapAlloc)
}

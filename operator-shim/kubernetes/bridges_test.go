package kubernetes

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/kubernetes/apis/v1alpha1"
)

func kubeNode(name string, labels map[string]string, alloc corev1.ResourceList, ready corev1.ConditionStatus, cordoned bool) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{Unschedulable: cordoned},
		Status: corev1.NodeStatus{Allocatable: alloc, Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}}}
}

func TestInventoryFromNode(t *testing.T) {
	gpu := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8"), corev1.ResourceCPU: resource.MustParse("191500m"), corev1.ResourceMemory: resource.MustParse("2000Gi")}
	for _, tc := range []struct {
		name   string
		node   *corev1.Node
		flavor string
		accels int
		state  string
		kind   string
	}{
		{"p5", kubeNode("a", map[string]string{InstanceTypeLabel: "p5.48xlarge"}, gpu, corev1.ConditionTrue, false), "nvidia-h100-80gb", 8, devices.StateReady, devices.KindNVIDIA},
		{"hyperpod ml. prefix", kubeNode("a", map[string]string{InstanceTypeLabel: "ml.p5.48xlarge"}, gpu, corev1.ConditionTrue, false), "nvidia-h100-80gb", 8, devices.StateReady, devices.KindNVIDIA},
		{"trn2", kubeNode("a", map[string]string{InstanceTypeLabel: "trn2.48xlarge"}, corev1.ResourceList{"aws.amazon.com/neuron": resource.MustParse("16")}, corev1.ConditionTrue, false),
			"trainium2", 16, devices.StateReady, devices.KindNeuron},
		{"neuroncore", kubeNode("a", map[string]string{InstanceTypeLabel: "trn1.32xlarge"}, corev1.ResourceList{"aws.amazon.com/neuroncore": resource.MustParse("32")}, corev1.ConditionTrue, false),
			"trainium", 32, devices.StateReady, devices.KindNeuron},
		{"unknown type", kubeNode("a", map[string]string{InstanceTypeLabel: "x9.Big"}, gpu, corev1.ConditionTrue, false), "x9-big", 8, devices.StateReady, devices.KindNVIDIA},
		{"label override", kubeNode("a", map[string]string{InstanceTypeLabel: "p5.48xlarge", FlavorLabel: "h100-reserved"}, gpu, corev1.ConditionTrue, false), "h100-reserved", 8, devices.StateReady, devices.KindNVIDIA},
		{"cordoned", kubeNode("a", nil, gpu, corev1.ConditionTrue, true), "nvidia-com-gpu", 8, devices.StateDraining, devices.KindNVIDIA},
		{"not ready", kubeNode("a", nil, gpu, corev1.ConditionUnknown, false), "nvidia-com-gpu", 8, devices.StateDraining, devices.KindNVIDIA},
		{"cpu node", kubeNode("a", nil, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}, corev1.ConditionTrue, false), "cpu", 0, devices.StateReady, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := InventoryFromNode(tc.node)
			if err != nil {
				t.Fatal(err)
			}
			if inv.Flavor != tc.flavor || len(inv.Accelerators) != tc.accels || inv.State != tc.state {
				t.Fatalf("flavor %q accels %d state %q", inv.Flavor, len(inv.Accelerators), inv.State)
			}
			if tc.accels > 0 && inv.Accelerators[0].Kind != tc.kind {
				t.Errorf("kind %q", inv.Accelerators[0].Kind)
			}
			// The coordinator sees the node as the agent's would be seen.
			n := fleet.EngineNode(inv)
			if n.Draining != (tc.state == devices.StateDraining) || (tc.accels > 0 && n.HealthyAccelerators() != tc.accels) {
				t.Errorf("engine node %+v", n)
			}
		})
	}
	inv, _ := InventoryFromNode(kubeNode("a", map[string]string{InstanceTypeLabel: "p5.48xlarge"}, gpu, corev1.ConditionTrue, false))
	if inv.VCPUs != 191 || inv.MemoryBytes != 2000<<30 {
		t.Errorf("vcpus %d memory %d", inv.VCPUs, inv.MemoryBytes)
	}
	if _, err := InventoryFromNode(kubeNode("bad/name", nil, gpu, corev1.ConditionTrue, false)); err == nil {
		t.Error("a node name that cannot be a key was accepted")
	}
}

func TestTeamFrom(t *testing.T) {
	b := int32(8)
	et := &v1alpha1.ElasticTeam{ObjectMeta: metav1.ObjectMeta{Name: "prod"}, Spec: v1alpha1.ElasticTeamSpec{Cohort: "c", Weight: "2.5", Preemption: "LowerPriority",
		Quotas: []v1alpha1.FlavorQuota{{Flavor: "nvidia-h100-80gb", Nominal: 24, BorrowingLimit: &b}}}}
	tm, err := TeamFrom(et)
	if err != nil {
		t.Fatal(err)
	}
	if tm.Name != "prod" || tm.Weight != 2.5 || tm.Cohort != "c" || tm.Preemption != "LowerPriority" || tm.Quotas[0].Nominal != 24 || *tm.Quotas[0].BorrowingLimit != 8 || tm.Quotas[0].LendingLimit != nil {
		t.Errorf("%+v", tm)
	}
	et.Spec.Quotas = append(et.Spec.Quotas, et.Spec.Quotas[0])
	if _, err := TeamFrom(et); err == nil || !strings.Contains(err.Error(), "listed twice") {
		t.Errorf("duplicate flavor: %v", err)
	}
	et.Spec.Weight = "heavy"
	if _, err := TeamFrom(et); err == nil || !strings.Contains(err.Error(), "spec.weight") {
		t.Errorf("bad weight: %v", err)
	}
}

// mayBridge's rules: the bridge writes where nothing is, over its own
// record, over a record whose writer is gone and over a previous
// controller's bridged record; never over a live agent's record.
func TestMayBridgeRules(t *testing.T) {
	const ours = 7
	for _, tc := range []struct {
		rule string
		cur  nodeRecord
		ok   bool
	}{
		{ruleNoRecord, nodeRecord{}, true},
		{ruleOwn, nodeRecord{exists: true, lease: ours, bridged: true, declares: true, alive: true}, true},
		{ruleOwn, nodeRecord{exists: true, lease: ours, bridged: true}, true},
		{ruleWriterGone, nodeRecord{exists: true, lease: 9, declares: true}, true},
		{ruleWriterGone, nodeRecord{exists: true, lease: 9, bridged: true, declares: true}, true},
		{ruleTakeOver, nodeRecord{exists: true, lease: 9, bridged: true, declares: true, alive: true}, true},
		{ruleTakeOver, nodeRecord{exists: true, lease: 9, bridged: true}, true},
		{ruleAgentWins, nodeRecord{exists: true, lease: 9, declares: true, alive: true}, false},
		{ruleAgentWins, nodeRecord{exists: true, lease: 9}, false},
		{ruleAgentWins, nodeRecord{exists: true, lease: 9, alive: true}, false},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			ok, rule := mayBridge(tc.cur, ours)
			if ok != tc.ok || rule != tc.rule {
				t.Errorf("mayBridge(%+v) = %v %q, want %v %q", tc.cur, ok, rule, tc.ok, tc.rule)
			}
		})
	}
}

// A bridged record is one whose first reason is the bridge's for that
// very node: an agent's record, or the bridge's reason for another node,
// is not.
func TestBridgedRecord(t *testing.T) {
	inv, err := InventoryFromNode(kubeNode("a", nil, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4")}, corev1.ConditionFalse, true))
	if err != nil {
		t.Fatal(err)
	}
	if !bridgedRecord(inv) {
		t.Errorf("the bridge's own inventory %+v is not seen as bridged", inv)
	}
	other := inv
	other.Node = "b"
	agent := devices.Inventory{Node: "a", Reasons: []string{"no NVIDIA driver"}}
	for _, inv := range []devices.Inventory{other, agent, {Node: "a"}} {
		if bridgedRecord(inv) {
			t.Errorf("%+v is seen as bridged", inv)
		}
	}
}

package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/hyperpodrun/hyperpodrun/devices"
)

// Node labels the node bridge reads.
const (
	// InstanceTypeLabel is the well-known instance-type label.
	InstanceTypeLabel = "node.kubernetes.io/instance-type"
	// FlavorLabel overrides the flavor derived from the instance type.
	FlavorLabel = "hyperpodrun.io/flavor"
)

// instanceFlavors names the flavors of known instance types (HyperPod's
// "ml." prefix is dropped first), as the node agent would name them from
// the devices: GPU model and memory, or the Neuron device's name.
var instanceFlavors = map[string]string{
	"p5.48xlarge":      devices.GPUFlavor("NVIDIA H100 80GB HBM3", 0),
	"p5.4xlarge":       devices.GPUFlavor("NVIDIA H100 80GB HBM3", 0),
	"p5e.48xlarge":     devices.GPUFlavor("NVIDIA H200", 141<<30),
	"p5en.48xlarge":    devices.GPUFlavor("NVIDIA H200", 141<<30),
	"p4d.24xlarge":     devices.GPUFlavor("NVIDIA A100-SXM4-40GB", 0),
	"p4de.24xlarge":    devices.GPUFlavor("NVIDIA A100-SXM4-80GB", 0),
	"p6-b200.48xlarge": devices.GPUFlavor("NVIDIA B200", 180<<30),
	"g5.48xlarge":      devices.GPUFlavor("NVIDIA A10G", 24<<30),
	"g6e.48xlarge":     devices.GPUFlavor("NVIDIA L40S", 48<<30),
	"trn1.32xlarge":    devices.NeuronFlavor("Trainium"),
	"trn1n.32xlarge":   devices.NeuronFlavor("Trainium"),
	"trn2.48xlarge":    devices.NeuronFlavor("Trainium2"),
	"inf2.48xlarge":    devices.NeuronFlavor("Inferentia2"),
}

// FlavorOfNode is a Kubernetes node's flavor: its hyperpodrun.io/flavor
// label, else the flavor of its instance type (known types by their
// accelerators, others by the type's name), else the accelerator kind;
// "cpu" without accelerators.
func FlavorOfNode(n *corev1.Node, accelerators int, kind corev1.ResourceName) string {
	if f := n.Labels[FlavorLabel]; f != "" {
		return f
	}
	if accelerators == 0 {
		return devices.FlavorCPU
	}
	it := strings.TrimPrefix(n.Labels[InstanceTypeLabel], "ml.")
	if f, ok := instanceFlavors[it]; ok {
		return f
	}
	if it != "" {
		return strings.ToLower(strings.NewReplacer(".", "-", "_", "-").Replace(it))
	}
	return strings.NewReplacer(".", "-", "/", "-").Replace(string(kind))
}

// InventoryFromNode is a Kubernetes Node as a fleet inventory: its
// allocatable accelerators (the first of AcceleratorResources it has), cpu
// and memory, its flavor (FlavorOfNode), and draining when it is cordoned
// or not Ready.
func InventoryFromNode(n *corev1.Node) (devices.Inventory, error) {
	inv := devices.Inventory{Node: n.Name, Hostname: n.Name, State: devices.StateReady}
	if err := devices.ValidateNodeName(n.Name); err != nil {
		return inv, err
	}
	count, kind := 0, corev1.ResourceName("")
	for _, r := range AcceleratorResources {
		if q, ok := n.Status.Allocatable[r]; ok && q.Value() > 0 {
			count, kind = int(q.Value()), r
			break
		}
	}
	inv.Flavor = FlavorOfNode(n, count, kind)
	inv.Flavors = []string{inv.Flavor}
	for i := range count {
		a := devices.Accelerator{Kind: devices.KindNVIDIA, Index: i, Name: string(kind), Flavor: inv.Flavor, Minor: -1, Healthy: true}
		if kind != AcceleratorResources[0] {
			a.Kind = devices.KindNeuron
		}
		inv.Accelerators = append(inv.Accelerators, a)
	}
	if q, ok := n.Status.Allocatable[corev1.ResourceCPU]; ok {
		inv.VCPUs = int(q.MilliValue() / 1000) // whole vCPUs only
	}
	if q, ok := n.Status.Allocatable[corev1.ResourceMemory]; ok && q.Value() > 0 {
		inv.MemoryBytes = uint64(q.Value())
	}
	inv.Reasons = []string{"from Kubernetes Node " + n.Name + " (no hyperpod-agent on it)"}
	if n.Spec.Unschedulable {
		inv.State = devices.StateDraining
		inv.Reasons = append(inv.Reasons, "cordoned")
	}
	if !nodeReady(n) {
		inv.State = devices.StateDraining
		inv.Reasons = append(inv.Reasons, "not Ready")
	}
	return inv, inv.Validate()
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// bridgeNodes keeps an inventory under the controller's own lease for
// every Kubernetes Node whose inventory no hyperpod-agent writes. An
// agent's record (under its lease) always wins; when it goes, the Node's
// record takes its place at the next pass.
func (c *Controller) bridgeNodes(ctx context.Context) {
	inf := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(c.kube.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll, fields.Everything()),
		&corev1.Node{}, 0, cache.Indexers{})
	kick := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, n any) { poke(n) }, DeleteFunc: poke})
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return
	}
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(c.cfg.Etcd, concurrency.WithTTL(15), concurrency.WithContext(ctx))
		if err != nil {
			c.log.Warn("node bridge: no etcd lease; retrying", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		tick := time.NewTicker(c.cfg.Resync)
		written := map[string]string{}
		poke(nil)
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case <-sess.Done():
				c.log.Warn("node bridge: lease lost; registering the nodes again")
				break loop
			case <-tick.C:
				written = map[string]string{} // re-check against etcd: an agent may have come or gone
				poke(nil)
			case <-kick:
				c.syncNodes(ctx, inf, sess.Lease(), written)
			}
		}
		tick.Stop()
		sess.Close()
	}
}

// syncNodes writes the inventory of every Node that changed since it was
// written, and removes those of Nodes that are gone.
func (c *Controller) syncNodes(ctx context.Context, inf cache.SharedIndexInformer, lease clientv3.LeaseID, written map[string]string) {
	seen := map[string]bool{}
	for _, o := range inf.GetStore().List() {
		n := o.(*corev1.Node)
		seen[n.Name] = true
		inv, err := InventoryFromNode(n)
		if err != nil {
			c.log.Warn("node bridge: skipping a node", "node", n.Name, "err", err)
			continue
		}
		b, _ := json.Marshal(inv)
		if written[n.Name] == string(b) {
			continue
		}
		inv.UpdatedAt = c.cfg.Now().UTC()
		ok, err := c.putNode(ctx, inv, lease)
		if err != nil {
			c.log.Warn("node bridge: cannot write a node's inventory", "node", n.Name, "err", err)
			continue
		}
		if ok {
			written[n.Name] = string(b)
		}
	}
	ctx2, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Not keys-only: etcd 3.7 answers a keys-only range from its index,
	// without the keys' leases.
	r, err := c.cfg.Etcd.Get(ctx2, c.store.Keys.NodesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return
	}
	for _, kv := range r.Kvs {
		name := strings.TrimPrefix(string(kv.Key), c.store.Keys.NodesPrefix())
		if kv.Lease == int64(lease) && !seen[name] {
			c.cfg.Etcd.Txn(ctx2).If(clientv3.Compare(clientv3.LeaseValue(string(kv.Key)), "=", lease)).Then(clientv3.OpDelete(string(kv.Key))).Commit()
			delete(written, name)
			c.log.Info("node bridge: Node gone; its inventory removed", "node", name)
		}
	}
}

// putNode writes inv under lease unless an agent's record (another
// lease) is there; ok says it wrote.
func (c *Controller) putNode(ctx context.Context, inv devices.Inventory, lease clientv3.LeaseID) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	op, err := c.store.PutNodeOp(inv, clientv3.WithLease(lease))
	if err != nil {
		return false, err
	}
	key := c.store.Keys.Node(inv.Node)
	r, err := c.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(op).
		Else(clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(key), "=", lease)}, []clientv3.Op{op}, nil)).Commit()
	if err != nil {
		return false, fmt.Errorf("write %s: %w", key, err)
	}
	if r.Succeeded {
		return true, nil
	}
	return r.Responses[0].GetResponseTxn().Succeeded, nil
}

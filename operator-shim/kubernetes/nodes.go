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

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/secretlease"
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
	"p5.48xlarge":      api.GPUFlavor("NVIDIA H100 80GB HBM3", 0),
	"p5.4xlarge":       api.GPUFlavor("NVIDIA H100 80GB HBM3", 0),
	"p5e.48xlarge":     api.GPUFlavor("NVIDIA H200", 141<<30),
	"p5en.48xlarge":    api.GPUFlavor("NVIDIA H200", 141<<30),
	"p4d.24xlarge":     api.GPUFlavor("NVIDIA A100-SXM4-40GB", 0),
	"p4de.24xlarge":    api.GPUFlavor("NVIDIA A100-SXM4-80GB", 0),
	"p6-b200.48xlarge": api.GPUFlavor("NVIDIA B200", 180<<30),
	"g5.48xlarge":      api.GPUFlavor("NVIDIA A10G", 24<<30),
	"g6e.48xlarge":     api.GPUFlavor("NVIDIA L40S", 48<<30),
	"trn1.32xlarge":    api.NeuronFlavor("Trainium"),
	"trn1n.32xlarge":   api.NeuronFlavor("Trainium"),
	"trn2.48xlarge":    api.NeuronFlavor("Trainium2"),
	"inf2.48xlarge":    api.NeuronFlavor("Inferentia2"),
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
		return api.FlavorCPU
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
func InventoryFromNode(n *corev1.Node) (api.Inventory, error) {
	inv := api.Inventory{Node: n.Name, Hostname: n.Name, State: api.StateReady}
	if err := api.ValidateNodeName(n.Name); err != nil {
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
		a := api.Accelerator{Kind: api.KindNVIDIA, Index: i, Name: string(kind), Flavor: inv.Flavor, Minor: -1, Healthy: true}
		if kind != AcceleratorResources[0] {
			a.Kind = api.KindNeuron
		}
		inv.Accelerators = append(inv.Accelerators, a)
	}
	if q, ok := n.Status.Allocatable[corev1.ResourceCPU]; ok {
		inv.VCPUs = int(q.MilliValue() / 1000) // whole vCPUs only
	}
	if q, ok := n.Status.Allocatable[corev1.ResourceMemory]; ok && q.Value() > 0 {
		inv.MemoryBytes = uint64(q.Value())
	}
	inv.Reasons = []string{bridgedReason(n.Name)}
	if n.Spec.Unschedulable {
		inv.State = api.StateDraining
		inv.Reasons = append(inv.Reasons, "cordoned")
	}
	if !nodeReady(n) {
		inv.State = api.StateDraining
		inv.Reasons = append(inv.Reasons, "not Ready")
	}
	return inv, inv.Validate()
}

// bridgedReason is the first reason of every record the node bridge
// writes: it marks the record as a bridged Node's, which any controller's
// bridge may take over (bridgedRecord).
func bridgedReason(node string) string {
	return "from Kubernetes Node " + node + " (no hyperpod-agent on it)"
}

// bridgedRecord reports whether inv was written by a node bridge (this
// controller's or a previous one's) rather than by a node agent. Only the
// record's own writer decides what it says; one that pretends to be
// bridged only lets the controller replace it with its Kubernetes Node.
func bridgedRecord(inv api.Inventory) bool {
	return len(inv.Reasons) > 0 && inv.Reasons[0] == bridgedReason(inv.Node)
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// bridgeTTL is the TTL, in seconds, of the node bridge's two leases: how
// long its records outlive a controller that died or stopped.
const bridgeTTL = 15

// bridgeSession is what one node-bridge session writes under.
type bridgeSession struct {
	// record is the session's lease: the records' own, whose id every
	// reader of nodes/ sees (and so may keep alive).
	record clientv3.LeaseID
	// alive is the lease of the alive keys, with a secret random id
	// (secretlease): only the controller keeps it alive.
	alive clientv3.LeaseID
	// aliveDenied: the controller's etcd role may not write alive/ (roles
	// bootstrapped by an earlier release); records then go without
	// alive keys, as they did before.
	aliveDenied bool
}

// bridgeNodes keeps an inventory for every Kubernetes Node whose
// inventory no hyperpod-agent writes. Like a node agent's, each record
// declares an alive key (api.LivenessAliveKey), and alive/<node> is
// written beside it under a second lease whose id is secret: anyone may
// keep the record's lease alive, since its id comes back with every read,
// but once the controller is gone its alive keys expire within bridgeTTL
// and the coordinator stops counting the nodes. An agent's record (under
// its leases) always wins; when it goes, the Node's record takes its place
// at the next pass. A controller that stops (a lost leader election, a
// shutdown) leaves its records to expire or to be taken over by the next
// leader (mayBridge), so that a leader change moves no node out of the
// fleet.
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
		sess, err := concurrency.NewSession(c.cfg.Etcd, concurrency.WithTTL(bridgeTTL), concurrency.WithContext(ctx))
		if err != nil {
			c.log.Warn("node bridge: no etcd lease; retrying", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		kactx, kacancel := context.WithCancel(ctx)
		bs, aliveKA, err := c.aliveLease(kactx, sess.Lease())
		if err != nil {
			c.log.Warn("node bridge: no lease for the alive keys; retrying", "err", err)
			kacancel()
			sess.Close()
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
			case _, ok := <-aliveKA:
				if !ok {
					c.log.Warn("node bridge: the alive keys' lease lost; registering the nodes again")
					break loop
				}
			case <-tick.C:
				written = map[string]string{} // re-check against etcd: an agent may have come or gone
				poke(nil)
			case <-kick:
				c.syncNodes(ctx, inf, bs, written)
			}
		}
		tick.Stop()
		kacancel()
		if ctx.Err() != nil {
			// Stopping: leave the records to the next leader, which
			// takes them over, or to the leases' expiry.
			sess.Orphan()
			return
		}
		sess.Close()
		c.revokeQuietly(ctx, bs.alive)
	}
}

// aliveLease grants the secret lease of a session's alive keys and keeps
// it alive until ctx ends.
func (c *Controller) aliveLease(ctx context.Context, record clientv3.LeaseID) (*bridgeSession, <-chan *clientv3.LeaseKeepAliveResponse, error) {
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	g, err := secretlease.Grant(gctx, c.cfg.Etcd, bridgeTTL)
	if err != nil {
		return nil, nil, err
	}
	ka, err := c.cfg.Etcd.KeepAlive(ctx, g.ID)
	if err != nil {
		c.revokeQuietly(ctx, g.ID)
		return nil, nil, fmt.Errorf("keep the alive keys' lease alive: %w", err)
	}
	return &bridgeSession{record: record, alive: g.ID}, ka, nil
}

func (c *Controller) revokeQuietly(ctx context.Context, id clientv3.LeaseID) {
	if id == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_, _ = c.cfg.Etcd.Revoke(rctx, id)
}

// syncNodes writes the inventory of every Node that changed since it was
// written, and removes those of Nodes that are gone.
func (c *Controller) syncNodes(ctx context.Context, inf cache.SharedIndexInformer, bs *bridgeSession, written map[string]string) {
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
		ok, err := c.putNode(ctx, inv, bs)
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
		name, ok := c.store.Keys.ParseNodeKey(string(kv.Key))
		if !ok || kv.Lease != int64(bs.record) || seen[name] {
			continue
		}
		alive := c.store.Keys.Alive(name)
		if _, err := c.cfg.Etcd.Txn(ctx2).If(clientv3.Compare(clientv3.LeaseValue(string(kv.Key)), "=", bs.record)).
			Then(clientv3.OpDelete(string(kv.Key)),
				clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(alive), "=", bs.alive)}, []clientv3.Op{clientv3.OpDelete(alive)}, nil)).
			Commit(); err != nil {
			c.log.Warn("node bridge: cannot remove a gone Node's inventory", "node", name, "err", err)
			continue
		}
		delete(written, name)
		c.log.Info("node bridge: Node gone; its inventory removed", "node", name)
	}
}

// nodeRecord is what the node bridge sees of a node's keys before it
// writes the node's record.
type nodeRecord struct {
	exists   bool  // nodes/<node> exists
	lease    int64 // its lease
	bridged  bool  // written by a node bridge (bridgedRecord)
	declares bool  // it declares the alive key (api.LivenessAliveKey)
	alive    bool  // alive/<node> exists
}

// Rules of mayBridge.
const (
	ruleNoRecord   = "no record"
	ruleOwn        = "the bridge's own record"
	ruleWriterGone = "its writer is gone (its alive key expired)"
	ruleTakeOver   = "another controller's bridged record (a leader change): taken over"
	ruleAgentWins  = "a node agent's record: the agent's wins"
)

// mayBridge decides whether the node bridge, writing under the record
// lease ours, may write a node's record over cur, and names the rule. A
// live agent's record is never replaced; a previous controller's is, so
// that a new leader takes the Nodes over at once: a record left under the
// old controller's lease would stay for as long as anyone keeps that lease
// alive (anyone may), without the new controller's alive key.
func mayBridge(cur nodeRecord, ours int64) (bool, string) {
	switch {
	case !cur.exists:
		return true, ruleNoRecord
	case cur.lease == ours:
		return true, ruleOwn
	case cur.declares && !cur.alive:
		return true, ruleWriterGone
	case cur.bridged:
		return true, ruleTakeOver
	default:
		return false, ruleAgentWins
	}
}

// putNode writes inv and its alive key under bs's leases, in one
// transaction, when mayBridge allows it over what is there (and nothing
// changed since it looked); ok says it wrote.
func (c *Controller) putNode(ctx context.Context, inv api.Inventory, bs *bridgeSession) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	key, aliveKey := c.store.Keys.Node(inv.Node), c.store.Keys.Alive(inv.Node)
	r, err := c.cfg.Etcd.Txn(ctx).Then(clientv3.OpGet(key), clientv3.OpGet(aliveKey)).Commit()
	if err != nil {
		return false, fmt.Errorf("read %s: %w", key, err)
	}
	var cur nodeRecord
	var recRev, aliveRev int64
	if kvs := r.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		cur.exists, cur.lease, recRev = true, kvs[0].Lease, kvs[0].ModRevision
		var old api.Inventory
		if json.Unmarshal(kvs[0].Value, &old) == nil {
			cur.bridged, cur.declares = bridgedRecord(old), old.Liveness == api.LivenessAliveKey
		}
	}
	if kvs := r.Responses[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
		cur.alive, aliveRev = true, kvs[0].ModRevision
	}
	ok, rule := mayBridge(cur, int64(bs.record))
	if !ok {
		return false, nil
	}
	if rule == ruleWriterGone || rule == ruleTakeOver {
		c.log.Info("node bridge: taking a node's record over", "node", inv.Node, "rule", rule, "lease", fmt.Sprintf("%x", cur.lease))
	}
	for {
		var ops []clientv3.Op
		inv.Liveness = ""
		if !bs.aliveDenied {
			inv.Liveness = api.LivenessAliveKey
			ops = append(ops, clientv3.OpPut(aliveKey, inv.Node, clientv3.WithLease(bs.alive)))
		}
		op, err := c.store.PutNodeOp(inv, clientv3.WithLease(bs.record))
		if err != nil {
			return false, err
		}
		ops = append(ops, op)
		tr, err := c.cfg.Etcd.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(key), "=", recRev),
			clientv3.Compare(clientv3.ModRevision(aliveKey), "=", aliveRev),
		).Then(ops...).Commit()
		if fleet.IsPermissionDenied(err) && !bs.aliveDenied {
			c.log.Warn("node bridge: this controller's etcd role may not write alive keys; bridging Nodes on the record's lease alone, "+
				"which anyone can keep alive after the controller is gone: run elasticctl auth bootstrap again to update the roles",
				"key", aliveKey, "err", err)
			bs.aliveDenied = true
			continue
		}
		if err != nil {
			return false, fmt.Errorf("write %s: %w", key, err)
		}
		return tr.Succeeded, nil
	}
}

package checkpoint

import (
	"sync"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
)

// parts reconciles per-rank checkpoint updates (HyperPod's
// CheckpointDiscoverySocketClient.update) into commits: a step is committed
// once every expected writer has reported it: num_model_checkpoints local
// ranks of every node for the model, num_data_checkpoints for the data.
type parts struct {
	mu    sync.Mutex
	steps map[int64]*stepParts
	last  int64 // highest step committed through updates; older ones are dropped
}

type stepParts struct {
	model, data map[int]bool // ranks that reported
	path        string       // the model checkpoint's path (else the data's)
}

// add records one update and returns the commit it completes, if any.
func (p *parts) add(r control.Report) (Record, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.steps == nil {
		p.steps = map[int64]*stepParts{}
	}
	if r.Step <= p.last && p.last != 0 {
		return Record{}, false
	}
	sp := p.steps[r.Step]
	if sp == nil {
		sp = &stepParts{model: map[int]bool{}, data: map[int]bool{}}
		p.steps[r.Step] = sp
	}
	if r.CheckpointType == "model" {
		sp.model[r.Rank] = true
		sp.path = r.Path
	} else {
		sp.data[r.Rank] = true
		if sp.path == "" {
			sp.path = r.Path
		}
	}
	nodes := r.Nodes
	if nodes < 1 {
		nodes = 1
	}
	if len(sp.model) < r.NumModel*nodes || len(sp.data) < r.NumData*nodes {
		return Record{}, false
	}
	if r.NumModel == 0 && r.NumData == 0 && len(sp.model)+len(sp.data) == 0 {
		return Record{}, false
	}
	p.last = r.Step
	for s := range p.steps {
		if s <= r.Step {
			delete(p.steps, s)
		}
	}
	return Record{Step: r.Step, Path: sp.path, WorldSize: r.WorldSize, Time: r.Received.UTC()}, true
}

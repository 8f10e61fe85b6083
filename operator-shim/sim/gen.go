package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// TeamLoad is one team's part of a generated trace.
type TeamLoad struct {
	Name string `json:"name" yaml:"name"`
	// Share is the team's fraction of the offered load (normalised over teams).
	Share float64 `json:"share" yaml:"share"`
	// Phase shifts the team's demand cycle (radians) when Burst > 0.
	Phase float64 `json:"phase,omitempty" yaml:"phase,omitempty"`
}

// GenOptions shape a synthetic trace like the Helios GPU cluster traces
// (SenseTime, 2020): median 1 GPU per job, mean ~3.7 (sizes from a
// power-of-two mix), median run time 200 s with a lognormal heavy tail
// capped at MaxDuration (days).
type GenOptions struct {
	Seed uint64
	// Jobs is the number of jobs.
	Jobs int
	// Teams share the load (default one team "default").
	Teams []TeamLoad
	// Capacity (accelerators) and Load (offered GPU-seconds per second per
	// accelerator, e.g. 1.0) set the arrival rate.
	Capacity int
	Load     float64
	// NodeGPUs is the accelerators per node (default 8); larger jobs take
	// whole nodes.
	NodeGPUs int
	// ElasticFraction of whole-node jobs are elastic between half their size
	// and ElasticMaxFactor times it (default 0 and 2).
	ElasticFraction  float64
	ElasticMaxFactor int
	// DurationMedian (s, default 200), DurationSigma (lognormal sigma,
	// default 2.0), MaxDuration (s, default 3 days).
	DurationMedian float64
	DurationSigma  float64
	MaxDuration    float64
	// MaxGPUs caps job size (default 64).
	MaxGPUs int
	// Burst (0-1) modulates each team's arrival rate with period
	// BurstPeriod (s, default 4 h): rate * (1 + Burst*sin(2*pi*t/period + phase)).
	Burst       float64
	BurstPeriod float64
	// Flavor of every job ("" = the team's only flavor).
	Flavor string
}

// heliosSizes is the GPU-count mix: P(1)=.60, 2: .10, 4: .12, 8: .12,
// 16: .04, 32: .015, 64: .005 (median 1, mean 3.68).
var heliosSizes = []struct {
	cum  float64
	gpus int
}{{0.60, 1}, {0.70, 2}, {0.82, 4}, {0.94, 8}, {0.98, 16}, {0.995, 32}, {1, 64}}

func (o *GenOptions) defaults() {
	if o.NodeGPUs <= 0 {
		o.NodeGPUs = 8
	}
	if o.DurationMedian <= 0 {
		o.DurationMedian = 200
	}
	if o.DurationSigma <= 0 {
		o.DurationSigma = 2.0
	}
	if o.MaxDuration <= 0 {
		o.MaxDuration = 3 * 86400
	}
	if o.ElasticMaxFactor <= 0 {
		o.ElasticMaxFactor = 2
	}
	if o.MaxGPUs <= 0 {
		o.MaxGPUs = 64
	}
	if o.BurstPeriod <= 0 {
		o.BurstPeriod = 4 * 3600
	}
	if len(o.Teams) == 0 {
		o.Teams = []TeamLoad{{Name: "default", Share: 1}}
	}
	if o.Capacity <= 0 {
		o.Capacity = 256
	}
	if o.Load <= 0 {
		o.Load = 1
	}
}

// meanWork estimates E[GPUs * duration] of the size and duration laws
// (independent), capped lognormal included, by numeric integration.
func (o *GenOptions) meanWork() float64 {
	meanG := 0.0
	prev := 0.0
	for _, s := range heliosSizes {
		if s.gpus <= o.MaxGPUs {
			meanG += (s.cum - prev) * float64(s.gpus)
		} else {
			meanG += (s.cum - prev) * float64(o.MaxGPUs)
		}
		prev = s.cum
	}
	mu, sig := math.Log(o.DurationMedian), o.DurationSigma
	// E[min(X, M)] for lognormal X.
	m := o.MaxDuration
	z := (math.Log(m) - mu) / sig
	phi := func(x float64) float64 { return 0.5 * math.Erfc(-x/math.Sqrt2) }
	meanD := math.Exp(mu+sig*sig/2)*phi(z-sig) + m*(1-phi(z))
	return meanG * meanD
}

// Generate draws a trace. Same options, same trace.
func Generate(o GenOptions) []TraceJob {
	o.defaults()
	rng := rand.New(rand.NewPCG(o.Seed, 0x9e3779b97f4a7c15))
	total := 0.0
	for _, t := range o.Teams {
		total += math.Max(0, t.Share)
	}
	if total == 0 {
		total = 1
	}
	// Arrival rate for the offered load.
	rate := o.Load * float64(o.Capacity) / o.meanWork()
	type arrival struct {
		t    float64
		team int
	}
	var arr []arrival
	maxRate := rate * (1 + o.Burst)
	t := 0.0
	for len(arr) < o.Jobs {
		t += rng.ExpFloat64() / maxRate
		// Thinning: choose the team by share, accept by its modulated rate.
		u := rng.Float64() * total
		k := 0
		for ; k < len(o.Teams)-1; k++ {
			u -= math.Max(0, o.Teams[k].Share)
			if u < 0 {
				break
			}
		}
		m := 1 + o.Burst*math.Sin(2*math.Pi*t/o.BurstPeriod+o.Teams[k].Phase)
		if rng.Float64()*(1+o.Burst) <= m {
			arr = append(arr, arrival{t, k})
		}
	}
	sort.SliceStable(arr, func(a, b int) bool { return arr[a].t < arr[b].t })
	out := make([]TraceJob, 0, o.Jobs)
	for i, a := range arr {
		g := 1
		x := rng.Float64()
		for _, s := range heliosSizes {
			if x < s.cum {
				g = s.gpus
				break
			}
		}
		g = min(g, o.MaxGPUs)
		d := math.Min(o.MaxDuration, math.Exp(math.Log(o.DurationMedian)+o.DurationSigma*rng.NormFloat64()))
		d = math.Max(d, 1)
		j := TraceJob{
			Name:   fmt.Sprintf("job-%06d", i),
			Team:   o.Teams[a.team].Name,
			Submit: math.Round(a.t*1000) / 1000,
			Flavor: o.Flavor,
			Work:   math.Round(d*float64(g)*1000) / 1000,
		}
		p := []int{20, 50, 50, 80}[rng.IntN(4)]
		j.Priority = &p
		if g < o.NodeGPUs {
			j.GPUsPerNode, j.Nodes = g, 1
		} else {
			n := g / o.NodeGPUs
			j.GPUsPerNode, j.Nodes = o.NodeGPUs, n
			if rng.Float64() < o.ElasticFraction {
				j.Elastic = true
				j.MinNodes, j.MaxNodes = max(1, n/2), o.ElasticMaxFactor*n
			}
		}
		out = append(out, j)
	}
	return out
}

package main

import (
	"fmt"
	"html"
	"math"
	"os"
	"strings"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/sim"
)

// sweepOptions configure the sweep (-sweep).
type sweepOptions struct {
	jobs    int
	seed    uint64
	loads   []float64
	elastic []float64
	trace   string // the public trace for the headline ("" to skip)
	teams   string
	svg     string // where to write the chart ("" to skip)
	restart float64
	resize  float64
	ckpt    float64
}

// sweep runs the engine against Kueue over offered load x elastic
// fraction on Helios-shaped traces (the same 256-GPU fleet and teams as
// the utilisation bench) and on the public trace, and prints BENCH lines:
// engine mean JCT / Kueue mean JCT (below 1: the engine is faster).
func sweep(o sweepOptions) error {
	teams, fleet := benchTeams()
	ratio := make([][]float64, len(o.elastic))
	var bench []string
	fmt.Printf("# sweep: %d Helios-shaped jobs per point, seed %d, 256 GPUs, teams research 128 (weight 2), product 64, infra 64, one cohort\n", o.jobs, o.seed)
	fmt.Printf("# engine mean JCT / kueue mean JCT (kueue: reclaimWithinCohort Any, BestEffortFIFO, static sizes); restart %.2f s, resize %.2f s, checkpoint every %.0f s\n", o.restart, o.resize, o.ckpt)
	fmt.Printf("%-8s", "elastic")
	for _, l := range o.loads {
		fmt.Printf(" load=%-5.2f", l)
	}
	fmt.Println()
	for ei, e := range o.elastic {
		fmt.Printf("%-8.2f", e)
		for _, l := range o.loads {
			trace := sim.Generate(sim.GenOptions{Seed: o.seed, Jobs: o.jobs, Capacity: 256, Load: l, ElasticFraction: e, ElasticMaxFactor: 2, Burst: 0.9,
				Teams: benchLoads()})
			reps, err := sim.Compare(trace, []sim.Mode{sim.ModeKueue, sim.ModeEngine}, sim.Options{Teams: teams, Fleet: fleet,
				RestartDelay: o.restart, ResizeDelay: o.resize, CheckpointInterval: o.ckpt})
			if err != nil {
				return err
			}
			r := reps[1].MeanJCT / reps[0].MeanJCT
			ratio[ei] = append(ratio[ei], r)
			fmt.Printf(" %-10.3f", r)
			bench = append(bench, fmt.Sprintf("BENCH fairshare_sweep_jct_ratio_load%.1f_elastic%.0f %.3f (kueue meanJCT %.0f s, wait %.0f s; engine %.0f s, wait %.0f s)",
				l, 100*e, r, reps[0].MeanJCT, reps[0].MeanWait, reps[1].MeanJCT, reps[1].MeanWait))
		}
		fmt.Println()
	}
	for _, b := range bench {
		fmt.Println(b)
	}
	if o.svg != "" {
		if err := os.WriteFile(o.svg, []byte(sweepSVG(o.loads, o.elastic, ratio)), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", o.svg, err)
		}
	}
	if o.trace == "" {
		return nil
	}
	trace, err := sim.LoadTrace(o.trace)
	if err != nil {
		return err
	}
	tf, err := sim.LoadTeams(o.teams)
	if err != nil {
		return err
	}
	opts := sim.Options{Teams: tf.Teams, RestartDelay: o.restart, ResizeDelay: o.resize, CheckpointInterval: o.ckpt}
	if len(tf.Fleet) > 0 {
		opts.Fleet = sim.BuildFleet(tf.Fleet)
	}
	reps, err := sim.Compare(trace, []sim.Mode{sim.ModeFIFO, sim.ModeKueue, sim.ModeBatch, sim.ModeEngine, sim.ModeOracle}, opts)
	if err != nil {
		return err
	}
	fmt.Printf("# public trace %s (%d jobs):\n", o.trace, len(trace))
	for _, r := range reps {
		fmt.Printf("#   %-16s completed %d/%d meanJCT %.0f s p95 %.0f s wait %.0f s busy util %.1f%% fairness %.3f\n",
			r.Policy, r.Completed, r.Jobs, r.MeanJCT, r.JCTP95, r.MeanWait, r.BusyUtilization, r.Fairness)
	}
	fmt.Printf("BENCH fairshare_trace_jct_ratio_engine_kueue %.3f target=0.7\n", reps[3].MeanJCT/reps[1].MeanJCT)
	fmt.Printf("BENCH fairshare_trace_jct_ratio_engine_oracle %.3f\n", reps[3].MeanJCT/reps[4].MeanJCT)
	return nil
}

// sweepSVG draws one line per elastic fraction: the ratio over load, with
// the 1.0 (parity) and 0.7 (target) lines.
func sweepSVG(loads, elastic []float64, ratio [][]float64) string {
	const w, h, left, right, top, bottom = 900.0, 420.0, 60.0, 170.0, 40.0, 50.0
	ymax := 1.2
	for _, rs := range ratio {
		for _, r := range rs {
			ymax = math.Max(ymax, r*1.05)
		}
	}
	x0, x1 := loads[0], loads[len(loads)-1]
	if x1 == x0 {
		x1 = x0 + 1
	}
	px := func(x float64) float64 { return left + (x-x0)/(x1-x0)*(w-left-right) }
	py := func(y float64) float64 { return h - bottom - y/ymax*(h-top-bottom) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %.0f %.0f" font-family="sans-serif">`, w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%.0f" y="22" font-size="15" font-weight="bold">Engine mean JCT / Kueue mean JCT (below 1: elasticity pays)</text>`, left)
	fmt.Fprintf(&b, `<path d="M%.1f %.1f V%.1f H%.1f" stroke="#444" fill="none"/>`, left, top, h-bottom, w-right)
	for _, l := range loads {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="11" text-anchor="middle">%.1f</text>`, px(l), h-bottom+16, l)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="12" text-anchor="middle">offered load</text>`, (left+w-right)/2, h-12)
	for i := 0; i <= 4; i++ {
		y := ymax * float64(i) / 4
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" font-size="11" text-anchor="end">%.2f</text><path d="M%.1f %.1f H%.1f" stroke="#eee"/>`, left-6, py(y)+4, y, left, py(y), w-right)
	}
	for _, ref := range []struct {
		y    float64
		name string
	}{{1, "parity"}, {0.7, "target 0.7"}} {
		fmt.Fprintf(&b, `<path d="M%.1f %.1f H%.1f" stroke="#000" stroke-dasharray="5 4"/><text x="%.1f" y="%.1f" font-size="11">%s</text>`, left, py(ref.y), w-right, w-right+4, py(ref.y)+4, ref.name)
	}
	colours := []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}
	for ei, e := range elastic {
		c := colours[ei%len(colours)]
		var d strings.Builder
		for li, r := range ratio[ei] {
			cmd := "L"
			if li == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&d, "%s%.1f %.1f", cmd, px(loads[li]), py(r))
		}
		fmt.Fprintf(&b, `<path class="series" d="%s" stroke="%s" stroke-width="2" fill="none"/>`, d.String(), c)
		fmt.Fprintf(&b, `<path d="M%.0f %.0f h18" stroke="%s" stroke-width="3"/><text x="%.0f" y="%.0f" font-size="12">%s</text>`,
			w-right+12, top+90+float64(ei)*18, c, w-right+36, top+94+float64(ei)*18, html.EscapeString(fmt.Sprintf("%.0f%% elastic", 100*e)))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

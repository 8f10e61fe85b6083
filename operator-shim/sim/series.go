package sim

import (
	"fmt"
	"html"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// Series is a simulation's time series, one sample per engine cycle.
type Series struct {
	// T is the sample time (s from the first submission, the clock of the
	// report's Makespan): the last sample is the end of the run, so a
	// series covers the whole run up to the makespan.
	T []float64 `json:"t"`
	// Used is the fleet's allocated accelerators; Utilization the same in
	// percent of Capacity.
	Used        []int     `json:"used"`
	Utilization []float64 `json:"utilization"`
	// Queue is the number of pending jobs.
	Queue []int `json:"queue"`
	// Teams is each team's allocated accelerators against its nominal quota.
	Teams []TeamSeries `json:"teams"`
	// Reclaims are the times (as T) of decisions that took capacity back for a
	// team's nominal quota (shrinks or preemptions with code Reclaim), with
	// how many jobs each one touched.
	Reclaims []ReclaimMark `json:"reclaims"`
}

// TeamSeries is one team's usage over time.
type TeamSeries struct {
	Team    string `json:"team"`
	Nominal int    `json:"nominal"`
	Used    []int  `json:"used"`
}

// ReclaimMark is one cycle's reclaims.
type ReclaimMark struct {
	T    float64 `json:"t"`
	Jobs int     `json:"jobs"`
}

// maxSamples bounds a series: beyond it, samples are thinned (every
// reclaim is kept).
const maxSamples = 2000

// RunSeries is Run that also records the time series (the report's
// Series field).
func RunSeries(trace []TraceJob, o Options) (*Report, error) {
	s := &Series{}
	idx := map[string]int{}
	for i, t := range o.Teams {
		nominal := 0
		for _, q := range t.Quotas {
			nominal += q.Nominal
		}
		idx[t.Name] = i
		s.Teams = append(s.Teams, TeamSeries{Team: t.Name, Nominal: nominal})
	}
	// Samples are taken from the first submission (Run starts its clock
	// there), the origin of the report's Makespan.
	first := math.Inf(1)
	for _, j := range trace {
		first = math.Min(first, j.Submit)
	}
	prev := o.OnCycle
	o.OnCycle = func(t float64, d *policy.Decision) {
		if prev != nil {
			prev(t, d)
		}
		t -= first
		used := 0
		per := make([]int, len(s.Teams))
		for _, a := range d.Allocations {
			n := a.Size * a.AcceleratorsPerNode
			used += n
			if i, ok := idx[a.Team]; ok {
				per[i] += n
			}
		}
		queue, reclaims := 0, 0
		for _, r := range d.Reasons {
			switch {
			case r.Kind == policy.KindPending:
				queue++
			case (r.Kind == policy.KindShrunk || r.Kind == policy.KindPreempted) && r.Code == policy.CodeReclaim:
				reclaims++
			}
		}
		if reclaims > 0 {
			s.Reclaims = append(s.Reclaims, ReclaimMark{T: t, Jobs: reclaims})
		}
		if n := len(s.T); n > 0 && s.T[n-1] == t { // the same instant: keep the last
			s.T, s.Used, s.Queue = s.T[:n-1], s.Used[:n-1], s.Queue[:n-1]
			for i := range s.Teams {
				s.Teams[i].Used = s.Teams[i].Used[:n-1]
			}
		}
		s.T = append(s.T, t)
		s.Used = append(s.Used, used)
		s.Queue = append(s.Queue, queue)
		for i := range s.Teams {
			s.Teams[i].Used = append(s.Teams[i].Used, per[i])
		}
	}
	rep, err := Run(trace, o)
	if err != nil {
		return nil, err
	}
	s.thin(maxSamples)
	s.Utilization = make([]float64, len(s.Used))
	for i, u := range s.Used {
		s.Utilization[i] = math.Round(1000*float64(u)/float64(max(1, rep.Capacity))) / 10
	}
	rep.Series = s
	return rep, nil
}

// thin keeps at most n samples, evenly spaced by index, always the first
// and the last (the end of the run: a run's tail often has few cycles far
// apart, so dropping its last samples would cut hours off the charts).
func (s *Series) thin(n int) {
	if len(s.T) <= n || n < 2 {
		return
	}
	last := len(s.T) - 1
	keep := make([]int, n)
	for i := range keep {
		keep[i] = int(float64(i) * float64(last) / float64(n-1))
	}
	keep[n-1] = last
	pickF := func(v []float64) []float64 {
		out := make([]float64, len(keep))
		for i, k := range keep {
			out[i] = v[k]
		}
		return out
	}
	pickI := func(v []int) []int {
		out := make([]int, len(keep))
		for i, k := range keep {
			out[i] = v[k]
		}
		return out
	}
	s.T, s.Used, s.Queue = pickF(s.T), pickI(s.Used), pickI(s.Queue)
	for i := range s.Teams {
		s.Teams[i].Used = pickI(s.Teams[i].Used)
	}
}

// palette colours the lines of a chart.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// line is one polyline of a chart.
type line struct {
	name   string
	colour string
	dash   bool
	x      []float64
	y      []float64
}

// chart renders lines as an inline SVG with axes, a legend and optional
// vertical marks (reclaims).
func chart(title, yLabel string, lines []line, marks []float64) string {
	const w, h, left, right, top, bottom = 1000.0, 260.0, 60.0, 170.0, 30.0, 40.0
	xmax, ymax := 1.0, 1.0
	for _, l := range lines {
		for i := range l.x {
			xmax = math.Max(xmax, l.x[i])
			ymax = math.Max(ymax, l.y[i])
		}
	}
	ymax *= 1.05
	px := func(x float64) float64 { return left + x/xmax*(w-left-right) }
	py := func(y float64) float64 { return h - bottom - y/ymax*(h-top-bottom) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" width="100%%" role="img" aria-label="%s">`, w, h, html.EscapeString(title))
	fmt.Fprintf(&b, `<text x="%.0f" y="18" class="title">%s</text>`, left, html.EscapeString(title))
	fmt.Fprintf(&b, `<path class="axis" d="M%.1f %.1f V%.1f H%.1f" stroke="#444" fill="none"/>`, left, top, h-bottom, w-right)
	for i := 0; i <= 4; i++ {
		y := ymax * float64(i) / 4
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" class="tick" text-anchor="end">%.0f</text>`, left-6, py(y)+4, y)
		fmt.Fprintf(&b, `<path d="M%.1f %.1f H%.1f" stroke="#ddd" fill="none"/>`, left, py(y), w-right)
		x := xmax * float64(i) / 4
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" class="tick" text-anchor="middle">%s</text>`, px(x), h-bottom+16, dur(x))
	}
	fmt.Fprintf(&b, `<text x="14" y="%.0f" class="tick" transform="rotate(-90 14 %.0f)" text-anchor="middle">%s</text>`, h/2, h/2, html.EscapeString(yLabel))
	for _, m := range marks {
		fmt.Fprintf(&b, `<path class="reclaim" d="M%.1f %.1f V%.1f" stroke="#d62728" stroke-opacity="0.35" fill="none"/>`, px(m), top, h-bottom)
	}
	for i, l := range lines {
		if len(l.x) == 0 {
			continue
		}
		var d strings.Builder
		for k := range l.x {
			cmd := "L"
			if k == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&d, "%s%.1f %.1f", cmd, px(l.x[k]), py(l.y[k]))
		}
		dash := ""
		if l.dash {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&b, `<path class="series" d="%s" stroke="%s" stroke-width="1.6" fill="none"%s/>`, d.String(), l.colour, dash)
		fmt.Fprintf(&b, `<path d="M%.0f %.0f h18" stroke="%s" stroke-width="3"%s/><text x="%.0f" y="%.0f" class="legend">%s</text>`,
			w-right+12, top+12+float64(i)*18, l.colour, dash, w-right+36, top+16+float64(i)*18, html.EscapeString(l.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// steps turns samples into a step line (values hold until the next sample).
func steps(t []float64, v []float64) ([]float64, []float64) {
	var x, y []float64
	for i := range t {
		if i > 0 {
			x, y = append(x, t[i]), append(y, v[i-1])
		}
		x, y = append(x, t[i]), append(y, v[i])
	}
	return x, y
}

func floats(v []int) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// WriteHTML writes one self-contained HTML page (inline SVG and CSS, no
// script, nothing fetched) with the reports' summaries and time-series
// charts: per-team usage against nominal quota, fleet utilisation, queue
// length and reclaim events. Several reports (a --compare run) share the
// fleet charts, one line per policy.
func WriteHTML(w io.Writer, title string, reps []*Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>%s</title>\n", html.EscapeString(title))
	b.WriteString(`<style>body{font-family:sans-serif;margin:24px;color:#222}h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
.chart{max-width:1000px;display:block}.title{font-size:14px;font-weight:bold}.tick{font-size:11px;fill:#555}.legend{font-size:12px}</style></head><body>
`)
	fmt.Fprintf(&b, "<h1>%s</h1>\n", html.EscapeString(title))
	b.WriteString("<table><tr><th>policy</th><th>jobs</th><th>completed</th><th>accelerators</th><th>utilization %</th><th>allocated %</th><th>wait p50</th><th>wait p95</th><th>reclaim p95</th><th>preemptions</th><th>shrinks</th><th>grows</th></tr>\n")
	for _, r := range reps {
		fmt.Fprintf(&b, "<tr><td>%s</td><td>%d</td><td>%d</td><td>%d</td><td>%.1f</td><td>%.1f</td><td>%s</td><td>%s</td><td>%s</td><td>%d</td><td>%d</td><td>%d</td></tr>\n",
			html.EscapeString(r.Mode), r.Jobs, r.Completed, r.Capacity, r.Utilization, r.Allocated, dur(r.WaitP50), dur(r.WaitP95), dur(r.ReclaimP95), r.Preemptions, r.Shrinks, r.Grows)
	}
	b.WriteString("</table>\n")
	if len(reps) > 1 {
		b.WriteString(compareHTML(reps))
	}
	var util, queue []line
	for i, r := range reps {
		if r.Series == nil {
			continue
		}
		c := palette[i%len(palette)]
		x, y := steps(r.Series.T, r.Series.Utilization)
		util = append(util, line{name: r.Mode, colour: c, x: x, y: y})
		x, y = steps(r.Series.T, floats(r.Series.Queue))
		queue = append(queue, line{name: r.Mode, colour: c, x: x, y: y})
	}
	b.WriteString("<h2>Fleet utilisation</h2>\n")
	b.WriteString(chart("Allocated accelerators, % of the fleet", "%", util, nil))
	b.WriteString("<h2>Queue length</h2>\n")
	b.WriteString(chart("Pending jobs", "jobs", queue, nil))
	for _, r := range reps {
		s := r.Series
		if s == nil {
			continue
		}
		var lines []line
		for i, ts := range s.Teams {
			c := palette[i%len(palette)]
			x, y := steps(s.T, floats(ts.Used))
			lines = append(lines, line{name: ts.Team + " used", colour: c, x: x, y: y})
			if len(s.T) > 0 {
				lines = append(lines, line{name: ts.Team + " nominal", colour: c, dash: true,
					x: []float64{s.T[0], s.T[len(s.T)-1]}, y: []float64{float64(ts.Nominal), float64(ts.Nominal)}})
			}
		}
		var marks []float64
		for _, m := range s.Reclaims {
			marks = append(marks, m.T)
		}
		fmt.Fprintf(&b, "<h2>Per-team usage against nominal quota (%s); red marks: %d reclaim decisions</h2>\n", html.EscapeString(r.Mode), len(s.Reclaims))
		b.WriteString(chart("Accelerators used per team ("+r.Mode+")", "accelerators", lines, marks))
	}
	b.WriteString("<p>Generated by elasticctl simulate. Times are virtual seconds from the first submission.</p>\n</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// compareHTML is the side-by-side part of a comparison: what each policy
// is, its figures, the CDF of job completion times and each team's usage
// against its quota, one line per policy.
func compareHTML(reps []*Report) string {
	var b strings.Builder
	b.WriteString("<h2>Policies side by side</h2>\n<table><tr><th>policy</th><th>what it is</th><th>completed</th><th>rejected</th><th>mean JCT</th><th>p50 JCT</th><th>p95 JCT</th><th>p99 JCT</th><th>mean queueing delay</th><th>makespan</th><th>busy util. % (productive)</th><th>busy allocated %</th><th>fairness (Jain)</th><th>reclaim p95</th><th>reclaim max</th><th>resizes</th><th>preemptions</th><th>GPU-hours lost to restarts</th></tr>\n")
	for _, r := range reps {
		fmt.Fprintf(&b, "<tr><td>%s</td><td style=\"text-align:left\">%s</td><td>%d</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%.1f</td><td>%.1f</td><td>%.3f</td><td>%s</td><td>%s</td><td>%d</td><td>%d</td><td>%.1f</td></tr>\n",
			html.EscapeString(r.Policy), html.EscapeString(r.Description), r.Completed, r.Rejected, dur(r.MeanJCT), dur(r.JCTP50), dur(r.JCTP95), dur(r.JCTP99),
			dur(r.MeanWait), dur(r.Makespan), r.BusyUtilization, r.BusyAllocated, r.Fairness, dur(r.ReclaimP95), dur(r.ReclaimMax), r.Resizes, r.Preemptions, r.GPUHoursLost)
	}
	b.WriteString("</table>\n<p>The oracle row is a bound (each figure separately), not a schedule: see sim.Bound.</p>\n")
	var cdf []line
	for i, r := range reps {
		x := append([]float64(nil), r.JCTs...)
		sort.Float64s(x)
		var px, py []float64
		stride := max(1, len(x)/500)
		for k := 0; k < len(x); k += stride {
			px, py = append(px, x[k]), append(py, 100*float64(k+1)/float64(len(x)))
		}
		if n := len(x); n > 0 {
			px, py = append(px, x[n-1]), append(py, 100)
		}
		cdf = append(cdf, line{name: r.Policy, colour: palette[i%len(palette)], dash: r.Policy == string(ModeOracle), x: px, y: py})
	}
	b.WriteString("<h2>Job completion time (CDF)</h2>\n")
	b.WriteString(chart("Jobs completed within the time, %", "% of jobs", cdf, nil))
	var teams []TeamSeries
	for _, r := range reps {
		if r.Series != nil {
			teams = r.Series.Teams
			break
		}
	}
	for ti, ts := range teams {
		var lines []line
		end := 0.0
		for i, r := range reps {
			if r.Series == nil || ti >= len(r.Series.Teams) {
				continue
			}
			x, y := steps(r.Series.T, floats(r.Series.Teams[ti].Used))
			lines = append(lines, line{name: r.Policy, colour: palette[i%len(palette)], x: x, y: y})
			if n := len(r.Series.T); n > 0 {
				end = math.Max(end, r.Series.T[n-1])
			}
		}
		lines = append(lines, line{name: "nominal", colour: "#000", dash: true, x: []float64{0, end}, y: []float64{float64(ts.Nominal), float64(ts.Nominal)}})
		fmt.Fprintf(&b, "<h2>Team %s: usage against its quota, per policy</h2>\n", html.EscapeString(ts.Team))
		b.WriteString(chart("Accelerators used by "+ts.Team, "accelerators", lines, nil))
	}
	return b.String()
}

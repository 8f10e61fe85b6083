package tracestore

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Row is one span of a waterfall: how deep it sits under its trace's root
// and where its bar lies, as fractions of the trace's extent (from the
// earliest start to the latest end).
type Row struct {
	Span  Span
	Depth int
	// Offset is when the span starts after the trace's start, and Length
	// its duration, both as fractions of Total (0 when Total is 0).
	Offset, Length float64
}

// Layout is a trace laid out as a waterfall.
type Layout struct {
	TraceID string
	Start   time.Time
	Total   time.Duration
	Rows    []Row
}

// Waterfall lays out t: each span right under its parent, siblings by
// start; a span whose parent is not in the trace is a root of its own.
func Waterfall(t Trace) Layout {
	l := Layout{TraceID: t.TraceID, Start: t.Start()}
	if len(t.Spans) == 0 {
		return l
	}
	end := l.Start
	byID := make(map[string]bool, len(t.Spans))
	for _, s := range t.Spans {
		byID[s.SpanID] = true
		if e := s.Start.Add(s.Duration); e.After(end) {
			end = e
		}
	}
	l.Total = end.Sub(l.Start)
	spans := append([]Span(nil), t.Spans...)
	sortSpans(spans)
	children := make(map[string][]Span)
	var roots []Span
	for _, s := range spans {
		if s.ParentSpanID == "" || s.ParentSpanID == s.SpanID || !byID[s.ParentSpanID] {
			roots = append(roots, s)
			continue
		}
		children[s.ParentSpanID] = append(children[s.ParentSpanID], s)
	}
	seen := make(map[string]bool, len(spans))
	var walk func(s Span, depth int)
	walk = func(s Span, depth int) {
		if seen[s.SpanID] {
			return
		}
		seen[s.SpanID] = true
		l.Rows = append(l.Rows, l.row(s, depth))
		for _, c := range children[s.SpanID] {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	// Spans in a parent cycle (no root above them) are still shown.
	for _, s := range spans {
		walk(s, 0)
	}
	return l
}

func (l Layout) row(s Span, depth int) Row {
	r := Row{Span: s, Depth: depth}
	if l.Total > 0 {
		r.Offset = float64(s.Start.Sub(l.Start)) / float64(l.Total)
		r.Length = float64(s.Duration) / float64(l.Total)
	}
	return r
}

// Highlights are the attributes of a span that answer "why, who and how
// long", briefly, in a fixed order: sizes (2→1), the reason code (or a
// one-word reason), who asked, downtime, node, round, world size, the
// committed checkpoint's step, the step resumed from, the step reached,
// and the signal.
func Highlights(s Span) []string {
	a := s.Attributes
	var out []string
	pair := func(from, to, label string) {
		f, okf := a[from]
		t, okt := a[to]
		switch {
		case okf && okt:
			out = append(out, label+f+"→"+t)
		case okt:
			out = append(out, label+"→"+t)
		case okf:
			out = append(out, label+f+"→")
		}
	}
	one := func(key, label string) {
		if v, ok := a[key]; ok && v != "" {
			out = append(out, label+v)
		}
	}
	pair("from_size", "to_size", "")
	one("code", "")
	if r := a["reason"]; r != "" && len(r) <= 32 && !strings.ContainsAny(r, " \t") && a["code"] == "" {
		// A reason code (the agents'); the coordinator's is a sentence,
		// shown in the header, beside its code.
		out = append(out, r)
	}
	one("requested_by", "by ")
	var down []string
	for k := range a {
		if strings.HasPrefix(k, "downtime") {
			down = append(down, k)
		}
	}
	sort.Strings(down)
	for _, k := range down {
		out = append(out, k+"="+durationText(k, a[k]))
	}
	if n := s.Node(); n != "" {
		out = append(out, "node="+n)
	}
	pair("from_round", "to_round", "round ")
	one("round", "round=")
	if _, ok := a["world_size"]; ok {
		one("world_size", "world=")
	} else {
		one("new_world_size", "world=")
	}
	one("checkpoint_step", "checkpoint=")
	one("resume_step", "resume=")
	one("step", "step=")
	one("signal", "signal=")
	return out
}

// durationText renders a duration attribute: a bare number is seconds
// (milliseconds for a key ending in _ms), anything else is shown as is.
func durationText(key, v string) string {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1e9 {
		return v
	}
	unit := time.Second
	if strings.HasSuffix(key, "_ms") {
		unit = time.Millisecond
	}
	return FormatDuration(time.Duration(f * float64(unit)))
}

// FormatDuration renders d briefly for a waterfall: 850µs, 12.3ms, 4.20s,
// 2m05s.
func FormatDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	case d < time.Minute:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
	d = d.Round(time.Second)
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}

// bar draws a row's bar in width cells: '#' where the span ran, '.'
// elsewhere; a span shorter than a cell still gets one.
func bar(r Row, width int) string {
	if width < 1 {
		width = 1
	}
	from := int(r.Offset * float64(width))
	n := int(math.Round((r.Offset+r.Length)*float64(width))) - from // the end rounded, not the length
	if n < 1 {
		n = 1
	}
	if from >= width {
		from = width - 1
	}
	if from+n > width {
		n = width - from
	}
	return strings.Repeat(".", from) + strings.Repeat("#", n) + strings.Repeat(".", width-from-n)
}

// WriteText writes l as a text waterfall: a header (trace ID, start, total
// duration, the root's reason), then a line per span: its bar scaled to the
// trace, its duration, its service and operation indented under its
// parent, and its highlights.
func WriteText(w io.Writer, l Layout, barWidth int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "trace %s  %s  %s\n", l.TraceID, l.Start.UTC().Format(time.RFC3339), FormatDuration(l.Total))
	if len(l.Rows) > 0 {
		if r := l.Rows[0].Span.Attributes["reason"]; r != "" {
			fmt.Fprintf(&b, "  reason: %s\n", r)
		}
	}
	nameW := 0
	name := func(r Row) string { return strings.Repeat("  ", r.Depth) + r.Span.Service + " " + r.Span.Operation }
	for _, r := range l.Rows {
		nameW = max(nameW, utf8.RuneCountInString(name(r)))
	}
	for _, r := range l.Rows {
		line := fmt.Sprintf("  |%s| %8s  %-*s  %s", bar(r, barWidth), FormatDuration(r.Span.Duration),
			nameW, name(r), strings.Join(Highlights(r.Span), " "))
		b.WriteString(strings.TrimRight(line, " ") + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

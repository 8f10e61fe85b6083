package tracestore

import (
	"fmt"
	"html"
	"io"
	"sort"
	"strings"
	"time"
)

// palette colors a waterfall's bars by service, in order of first
// appearance.
var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"}

// SVG geometry, in pixels.
const (
	svgWidth   = 1440
	svgLabelW  = 430 // service + indented operation
	svgBarX    = 440
	svgBarW    = 470
	svgNoteX   = svgBarX + svgBarW + 10
	svgRowH    = 22
	svgHeadH   = 62
	svgGap     = 18
	svgIndentW = 14
)

// WriteSVG draws layouts one under another as an SVG waterfall: per trace
// a header (trace ID, start, total, the root's reason), then a row per span
// with its service and operation indented under its parent, a bar colored
// by service and scaled to its trace, its duration and highlights.
func WriteSVG(w io.Writer, title string, ls []Layout) error {
	colors := map[string]string{}
	var services []string
	height := svgHeadH
	for _, l := range ls {
		height += svgHeadH + len(l.Rows)*svgRowH + svgGap
		for _, r := range l.Rows {
			if _, ok := colors[r.Span.Service]; !ok {
				colors[r.Span.Service] = palette[len(colors)%len(palette)]
				services = append(services, r.Span.Service)
			}
		}
	}
	height += svgRowH
	var b strings.Builder
	esc := html.EscapeString
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", esc(title))
	y := svgHeadH
	for _, l := range ls {
		y = svgTrace(&b, l, colors, y)
	}
	x := 10
	sort.Strings(services)
	for _, s := range services {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", x, y, colors[s], x+16, y+11, esc(s))
		x += 30 + 8*len(s)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func svgTrace(b *strings.Builder, l Layout, colors map[string]string, y int) int {
	esc := html.EscapeString
	head := fmt.Sprintf("trace %s · %s · %s", l.TraceID, l.Start.UTC().Format("2006-01-02 15:04:05.000 UTC"), FormatDuration(l.Total))
	fmt.Fprintf(b, `<g class="trace" data-trace-id="%s">`+"\n", esc(l.TraceID))
	fmt.Fprintf(b, `<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", y+14, esc(head))
	if len(l.Rows) > 0 {
		if r := l.Rows[0].Span.Attributes["reason"]; r != "" {
			fmt.Fprintf(b, `<text x="10" y="%d" fill="#444444">reason: %s</text>`+"\n", y+32, esc(r))
		}
	}
	y += svgHeadH
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="#f4f4f4"/>`+"\n", svgBarX, y, svgBarW, len(l.Rows)*svgRowH)
	for i := 0; i <= 4; i++ {
		// A time axis: the trace's extent in quarters.
		x := svgBarX + i*svgBarW/4
		anchor := map[int]string{0: "start", 4: "end"}[i]
		if anchor == "" {
			anchor = "middle"
		}
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#d0d0d0"/><text x="%d" y="%d" fill="#666666" font-size="11" text-anchor="%s">%s</text>`+"\n",
			x, y, x, y+len(l.Rows)*svgRowH, x, y-5, anchor, esc(FormatDuration(l.Total*time.Duration(i)/4)))
	}
	for i, r := range l.Rows {
		ry := y + i*svgRowH
		if i%2 == 1 {
			fmt.Fprintf(b, `<rect x="0" y="%d" width="%d" height="%d" fill="#000000" fill-opacity="0.03"/>`+"\n", ry, svgWidth, svgRowH)
		}
		bx := svgBarX + int(r.Offset*svgBarW)
		bw := max(int(r.Length*svgBarW+0.5), 2)
		if bx+bw > svgBarX+svgBarW {
			bx = svgBarX + svgBarW - bw
		}
		fmt.Fprintf(b, `<g class="span" data-span-id="%s">`, esc(r.Span.SpanID))
		fmt.Fprintf(b, `<text x="10" y="%d" fill="#666666">%s</text>`, ry+15, esc(clip(r.Span.Service, 22)))
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`, 170+r.Depth*svgIndentW, ry+15, esc(clip(r.Span.Operation, 36-r.Depth*2)))
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" rx="2" fill="%s"><title>%s %s</title></rect>`,
			bx, ry+4, bw, svgRowH-8, colors[r.Span.Service], esc(r.Span.Operation), esc(FormatDuration(r.Span.Duration)))
		note := FormatDuration(r.Span.Duration)
		if h := Highlights(r.Span); len(h) > 0 {
			note += "  " + strings.Join(h, " ")
		}
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text></g>`+"\n", svgNoteX, ry+15, esc(clip(note, 72)))
	}
	b.WriteString("</g>\n")
	return y + len(l.Rows)*svgRowH + svgGap
}

// clip shortens s to n runes, marking the cut with an ellipsis.
func clip(s string, n int) string {
	r := []rune(s)
	if n < 2 || len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

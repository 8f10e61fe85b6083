package tracestore

import (
	"bytes"
	"encoding/xml"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func sp(id, parent, svc, op string, startMs, durMs int, attrs ...string) Span {
	a := map[string]string{}
	for i := 0; i+1 < len(attrs); i += 2 {
		a[attrs[i]] = attrs[i+1]
	}
	return Span{TraceID: "t", SpanID: id, ParentSpanID: parent, Service: svc, Operation: op,
		Start: t0.Add(time.Duration(startMs) * time.Millisecond), Duration: time.Duration(durMs) * time.Millisecond, Attributes: a}
}

// rows renders a layout as "depth:id@offset+length" for comparison.
func rows(l Layout) string {
	var out []string
	for _, r := range l.Rows {
		out = append(out, strings.Repeat(">", r.Depth)+r.Span.SpanID+"@"+trim(r.Offset)+"+"+trim(r.Length))
	}
	return strings.Join(out, " ")
}

func trim(f float64) string { return strconv.FormatFloat(math.Round(f*1000)/1000, 'f', -1, 64) }

func TestWaterfall(t *testing.T) {
	for _, tc := range []struct {
		rule  string
		spans []Span
		want  string
		total time.Duration
	}{
		{rule: "children sit under their parent, siblings by start, fractions of the trace's extent",
			spans: []Span{sp("c2", "r", "a", "x", 500, 500), sp("r", "", "c", "d", 0, 100), sp("c1", "r", "a", "y", 100, 400), sp("g", "c1", "h", "z", 200, 100)},
			want:  "r@0+0.1 >c1@0.1+0.4 >>g@0.2+0.1 >c2@0.5+0.5", total: time.Second},
		{rule: "a span whose parent is missing is a root of its own",
			spans: []Span{sp("r", "", "c", "d", 0, 1000), sp("o", "gone", "a", "x", 500, 500)},
			want:  "r@0+1 o@0.5+0.5", total: time.Second},
		{rule: "a parent cycle still shows every span once",
			spans: []Span{sp("a", "b", "s", "x", 0, 1000), sp("b", "a", "s", "y", 100, 900)},
			want:  "a@0+1 >b@0.1+0.9", total: time.Second},
		{rule: "a span that is its own parent is a root",
			spans: []Span{sp("a", "a", "s", "x", 0, 1000)},
			want:  "a@0+1", total: time.Second},
		{rule: "a zero-length trace has zero fractions",
			spans: []Span{sp("a", "", "s", "x", 0, 0)},
			want:  "a@0+0", total: 0},
		{rule: "an empty trace has no rows", spans: nil, want: "", total: 0},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			l := Waterfall(Trace{TraceID: "t", Spans: tc.spans})
			if got := rows(l); got != tc.want {
				t.Errorf("rows %q, want %q", got, tc.want)
			}
			if l.Total != tc.total {
				t.Errorf("total %s, want %s", l.Total, tc.total)
			}
		})
	}
}

func TestHighlights(t *testing.T) {
	for _, tc := range []struct {
		rule  string
		attrs []string
		want  string
	}{
		{rule: "sizes as from→to, then the code and who asked",
			attrs: []string{"to_size", "1", "from_size", "2", "code", "UserResize", "requested_by", "alice", "job", "tj"},
			want:  "2→1 UserResize by alice"},
		{rule: "a lone target size", attrs: []string{"to_size", "3"}, want: "→3"},
		{rule: "the world size, else the new one; each step by its meaning",
			attrs: []string{"new_world_size", "2", "world_size", "1", "step", "9", "checkpoint_step", "8", "resume_step", "8"},
			want:  "world=1 checkpoint=8 resume=8 step=9"},
		{rule: "the new world size alone", attrs: []string{"new_world_size", "2"}, want: "world=2"},
		{rule: "every downtime attribute, then node, rounds, steps and signal",
			attrs: []string{"downtime_ms", "812", "signal", "SIGUSR1", "resume_step", "120", "from_round", "3", "to_round", "4", "node", "n1", "downtime", "0.8s"},
			want:  "downtime=0.8s downtime_ms=812.0ms node=n1 round 3→4 resume=120 signal=SIGUSR1"},
		{rule: "a downtime in seconds (a bare number) reads as a duration",
			attrs: []string{"downtime", "0.522732133"}, want: "downtime=522.7ms"},
		{rule: "a downtime that is not a number is shown as is",
			attrs: []string{"downtime", "NaN"}, want: "downtime=NaN"},
		{rule: "nothing known, nothing shown", attrs: []string{"job", "tj", "team", "a"}, want: ""},
		{rule: "a one-word reason is a code", attrs: []string{"reason", "TargetChanged", "node", "n1"}, want: "TargetChanged node=n1"},
		{rule: "a sentence of a reason is not shown", attrs: []string{"reason", "shrunk from 2 to 1 nodes"}, want: ""},
		{rule: "beside a code, the reason is not shown", attrs: []string{"code", "SpecChanged", "reason", "x"}, want: "SpecChanged"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := strings.Join(Highlights(sp("s", "", "x", "y", 0, 0, tc.attrs...)), " "); got != tc.want {
				t.Errorf("%q, want %q", got, tc.want)
			}
		})
	}
}

// The node of a span without a node attribute is its process's.
func TestHighlightsNodeFromTheResource(t *testing.T) {
	s := sp("s", "", "hyperpodrun", "restart", 0, 0, "round", "2")
	s.Resource = map[string]string{"hyperpodrun.node": "node-a"}
	if got := strings.Join(Highlights(s), " "); got != "node=node-a round=2" {
		t.Errorf("%q", got)
	}
	s.Attributes["node"] = "node-b"
	if got := s.Node(); got != "node-b" {
		t.Errorf("the span's own node attribute: %q", got)
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0", 850 * time.Microsecond: "850µs", 12300 * time.Microsecond: "12.3ms", 4200 * time.Millisecond: "4.20s", 125 * time.Second: "2m05s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("%s: %q, want %q", d, got, want)
		}
	}
}

func resizeTrace() Trace {
	return Trace{TraceID: "abc", Spans: []Span{
		sp("r", "", "hyperpod-coordinator", "coordinator.decision", 0, 10, "job", "tj", "from_size", "2", "to_size", "1", "code", "UserResize", "requested_by", "alice", "reason", "shrunk from 2 to 1 nodes: alice asked"),
		sp("a", "r", "hyperpod-agent", "agent.stop", 100, 300, "node", "n2"),
		sp("h", "a", "hyperpodrun", "hyperpodrun.restart", 200, 800, "downtime", "0.7s", "resume_step", "40"),
	}}
}

// The text waterfall: a header with the reason, a line per span with its
// bar scaled to the trace, indented under its parent, with highlights.
func TestWriteText(t *testing.T) {
	var b bytes.Buffer
	if err := WriteText(&b, Waterfall(resizeTrace()), 10); err != nil {
		t.Fatal(err)
	}
	want := `trace abc  2026-11-25T12:00:00Z  1.00s
  reason: shrunk from 2 to 1 nodes: alice asked
  |#.........|   10.0ms  hyperpod-coordinator coordinator.decision  2→1 UserResize by alice
  |.###......|  300.0ms    hyperpod-agent agent.stop                node=n2
  |..########|  800.0ms      hyperpodrun hyperpodrun.restart        downtime=0.7s resume=40
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// The SVG is well-formed XML with a bar and the operation of every span.
func TestWriteSVG(t *testing.T) {
	var b bytes.Buffer
	if err := WriteSVG(&b, `job "tj" <resizes>`, []Layout{Waterfall(resizeTrace())}); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	spans, texts := 0, ""
	for {
		tok, err := dec.Token()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("not well-formed: %v\n%s", err, b.String())
			}
			break
		}
		switch e := tok.(type) {
		case xml.StartElement:
			for _, a := range e.Attr {
				if a.Name.Local == "class" && a.Value == "span" {
					spans++
				}
			}
		case xml.CharData:
			texts += string(e) + "\n"
		}
	}
	if spans != 3 {
		t.Errorf("%d span groups, want 3", spans)
	}
	for _, want := range []string{`job "tj" <resizes>`, "coordinator.decision", "agent.stop", "hyperpodrun.restart", "2→1 UserResize by alice", "reason: shrunk from 2 to 1 nodes"} {
		if !strings.Contains(texts, want) {
			t.Errorf("no %q in the SVG's text", want)
		}
	}
}

func TestBar(t *testing.T) {
	for _, tc := range []struct {
		rule           string
		offset, length float64
		want           string
	}{
		{"a span to the trace's end reaches the last cell", 0.145, 0.855, ".#########"},
		{"a span shorter than a cell gets one", 0.5, 0.001, ".....#...."},
		{"the whole trace fills the bar", 0, 1, "##########"},
		{"a span at the very end still shows", 1, 0, ".........#"},
	} {
		if got := bar(Row{Offset: tc.offset, Length: tc.length}, 10); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.rule, got, tc.want)
		}
	}
}

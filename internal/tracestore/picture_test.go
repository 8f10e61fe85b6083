package tracestore

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite docs/images/resize-trace.svg from testdata/resize-trace.json")

// picture is the docs' picture of a resize's trace, and its source: a
// real trace as Jaeger's query API returned it, dumped by a fleet test
// (JAEGERTEST_DUMP=dir go test ./agent/node/jobrunner -run
// TestResizeIsOneTraceInJaeger, then copy dir's hyperpod-coordinator file
// to testdata/resize-trace.json and run this test with -update).
const (
	picture       = "../../docs/images/resize-trace.svg"
	pictureSource = "testdata/resize-trace.json"
	pictureTitle  = "One resize, one trace: the coordinator's decision, the node agents and every hyperpodrun (read back from Jaeger)"
)

// pickTrace is the trace the picture shows: the one with the most
// services, then the most spans, then the latest.
func pickTrace(ts []Trace) (Trace, bool) {
	best, bestSvc := -1, 0
	for i, t := range ts {
		svc := map[string]bool{}
		for _, s := range t.Spans {
			svc[s.Service] = true
		}
		if best < 0 || len(svc) > bestSvc || len(svc) == bestSvc && (len(t.Spans) > len(ts[best].Spans) ||
			len(t.Spans) == len(ts[best].Spans) && t.Start().After(ts[best].Start())) {
			best, bestSvc = i, len(svc)
		}
	}
	if best < 0 {
		return Trace{}, false
	}
	return ts[best], true
}

func renderPicture(t *testing.T) ([]byte, Trace) {
	t.Helper()
	body, err := os.ReadFile(pictureSource)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := ParseTraces(body)
	if err != nil {
		t.Fatal(err)
	}
	tr, ok := pickTrace(ts)
	if !ok {
		t.Fatalf("%s holds no trace", pictureSource)
	}
	var b bytes.Buffer
	if err := WriteSVG(&b, pictureTitle, []Layout{Waterfall(tr)}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes(), tr
}

// The docs' picture is the rendering of the real trace it was drawn from
// (not stale), and headless Chromium draws it: every span's operation in
// the document, the bars in their colors on a screenshot.
func TestResizePicture(t *testing.T) {
	want, tr := renderPicture(t)
	if *update {
		if err := os.MkdirAll(filepath.Dir(picture), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(picture, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(picture)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: go test ./internal/tracestore -run TestResizePicture -update", picture)
	}
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		testutil.SkipOrFail(t, "chromium is not installed (apt-get install -y chromium): the picture's rendering is not checked")
	}
	abs, err := filepath.Abs(picture)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	common := []string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--user-data-dir=" + t.TempDir()}
	dom, err := exec.CommandContext(ctx, chromium, append(common, "--dump-dom", "file://"+abs)...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	if strings.Contains(string(dom), "error on line") || strings.Count(string(dom), `class="span"`) != len(tr.Spans) {
		t.Errorf("chromium's document of the picture: %d spans of %d, or an XML error:\n%.2000s", strings.Count(string(dom), `class="span"`), len(tr.Spans), dom)
	}
	for _, s := range tr.Spans {
		if !strings.Contains(string(dom), ">"+s.Operation+"<") {
			t.Errorf("chromium's document lacks span %q", s.Operation)
		}
	}
	shot := filepath.Join(t.TempDir(), "picture.png")
	if out, err := exec.CommandContext(ctx, chromium, append(common, "--screenshot="+shot, "--window-size=1280,900", "file://"+abs)...).CombinedOutput(); err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, out)
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	// The bars are drawn in the services' colors.
	var colors [][3]uint32
	for _, c := range palette {
		var r, g, b uint32
		fmt.Sscanf(c, "#%02x%02x%02x", &r, &g, &b)
		colors = append(colors, [3]uint32{r, g, b})
	}
	bars := 0
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y++ {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			for _, c := range colors {
				if near(r>>8, c[0]) && near(g>>8, c[1]) && near(b>>8, c[2]) {
					bars++
					break
				}
			}
		}
	}
	if bars < 40*len(tr.Spans) {
		t.Errorf("the screenshot has %d pixels of the services' colors for %d spans: the bars are not drawn", bars, len(tr.Spans))
	}
}

func near(a, b uint32) bool { return a+6 >= b && b+6 >= a }

func TestPickTrace(t *testing.T) {
	one := Trace{TraceID: "one", Spans: []Span{sp("a", "", "s1", "x", 0, 1)}}
	two := Trace{TraceID: "two", Spans: []Span{sp("a", "", "s1", "x", 0, 1), sp("b", "a", "s2", "y", 0, 1)}}
	many := Trace{TraceID: "many", Spans: []Span{sp("a", "", "s1", "x", 0, 1), sp("b", "a", "s1", "y", 0, 1), sp("c", "a", "s1", "z", 0, 1)}}
	later := Trace{TraceID: "later", Spans: []Span{sp("a", "", "s1", "x", 5, 1)}}
	for _, tc := range []struct {
		rule string
		ts   []Trace
		want string
	}{
		{"the most services wins", []Trace{many, two, one}, "two"},
		{"then the most spans", []Trace{one, many}, "many"},
		{"then the latest", []Trace{one, later}, "later"},
		{"none: none", nil, ""},
	} {
		got, _ := pickTrace(tc.ts)
		if got.TraceID != tc.want {
			t.Errorf("%s: %q, want %q", tc.rule, got.TraceID, tc.want)
		}
	}
}

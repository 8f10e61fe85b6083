package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// simulateReport writes a trace and runs simulate --compare with --report.
func simulateReport(t *testing.T, extra ...string) (report, stdout string) {
	t.Helper()
	var trace, errb bytes.Buffer
	if code := run([]string{"elasticctl", "simulate", "generate", "--jobs", "300", "--capacity", "64", "--teams", "a,b"}, &trace, &errb); code != 0 {
		t.Fatalf("generate: %d %s", code, errb.String())
	}
	tp := writeFile(t, "trace.jsonl", trace.String())
	teams := writeFile(t, "teams.yaml", "teams:\n- {name: a, quotas: [{flavor: nvidia-h100-80gb, nominal: 32}]}\n- {name: b, quotas: [{flavor: nvidia-h100-80gb, nominal: 32}]}\n")
	report = filepath.Join(t.TempDir(), "report.html")
	var out bytes.Buffer
	args := append([]string{"elasticctl", "simulate", "--trace", tp, "--teams", teams, "--compare", "fifo,engine", "--report", report}, extra...)
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("simulate: %d %s", code, errb.String())
	}
	return report, out.String()
}

func TestSimulateCompareReportJSONAndYAML(t *testing.T) {
	report, out := simulateReport(t)
	if !regexp.MustCompile(`(?m)^POLICY\s+JOBS`).MatchString(out) || !regexp.MustCompile(`(?m)^fifo\s+300`).MatchString(out) || !regexp.MustCompile(`(?m)^engine\s+300`).MatchString(out) {
		t.Errorf("--compare table:\n%s", out)
	}
	page, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "Per-team usage against nominal quota (engine)", "Fleet utilisation", "Queue length", "reclaim decisions"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if regexp.MustCompile(`(?i)<script|https?://|<link`).Match(page) {
		t.Errorf("the report is not self-contained (script, link or URL)")
	}
	_, js := simulateReport(t, "-o", "json")
	var reps []struct {
		Mode   string `json:"mode"`
		Series struct {
			T     []float64 `json:"t"`
			Queue []int     `json:"queue"`
			Teams []struct {
				Used []int `json:"used"`
			} `json:"teams"`
		} `json:"series"`
	}
	if err := json.Unmarshal([]byte(js), &reps); err != nil || len(reps) != 2 || len(reps[1].Series.T) < 10 || len(reps[1].Series.Teams) != 2 || len(reps[1].Series.Teams[0].Used) != len(reps[1].Series.T) {
		t.Errorf("-o json: %v, %d reports", err, len(reps))
	}
	_, ys := simulateReport(t, "-o", "yaml")
	var y []map[string]any
	if err := yaml.Unmarshal([]byte(ys), &y); err != nil || len(y) != 2 || y[0]["series"] == nil {
		t.Errorf("-o yaml: %v", err)
	}
}

// The report renders in headless Chromium: its charts are drawn (SVG
// paths with coordinates) and the page logs no console error.
func TestSimulateReportRendersInChromium(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install -y chromium): the report's rendering is not checked")
	}
	report, _ := simulateReport(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	shot := filepath.Join(t.TempDir(), "report.png")
	if dest := os.Getenv("ELASTICCTL_REPORT_SCREENSHOT"); dest != "" {
		shot = dest
	}
	common := []string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--user-data-dir=" + t.TempDir(), "--enable-logging=stderr", "--v=0"}
	cmd := exec.CommandContext(ctx, chromium, append(common, "--dump-dom", "file://"+report)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	dom, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v\n%s", err, stderr.String())
	}
	paths := regexp.MustCompile(`<path class="series" d="M[\d.]+ [\d.]+(L[\d.]+ [\d.]+){10,}`).FindAll(dom, -1)
	if len(paths) < 4 || strings.Count(string(dom), "<svg") < 4 {
		t.Errorf("the rendered page has %d drawn series paths and %d charts", len(paths), strings.Count(string(dom), "<svg"))
	}
	if m := regexp.MustCompile(`(?m)^.*CONSOLE.*(ERROR|Uncaught).*$`).Find(stderr.Bytes()); m != nil {
		t.Errorf("console error while rendering: %s", m)
	}
	cmd = exec.CommandContext(ctx, chromium, append(common, "--screenshot="+shot, "--window-size=1200,900", "file://"+report)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, out)
	}
	if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
		t.Errorf("screenshot: %v", err)
	}
}

package sim

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A comparison's report shows every policy side by side, rendered by a
// real browser: the figures table names each policy and says which FIFO
// it is, the JCT CDF draws one line per policy, and each team's usage is
// drawn against its quota with one line per policy.
func TestCompareReportRendersInChromium(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install -y chromium): the report's rendering is not checked")
	}
	trace := Generate(GenOptions{Seed: 5, Jobs: 300, Capacity: 32, Load: 1, ElasticFraction: 0.5,
		Teams: []TeamLoad{{Name: "a", Share: 1}, {Name: "b", Share: 1}}})
	reps, err := Compare(trace, Modes, Options{Teams: twoTeams()})
	if err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(t.TempDir(), "report.html")
	var page bytes.Buffer
	if err := WriteHTML(&page, "compare", reps); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(report, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	common := []string{"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--user-data-dir=" + t.TempDir()}
	dom, err := exec.CommandContext(ctx, chromium, append(common, "--dump-dom", "file://"+report)...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	text := string(dom)
	for _, m := range Modes {
		if !strings.Contains(text, "<tr><td>"+string(m)+"</td>") {
			t.Errorf("the side-by-side table has no row for %s", m)
		}
	}
	if !strings.Contains(text, "jobs over the team's quota rejected") {
		t.Errorf("the report does not say which FIFO it is")
	}
	cdf := regexp.MustCompile(`(?s)Job completion time \(CDF\)</h2>\s*<svg.*?</svg>`).FindString(text)
	if n := len(regexp.MustCompile(`<path class="series" d="M[\d.]+ [\d.]+(L[\d.]+ [\d.]+){20,}`).FindAllString(cdf, -1)); n != len(Modes) {
		t.Errorf("the JCT CDF draws %d policies, want %d", n, len(Modes))
	}
	for _, team := range []string{"a", "b"} {
		sec := regexp.MustCompile(`(?s)Team ` + team + `: usage against its quota, per policy</h2>\s*<svg.*?</svg>`).FindString(text)
		// one line per simulated policy (the oracle has no time series) and the quota
		if n := strings.Count(sec, `class="series"`); n != len(Modes)-1+1 {
			t.Errorf("team %s: %d lines, want %d", team, n, len(Modes))
		}
	}
	if dest := os.Getenv("SIM_REPORT_SCREENSHOT"); dest != "" {
		cmd := exec.CommandContext(ctx, chromium, append(common, "--screenshot="+dest, "--window-size=1300,2400", "file://"+report)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("chromium --screenshot: %v\n%s", err, out)
		}
	}
}

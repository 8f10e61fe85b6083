package launcher

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRootCauseIsEarliestFailure(t *testing.T) {
	g := &Group{failures: []Failure{
		{Rank: 0, Time: time.Unix(2000, 0), ExitCode: 1, Message: "late"},
		{Rank: 3, Time: time.Unix(1000, 0), ExitCode: -9, Signal: syscall.SIGKILL},
		{Rank: 1, Time: time.Unix(1500, 0), ExitCode: 2},
	}}
	r := g.Result()
	if r.RootCause == nil || r.RootCause.Rank != 3 {
		t.Fatalf("root cause %+v, want rank 3 (earliest)", r.RootCause)
	}
	if r.Failures[0].Rank != 0 || r.Failures[2].Rank != 3 {
		t.Errorf("failures not ordered by rank: %+v", r.Failures)
	}
	s := r.Summary("train.py")
	root := s[strings.Index(s, "Root Cause"):]
	if !strings.Contains(root, "Signal 9 (SIGKILL) received by PID") || !strings.Contains(s, "late") {
		t.Errorf("summary:\n%s", s)
	}
}

func TestErrorFileFormats(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	cases := []struct {
		body, wantMsg string
		wantTS        int64
	}{
		{`{"message":{"message":"RuntimeError: x","extraInfo":{"py_callstack":"tb","timestamp":"1700000000"}}}`, "RuntimeError: x", 1700000000},
		{`{"message":"plain message"}`, "plain message", 0},
		{`not json`, "unreadable error file", 0},
		{`{"message":{"message":"m","extraInfo":{"timestamp":"garbage"}}}`, "m", 0},
	}
	for i, c := range cases {
		f := Failure{ErrorFile: write(string(rune('a'+i))+".json", c.body), Time: time.Unix(5, 0)}
		f.readErrorFile()
		if !strings.Contains(f.Message, c.wantMsg) {
			t.Errorf("case %d: message %q, want %q", i, f.Message, c.wantMsg)
		}
		if c.wantTS != 0 && f.Time.Unix() != c.wantTS {
			t.Errorf("case %d: time %v, want %d", i, f.Time, c.wantTS)
		}
		if c.wantTS == 0 && f.Time.Unix() != 5 {
			t.Errorf("case %d: time changed to %v without a valid timestamp", i, f.Time)
		}
	}
	missing := Failure{ErrorFile: filepath.Join(dir, "none.json")}
	missing.readErrorFile()
	if missing.HasError || missing.Message != "" {
		t.Errorf("missing error file: %+v", missing)
	}
}

func TestParseStd(t *testing.T) {
	s, err := ParseStd("tee", "0:1,2:3")
	if err != nil || s.For(0) != StdOut || s.For(1) != StdNone || s.For(2) != StdAll {
		t.Errorf("per-rank: %+v %v", s, err)
	}
	if s, err := ParseStd("redirects", "2"); err != nil || s.For(7) != StdErr {
		t.Errorf("single: %v %v", s, err)
	}
	for _, bad := range []string{"4", "x", "0:9", "a:1", "0-1"} {
		if _, err := ParseStd("redirects", bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The summary numbers every failed rank in rank order, as torch's
// ChildFailedError does: the others under Failures, the first to fail
// under Root Cause with its own number.
func TestSummaryNumbersFailuresAsTorch(t *testing.T) {
	g := &Group{failures: []Failure{
		{Rank: 0, Time: time.Unix(2000, 0), ExitCode: 1},
		{Rank: 1, Time: time.Unix(1000, 0), ExitCode: 2},
		{Rank: 3, Time: time.Unix(3000, 0), ExitCode: 1},
	}}
	s := g.Result().Summary("train.py")
	failures := s[strings.Index(s, "Failures:"):strings.Index(s, "Root Cause")]
	root := s[strings.Index(s, "Root Cause"):]
	for _, want := range []string{"[0]:\n  time      : " + time.Unix(2000, 0).Format("2006-01-02_15:04:05"), "rank      : 0 ", "[2]:", "rank      : 3 "} {
		if !strings.Contains(failures, want) {
			t.Errorf("Failures section lacks %q:\n%s", want, s)
		}
	}
	if !strings.Contains(root, "[1]:") || !strings.Contains(root, "rank      : 1 ") || strings.Contains(failures, "rank      : 1 ") {
		t.Errorf("root cause should be rank 1 numbered [1], listed once:\n%s", s)
	}
}

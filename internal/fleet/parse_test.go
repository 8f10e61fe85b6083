package fleet

import (
	"strings"
	"testing"
	"time"
)

// TestParsersInvertFormatters: every parser reads back what its formatter
// wrote, under the default prefix and another one.
func TestParsersInvertFormatters(t *testing.T) {
	for _, k := range []Keys{{}, NewKeys("/other/tenant/")} {
		if n, ok := k.ParseNodeKey(k.Node("gpu-1.eu_west")); !ok || n != "gpu-1.eu_west" {
			t.Errorf("%s: ParseNodeKey = %q, %v", k.Prefix(), n, ok)
		}
		if n, ok := k.ParseAliveKey(k.Alive("n1")); !ok || n != "n1" {
			t.Errorf("%s: ParseAliveKey = %q, %v", k.Prefix(), n, ok)
		}
		if n, ok := k.ParseTeamKey(k.Team("vision")); !ok || n != "vision" {
			t.Errorf("%s: ParseTeamKey = %q, %v", k.Prefix(), n, ok)
		}
		if j, ok := k.ParseFinishKey(k.Finish("llama")); !ok || j != "llama" {
			t.Errorf("%s: ParseFinishKey = %q, %v", k.Prefix(), j, ok)
		}
		if j, ok := k.ParseDesiredKey(k.Desired("llama")); !ok || j != "llama" {
			t.Errorf("%s: ParseDesiredKey = %q, %v", k.Prefix(), j, ok)
		}
		if j, ok := k.ParseStatusKey(k.Status("llama")); !ok || j != "llama" {
			t.Errorf("%s: ParseStatusKey = %q, %v", k.Prefix(), j, ok)
		}
		if s, ok := k.ParseSpecKey(k.Spec("vision", "llama")); !ok || s != (SpecKey{"vision", "llama"}) {
			t.Errorf("%s: ParseSpecKey = %+v, %v", k.Prefix(), s, ok)
		}
		if a, ok := k.ParseAssignmentKey(k.Assignment("n1", "llama")); !ok || a != (AssignmentKey{"n1", "llama"}) {
			t.Errorf("%s: ParseAssignmentKey = %+v, %v", k.Prefix(), a, ok)
		}
		if r, ok := k.ParseReportKey(k.FinishReport("n1", "llama")); !ok || r != (ReportKey{"n1", ReportFinished, "llama"}) {
			t.Errorf("%s: ParseReportKey(finish) = %+v, %v", k.Prefix(), r, ok)
		}
		if r, ok := k.ParseReportKey(k.ProblemReport("n1", "llama")); !ok || r != (ReportKey{"n1", ReportProblem, "llama"}) {
			t.Errorf("%s: ParseReportKey(problem) = %+v, %v", k.Prefix(), r, ok)
		}
		if p, ok := k.ParseProblemKey(k.Problem("llama", "n1")); !ok || p != (ProblemKey{"llama", "n1"}) {
			t.Errorf("%s: ParseProblemKey = %+v, %v", k.Prefix(), p, ok)
		}
		at := time.Unix(1700000000, 123456789)
		if e, ok := k.ParseEventKey(k.Event(at, "llama")); !ok || !e.Time.Equal(at) || e.Job != "llama" {
			t.Errorf("%s: ParseEventKey = %+v, %v", k.Prefix(), e, ok)
		}
	}
}

// TestParsersRefuseMalformedKeys: a key under another prefix or
// directory, with a missing, empty, extra or hostile segment, names
// nothing.
func TestParsersRefuseMalformedKeys(t *testing.T) {
	k := Keys{}
	other := NewKeys("/other")
	one := map[string]func(string) (string, bool){
		"node": k.ParseNodeKey, "alive": k.ParseAliveKey, "team": k.ParseTeamKey,
		"finish": k.ParseFinishKey, "desired": k.ParseDesiredKey, "status": k.ParseStatusKey,
	}
	dirs := map[string]string{
		"node": k.NodesPrefix(), "alive": k.AlivePrefix(), "team": k.TeamsPrefix(),
		"finish": k.FinishedPrefix(), "desired": k.DesiredPrefix(), "status": k.StatusPrefix(),
	}
	otherDirs := map[string]string{
		"node": other.NodesPrefix(), "alive": other.AlivePrefix(), "team": other.TeamsPrefix(),
		"finish": other.FinishedPrefix(), "desired": other.DesiredPrefix(), "status": other.StatusPrefix(),
	}
	for what, parse := range one {
		dir := dirs[what]
		for rule, key := range map[string]string{
			"another prefix":           otherDirs[what] + "n1",
			"a prefix that only looks": strings.TrimSuffix(dir, "/") + "x/n1",
			"another directory":        k.EventsPrefix() + "n1",
			"the directory itself":     dir,
			"the directory no slash":   strings.TrimSuffix(dir, "/"),
			"empty":                    "",
			"dot-dot":                  dir + "..",
			"dot":                      dir + ".",
			"extra segment":            dir + "n1/extra",
			"trailing slash":           dir + "n1/",
			"escape by dot-dot":        dir + "../specs/a/b",
			"leading slash":            dir + "/n1",
			"space":                    dir + "n 1",
			"NUL":                      dir + "n\x001",
			"too long":                 dir + strings.Repeat("a", 300),
		} {
			if name, ok := parse(key); ok {
				t.Errorf("%s key, %s (%q): parsed as %q", what, rule, key, name)
			}
		}
	}
	// Job and team names are DNS-1123 labels; node names are wider.
	if _, ok := k.ParseFinishKey(k.FinishedPrefix() + "Llama_2"); ok {
		t.Error("a finish key naming a job that is no DNS-1123 label was parsed")
	}
	if _, ok := k.ParseNodeKey(k.NodesPrefix() + "Node_2.local"); !ok {
		t.Error("a node name with capitals, '_' and '.' was refused")
	}
	for rule, key := range map[string]string{
		"spec: one segment":        k.SpecsPrefix() + "team",
		"spec: three segments":     k.Spec("team", "job") + "/x",
		"spec: empty team":         k.SpecsPrefix() + "/job",
		"spec: dot-dot job":        k.Spec("team", ".."),
		"spec: another prefix":     other.Spec("team", "job"),
		"assignment: empty job":    k.NodeAssignments("n1"),
		"assignment: dot-dot node": k.Assignment("..", "job"),
		"assignment: extra":        k.Assignment("n1", "job") + "/x",
		"report: unknown kind":     k.NodeReports("n1") + "other/job",
		"report: missing job":      k.NodeReports("n1") + ReportFinished + "/",
		"report: extra segment":    k.FinishReport("n1", "job") + "/x",
		"report: dot-dot node":     k.FinishReport("..", "job"),
		"problem: missing node":    k.Problems("job"),
		"problem: extra segment":   k.Problem("job", "n1") + "/x",
		"event: short":             k.EventsPrefix() + "123-job",
		"event: not digits":        k.EventsPrefix() + "0000000000000000000x-job",
		"event: no dash":           k.EventsPrefix() + "00000000000000000001_job",
		"event: overflow":          k.EventsPrefix() + "99999999999999999999-job",
		"event: job with a slash":  k.Event(time.Unix(1, 0), "a/b"),
		"event: another prefix":    other.Event(time.Unix(1, 0), "job"),
	} {
		var ok bool
		switch {
		case strings.HasPrefix(rule, "spec"):
			_, ok = k.ParseSpecKey(key)
		case strings.HasPrefix(rule, "assignment"):
			_, ok = k.ParseAssignmentKey(key)
		case strings.HasPrefix(rule, "report"):
			_, ok = k.ParseReportKey(key)
		case strings.HasPrefix(rule, "problem"):
			_, ok = k.ParseProblemKey(key)
		case strings.HasPrefix(rule, "event"):
			_, ok = k.ParseEventKey(key)
		}
		if ok {
			t.Errorf("%s (%q): parsed", rule, key)
		}
	}
}

// TestValidNodeName: the node names a key segment may hold.
func TestValidNodeName(t *testing.T) {
	for name, want := range map[string]bool{
		"n1": true, "ip-10-0-0-1.ec2.internal": true, "A_b": true, "x": true,
		"": false, ".": false, "..": false, "-a": false, "a-": false, "a/b": false, "a b": false,
		strings.Repeat("a", 253): true, strings.Repeat("a", 254): false,
	} {
		if got := ValidNodeName(name); got != want {
			t.Errorf("ValidNodeName(%q) = %v, want %v", name, got, want)
		}
	}
}

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

// TestParseRunningAndReadyKeys: the running-workers markers and the ready
// barriers read back into their job, node (and round), and a key of
// another shape names nothing.
func TestParseRunningAndReadyKeys(t *testing.T) {
	for _, k := range []Keys{{}, NewKeys("/other/tenant/")} {
		if r, ok := k.ParseRunningKey(k.Running("llama", "ip-10-0-0-1.ec2.internal")); !ok || r != (RunningKey{"llama", "ip-10-0-0-1.ec2.internal"}) {
			t.Errorf("%s: ParseRunningKey = %+v, %v", k.Prefix(), r, ok)
		}
		if r, ok := k.ParseReadyKey(k.Ready("llama", 0x1f, "n1")); !ok || r != (ReadyKey{"llama", 0x1f, "n1"}) {
			t.Errorf("%s: ParseReadyKey = %+v, %v", k.Prefix(), r, ok)
		}
	}
	k, other := Keys{}, NewKeys("/other")
	for rule, key := range map[string]string{
		"running: another prefix":     other.Running("j", "n1"),
		"running: another directory":  k.Job("j") + "ready/n1",
		"running: no node":            k.RunningPrefix("j"),
		"running: dot-dot node":       k.Running("j", ".."),
		"running: extra segment":      k.Running("j", "n1") + "/x",
		"running: job no label":       k.Running("J_1", "n1"),
		"running: empty job":          k.JobsPrefix() + "/running/n1",
		"running: the job's restarts": k.Restarts("j"),
		"ready: another prefix":       other.Ready("j", 1, "n1"),
		"ready: round not hex16":      k.ReadyPrefix("j") + "1/n1",
		"ready: round not hex":        k.ReadyPrefix("j") + "000000000000000g/n1",
		"ready: round overflows":      k.ReadyPrefix("j") + "ffffffffffffffff/n1",
		"ready: no node":              k.ReadyRound("j", 1),
		"ready: dot-dot node":         k.Ready("j", 1, ".."),
		"ready: extra segment":        k.Ready("j", 1, "n1") + "/x",
		"ready: running directory":    k.Job("j") + "running/" + Hex16(1) + "/n1",
	} {
		var ok bool
		if strings.HasPrefix(rule, "running") {
			_, ok = k.ParseRunningKey(key)
		} else {
			_, ok = k.ParseReadyKey(key)
		}
		if ok {
			t.Errorf("%s (%q): parsed", rule, key)
		}
	}
}

// TestLenientReadersTakeAnyName: SpecOwner, AssignmentOwner, ReportOwner
// and JobOfKey check a key's shape, not its names (a spec named "Bad_Name"
// is read, for the engine to report it invalid), and refuse a key of
// another shape.
func TestLenientReadersTakeAnyName(t *testing.T) {
	k := Keys{}
	if _, job, ok := k.SpecOwner(k.Spec("t", strings.Repeat("j", MaxReadName))); !ok || len(job) != MaxReadName {
		t.Errorf("SpecOwner of a spec named with MaxReadName bytes: not read")
	}
	if team, job, ok := k.SpecOwner(k.Spec("Team_1", "Bad_Name")); !ok || team != "Team_1" || job != "Bad_Name" {
		t.Errorf("SpecOwner of a spec named no label = %q, %q, %v", team, job, ok)
	}
	if node, job, ok := k.AssignmentOwner(k.Assignment("n1", "Bad_Name")); !ok || node != "n1" || job != "Bad_Name" {
		t.Errorf("AssignmentOwner = %q, %q, %v", node, job, ok)
	}
	if node, kind, job, ok := k.ReportOwner(k.ProblemReport("n1", "Bad_Name")); !ok || node != "n1" || kind != ReportProblem || job != "Bad_Name" {
		t.Errorf("ReportOwner = %q, %q, %q, %v", node, kind, job, ok)
	}
	for key, want := range map[string]string{
		k.Desired("Bad_Name"): "Bad_Name", k.Status("j"): "j", k.Finish("j"): "j", k.Spec("t", "j"): "j", k.Problem("j", "n1"): "j",
		k.Desired("j") + "/x": "", k.DesiredPrefix(): "", k.Restarts("j"): "",
	} {
		if got := k.JobOfKey(key); got != want {
			t.Errorf("JobOfKey(%q) = %q, want %q", key, got, want)
		}
	}
	for rule, ok := range map[string]bool{
		"spec: extra segment":       func() bool { _, _, ok := k.SpecOwner(k.Spec("t", "j") + "/x"); return ok }(),
		"spec: empty job":           func() bool { _, _, ok := k.SpecOwner(k.TeamSpecs("t")); return ok }(),
		"spec: job name too long":   func() bool { _, _, ok := k.SpecOwner(k.Spec("t", strings.Repeat("j", MaxReadName+1))); return ok }(),
		"spec: team name too long":  func() bool { _, _, ok := k.SpecOwner(k.Spec(strings.Repeat("t", MaxReadName+1), "j")); return ok }(),
		"assignment: empty node":    func() bool { _, _, ok := k.AssignmentOwner(k.AssignPrefix() + "/j"); return ok }(),
		"assignment: extra segment": func() bool { _, _, ok := k.AssignmentOwner(k.Assignment("n", "j") + "/x"); return ok }(),
		"report: unknown kind":      func() bool { _, _, _, ok := k.ReportOwner(k.NodeReports("n1") + "other/j"); return ok }(),
		"report: empty job":         func() bool { _, _, _, ok := k.ReportOwner(k.NodeReports("n1") + ReportFinished + "/"); return ok }(),
	} {
		if ok {
			t.Errorf("%s: read", rule)
		}
	}
	if job := k.EventJob(k.Event(time.Unix(5, 6), "my-job")); job != "my-job" {
		t.Errorf("EventJob = %q, want my-job", job)
	}
	if job := k.EventJob(k.EventsPrefix() + "0000000000000000000x-job"); job != "" {
		t.Errorf("EventJob of a malformed event key = %q, want none", job)
	}
}

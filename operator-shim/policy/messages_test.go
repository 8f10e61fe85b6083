package policy

import (
	"strings"
	"testing"
)

// Rule: a message never says "within the team's nominal quota" beside a
// usage above nominal; above nominal it says the team borrows, and how much.
func TestQuotaStanding(t *testing.T) {
	for _, tc := range []struct {
		rule          string
		used, nominal int
		want          string
	}{
		{"below nominal: within", 8, 16, " within the team's nominal quota (U)"},
		{"at nominal: within", 16, 16, " within the team's nominal quota (U)"},
		{"above nominal: borrowing, by how much", 16, 8, " with the team borrowing idle quota (U, 8 above nominal)"},
	} {
		if got := quotaStanding(tc.used, tc.nominal, "U"); got != tc.want {
			t.Errorf("%s: quotaStanding(%d, %d) = %q, want %q", tc.rule, tc.used, tc.nominal, got, tc.want)
		}
	}
}

// Rule: a shrink the spec forces is the spec's, and names the nodes lost
// at the same time.
func TestSpecShrinkDetail(t *testing.T) {
	for _, tc := range []struct {
		rule                 string
		held, min, max, lost int
		want                 string
	}{
		{"spec only", 4, 1, 2, 0, "size 4 is not allowed by the spec (min 1, max 2)"},
		{"spec and a lost node", 4, 1, 3, 1, "size 4 is not allowed by the spec (min 1, max 3); 1 node of the allocation lost meanwhile"},
		{"spec and lost nodes", 4, 1, 1, 2, "size 4 is not allowed by the spec (min 1, max 1); 2 nodes of the allocation lost meanwhile"},
	} {
		if got := specShrinkDetail(tc.held, tc.min, tc.max, tc.lost); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.rule, got, tc.want)
		}
	}
}

// A job admitted within its team's nominal quota that then grows by
// borrowing idle quota is not told it is "within the team's nominal quota
// (uses 24 of nominal 8)".
func TestAdmittedAndGrownBeyondNominalIsWordedAsBorrowing(t *testing.T) {
	e := newEnv(t, mkNodes("n", 3, 8), []Team{mkTeam("a", 8), mkTeam("b", 16)}, job("a1", "a", 50, 1, 3, true))
	d := e.cycle()
	r := wantKind(t, d, "a1", KindAdmitted, "")
	if size(d, "a1") != 3 {
		t.Fatalf("a1 size %d (%s), want 3 (grown into b's idle quota)", size(d, "a1"), r.Message)
	}
	if strings.Contains(r.Message, "within the team's nominal quota") || !strings.Contains(r.Message, "uses 24 of nominal 8") || !strings.Contains(r.Message, "16 above nominal") {
		t.Errorf("message %q: want the team's borrowing, not within its nominal quota", r.Message)
	}
}

// The user's resize (maxNodes lowered) in the cycle a node of the job is
// lost is the spec's shrink, not "node(s) lost and no replacement free"
// while a spare node is there.
func TestUserResizeWithALostNodeIsTheSpecs(t *testing.T) {
	for _, tc := range []struct {
		rule     string
		max      int
		lost     int
		wantSize int
	}{
		{"the kept nodes are enough", 3, 1, 3},
		{"more kept nodes than the spec allows", 2, 1, 2},
		{"a lost node replaced from the spare", 3, 2, 3},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			e := newEnv(t, mkNodes("n", 6, 8), []Team{mkTeam("a", 48)}, job("a1", "a", 50, 1, 4, true))
			if d := e.cycle(); size(d, "a1") != 4 {
				t.Fatalf("a1 size %d", size(d, "a1"))
			}
			a, _ := e.last.Allocation("a1")
			for _, n := range a.Nodes[:tc.lost] {
				for i := range e.st.Nodes {
					if e.st.Nodes[i].Name == n {
						e.st.Nodes[i].Unhealthy = true
					}
				}
			}
			e.st.Jobs[0].MaxNodes = tc.max
			d := e.cycle()
			r := wantKind(t, d, "a1", KindShrunk, CodeSpecChanged)
			if size(d, "a1") != tc.wantSize || !strings.Contains(r.Message, "spec changed") || strings.Contains(r.Message, "no replacement free") {
				t.Errorf("size %d, message %q; want %d and the spec's shrink", size(d, "a1"), r.Message, tc.wantSize)
			}
		})
	}
}

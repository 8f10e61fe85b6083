package policy

import (
	"strings"
	"testing"
)

// Rule: a decision the user's change of the spec caused says the user
// asked for it, and who, as the spec names the writer (RequestedBy);
// decisions the user did not cause name no one.
func TestUserResizeIsExplainedAsTheUsers(t *testing.T) {
	for _, tc := range []struct {
		rule       string
		by         string
		change     func(j *Job)
		lose       bool // a node of the job turns unhealthy instead
		kind       ReasonKind
		code       ReasonCode
		wantBy     string
		wantInText []string
	}{
		{rule: "maxNodes lowered by an etcd user: a shrink at the user's request, naming the user",
			by: "etcd user research", change: func(j *Job) { j.MaxNodes = 1 },
			kind: KindShrunk, code: CodeSpecChanged, wantBy: "etcd user research",
			wantInText: []string{"shrunk from 2 to 1 nodes at the user's request", "spec changed by etcd user research"}},
		{rule: "maxNodes lowered by a Kubernetes object: names the object",
			by: "ElasticJob ml/a1 (generation 3)", change: func(j *Job) { j.MaxNodes = 1 },
			kind: KindShrunk, code: CodeSpecChanged, wantBy: "ElasticJob ml/a1 (generation 3)",
			wantInText: []string{"at the user's request", "spec changed by ElasticJob ml/a1 (generation 3)"}},
		{rule: "a writer that said nothing: still the user's request, no name",
			change: func(j *Job) { j.MaxNodes = 1 },
			kind:   KindShrunk, code: CodeSpecChanged,
			wantInText: []string{"shrunk from 2 to 1 nodes at the user's request: spec changed (size 2"}},
		{rule: "minNodes raised above the allocation: requeued, naming the user",
			by: "user alice", change: func(j *Job) { j.MinNodes, j.MaxNodes, j.Elastic = 3, 3, false },
			kind: KindPreempted, code: CodeSpecChanged, wantBy: "user alice",
			wantInText: []string{"spec changed by user alice (minNodes 3 is above the allocated 2 nodes)"}},
		{rule: "suspended: names who suspended it",
			by: "user alice", change: func(j *Job) { j.Suspended = true },
			kind: KindSuspended, code: CodeSuspended, wantBy: "user alice",
			wantInText: []string{"suspended by user alice"}},
		{rule: "a lost node with no spare is not the user's, whoever wrote the spec last",
			by: "user alice", lose: true,
			kind: KindShrunk, code: CodeNodeLost,
			wantInText: []string{"node(s) lost"}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			e := newEnv(t, mkNodes("n", 2, 8), []Team{mkTeam("a", 16)}, job("a1", "a", 50, 1, 2, true))
			if d := e.cycle(); size(d, "a1") != 2 {
				t.Fatalf("a1 size %d, want 2", size(d, "a1"))
			}
			e.st.Jobs[0].RequestedBy = tc.by
			if tc.change != nil {
				tc.change(&e.st.Jobs[0])
			}
			if tc.lose {
				e.st.Nodes[1].Unhealthy = true
			}
			r := wantKind(t, e.cycle(), "a1", tc.kind, tc.code)
			if r.RequestedBy != tc.wantBy {
				t.Errorf("requestedBy %q, want %q", r.RequestedBy, tc.wantBy)
			}
			for _, w := range tc.wantInText {
				if !strings.Contains(r.Message, w) {
					t.Errorf("message %q lacks %q", r.Message, w)
				}
			}
			if tc.code == CodeSpecChanged && strings.Contains(r.Message, "no replacement free") {
				t.Errorf("message %q blames lost nodes", r.Message)
			}
		})
	}
}

func TestSpecChanged(t *testing.T) {
	for _, tc := range []struct{ rule, by, want string }{
		{"no writer named", "", "spec changed"},
		{"the writer named", "etcd user research", "spec changed by etcd user research"},
	} {
		if got := specChanged(tc.by); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.rule, got, tc.want)
		}
	}
}

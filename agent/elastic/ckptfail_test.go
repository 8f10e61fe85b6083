package elastic

import "testing"

func TestLostSteps(t *testing.T) {
	for _, tc := range []struct {
		rule              string
		failed, committed int64
		want              string
	}{
		{"nothing committed: from step 0", 12, -1, "the job restarts from step 0: 12 steps lost"},
		{"steps after the last commit are lost", 12, 10, "the job resumes from step 10, the last committed checkpoint: 2 steps lost"},
		{"the failed step is committed already: nothing lost", 10, 10, "step 10 is committed already: no step lost"},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := lostSteps(tc.failed, tc.committed); got != tc.want {
				t.Errorf("lostSteps(%d, %d) = %q, want %q", tc.failed, tc.committed, got, tc.want)
			}
		})
	}
}

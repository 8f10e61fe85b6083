package jobrunner

import "testing"

// judgeFailure's rules: the restart budget is launcher.BudgetSpent, on the
// job's global count and on this node's consecutive failures alike.
func TestJudgeFailure(t *testing.T) {
	for _, tc := range []struct {
		rule         string
		global       int64
		known        bool
		nodeFailures int
		max          int
		want         string
	}{
		{"restart: within the budget on both counts", 2, true, 2, 3, ruleRestart},
		{"budget-spent: the job's count passed maxRestarts", 4, true, 1, 3, ruleBudgetSpent},
		{"restart: the job's count at maxRestarts is not spent", 3, true, 1, 3, ruleRestart},
		{"budget-spent wins over crash-loop", 4, true, 4, 3, ruleBudgetSpent},
		{"crash-loop: more failures in a row than maxRestarts", 0, true, 4, 3, ruleCrashLoop},
		{"crash-loop: an unknown global count still ends a crash loop", 9, false, 4, 3, ruleCrashLoop},
		{"restart: an unknown global count is not judged", 9, false, 1, 3, ruleRestart},
		{"budget of zero: the first failure in a row fails the job", 0, true, 1, 0, ruleCrashLoop},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := judgeFailure(tc.global, tc.known, tc.nodeFailures, tc.max); got != tc.want {
				t.Errorf("judgeFailure(%d, %v, %d, %d) = %s, want %s", tc.global, tc.known, tc.nodeFailures, tc.max, got, tc.want)
			}
		})
	}
}

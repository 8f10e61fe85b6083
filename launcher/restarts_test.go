package launcher

import "testing"

func TestBudgetSpent(t *testing.T) {
	for _, tc := range []struct {
		rule            string
		failures, limit int
		want            bool
	}{
		{"no failure never spends the budget", 0, 0, false},
		{"a budget of zero ends the job at its first failure", 1, 0, true},
		{"failures up to the budget restart", 3, 3, false},
		{"the failure after the last restart ends the job", 4, 3, true},
		{"well past the budget stays spent", 10, 3, true},
		{"a negative budget allows no restart", 1, -1, true},
		{"a negative budget with no failure is not spent", 0, -1, false},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := BudgetSpent(tc.failures, tc.limit); got != tc.want {
				t.Errorf("BudgetSpent(%d, %d) = %v, want %v", tc.failures, tc.limit, got, tc.want)
			}
		})
	}
}

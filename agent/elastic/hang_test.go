package elastic

import (
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
)

func TestHungWorkers(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	beat := func(rank int, ago time.Duration) control.Heartbeat {
		return control.Heartbeat{Rank: rank, PID: 100 + rank, First: t0.Add(-time.Hour), Last: t0.Add(-ago)}
	}
	for _, tc := range []struct {
		rule  string
		view  hangView
		ranks []int
	}{
		{ruleHangDisabled, hangView{Timeout: 0, Now: t0, Beats: []control.Heartbeat{beat(0, time.Hour)}}, nil},
		{ruleHangPlanned, hangView{Timeout: time.Minute, Now: t0, Planned: true, Beats: []control.Heartbeat{beat(0, time.Hour)}}, nil},
		{ruleHangNoHeartbeat, hangView{Timeout: time.Minute, Now: t0}, nil},
		{ruleHangProgressing, hangView{Timeout: time.Minute, Now: t0, Beats: []control.Heartbeat{beat(0, 59*time.Second), beat(1, 0)}}, nil},
		{ruleHangHung, hangView{Timeout: time.Minute, Now: t0, Beats: []control.Heartbeat{beat(0, time.Second), beat(1, time.Minute), beat(2, time.Hour)}}, []int{1, 2}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			v := hungWorkers(tc.view)
			if v.Rule != tc.rule {
				t.Errorf("rule %q, want %q", v.Rule, tc.rule)
			}
			var ranks []int
			for _, h := range v.Hung {
				ranks = append(ranks, h.Rank)
			}
			if len(ranks) != len(tc.ranks) {
				t.Fatalf("hung ranks %v, want %v", ranks, tc.ranks)
			}
			for i := range ranks {
				if ranks[i] != tc.ranks[i] {
					t.Fatalf("hung ranks %v, want %v", ranks, tc.ranks)
				}
			}
		})
	}
}

func TestStalledWorkersAreDumpedWhenTheRoundFailsElsewhere(t *testing.T) {
	t0 := time.Now()
	beats := func(ago time.Duration) []control.Heartbeat { return []control.Heartbeat{{Rank: 1, Last: t0.Add(-ago)}} }
	for _, tc := range []struct {
		name string
		view hangView
		want bool
	}{
		{"stuck for half the timeout: dumped", hangView{Timeout: 10 * time.Second, Now: t0, Beats: beats(5 * time.Second)}, true},
		{"progressing: not dumped (a node lost, not a hang)", hangView{Timeout: 10 * time.Second, Now: t0, Beats: beats(time.Second)}, false},
		{"disabled: never", hangView{Now: t0, Beats: beats(time.Hour)}, false},
		{"planned: never", hangView{Timeout: time.Second, Now: t0, Planned: true, Beats: beats(time.Hour)}, false},
		{"no heartbeat: nothing to dump", hangView{Timeout: time.Second, Now: t0}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stalled(tc.view); got != tc.want {
				t.Errorf("stalled = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestHeartbeatIntervalAndPollBounds(t *testing.T) {
	for _, tc := range []struct {
		timeout, interval, poll time.Duration
	}{
		{DefaultHangTimeout, 30 * time.Second, 5 * time.Second},
		{5 * time.Second, 500 * time.Millisecond, 250 * time.Millisecond},
		{100 * time.Millisecond, 50 * time.Millisecond, 20 * time.Millisecond},
	} {
		if got := heartbeatInterval(tc.timeout); got != tc.interval {
			t.Errorf("heartbeatInterval(%s) = %s, want %s", tc.timeout, got, tc.interval)
		}
		if got := hangPoll(tc.timeout); got != tc.poll {
			t.Errorf("hangPoll(%s) = %s, want %s", tc.timeout, got, tc.poll)
		}
		if heartbeatInterval(tc.timeout) >= tc.timeout && tc.timeout > 100*time.Millisecond {
			t.Errorf("heartbeat interval %s not below the timeout %s", heartbeatInterval(tc.timeout), tc.timeout)
		}
	}
}

package elastic

import (
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/checkpoint/control"
)

func TestHungWorkers(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	beat := func(rank int, ago time.Duration) control.Heartbeat {
		return control.Heartbeat{Rank: rank, PID: 100 + rank, First: t0.Add(-time.Hour), Last: t0.Add(-ago)}
	}
	// silent is a live worker with no heartbeat this round; known: the
	// worker of its local rank sent heartbeats in an earlier round.
	type worker any
	silent := func(rank int, known bool) worker {
		return silentWorker{PID: 100 + rank, Rank: rank, LocalRank: rank, Known: known}
	}
	// startup is a round started ago, under --hang-timeout and
	// --hang-startup-timeout of a minute, with these workers.
	startup := func(ago time.Duration, ws ...worker) hangView {
		v := hangView{Timeout: time.Minute, StartupTimeout: time.Minute, Now: t0, Started: t0.Add(-ago)}
		for _, w := range ws {
			switch w := w.(type) {
			case silentWorker:
				v.Silent = append(v.Silent, w)
			case control.Heartbeat:
				v.Beats = append(v.Beats, w)
			}
		}
		return v
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
		// Start-up (--hang-startup-timeout): a worker with no heartbeat yet.
		{ruleHangNoHeartbeat, startup(time.Hour, silent(3, false)), nil},
		{ruleHangProgressing, startup(time.Hour, silent(3, false), beat(0, 0)), nil},
		{ruleStartupOff, func() hangView { v := startup(time.Hour, silent(3, true)); v.StartupTimeout = 0; return v }(), nil},
		{ruleStartupStarting, startup(59*time.Second, silent(3, true), beat(0, 0)), nil},
		{ruleStartupHung, startup(time.Minute, silent(3, true), silent(4, false), beat(0, 0)), []int{3}},
		{ruleHangHung, startup(time.Hour, silent(3, true), beat(0, time.Minute)), []int{0}},
		{ruleHangPlanned, func() hangView { v := startup(time.Hour, silent(3, true)); v.Planned = true; return v }(), nil},
		{ruleHangDisabled, func() hangView { v := startup(time.Hour, silent(3, true)); v.Timeout = 0; return v }(), nil},
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

// TestHangDetailNamesTheTimeoutThatFoundIt: the log line and the job's
// failure record say which flag to raise.
func TestHangDetailNamesTheTimeoutThatFoundIt(t *testing.T) {
	o := Options{HangTimeout: time.Minute, HangStartupTimeout: 2 * time.Minute}
	hung := []control.Heartbeat{{Rank: 3, PID: 103}}
	if got := hangDetail(hangVerdict{Hung: hung, Rule: ruleStartupHung}, o); !strings.Contains(got, "rank 3") || !strings.Contains(got, "2m0s") || !strings.Contains(got, "--hang-startup-timeout") {
		t.Errorf("start-up hang detail %q: want rank 3, 2m0s and --hang-startup-timeout", got)
	}
	if got := hangDetail(hangVerdict{Hung: hung, Rule: ruleHangHung}, o); !strings.Contains(got, "1m0s") || !strings.Contains(got, "(--hang-timeout)") {
		t.Errorf("hang detail %q: want 1m0s and --hang-timeout", got)
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
		{"silent at start-up for half the start-up timeout, known to call the helper: dumped", hangView{Timeout: time.Hour, StartupTimeout: 10 * time.Second,
			Now: t0, Started: t0.Add(-5 * time.Second), Silent: []silentWorker{{PID: 7, Known: true}}}, true},
		{"silent at start-up, not known to call the helper: not dumped", hangView{Timeout: time.Hour, StartupTimeout: 10 * time.Second,
			Now: t0, Started: t0.Add(-time.Hour), Silent: []silentWorker{{PID: 7}}}, false},
		{"silent for less than half the start-up timeout: not dumped", hangView{Timeout: time.Hour, StartupTimeout: 10 * time.Second,
			Now: t0, Started: t0.Add(-4 * time.Second), Silent: []silentWorker{{PID: 7, Known: true}}}, false},
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
		if got := hangWatchEvery(Options{HangTimeout: DefaultHangTimeout, HangStartupTimeout: tc.timeout}); got != min(tc.poll, hangPoll(DefaultHangTimeout)) {
			t.Errorf("watch period under --hang-startup-timeout %s = %s, want %s (the shorter timeout's)", tc.timeout, got, tc.poll)
		}
		if heartbeatInterval(tc.timeout) >= tc.timeout && tc.timeout > 100*time.Millisecond {
			t.Errorf("heartbeat interval %s not below the timeout %s", heartbeatInterval(tc.timeout), tc.timeout)
		}
	}
}

package control

import (
	"context"
	"time"
)

// What a worker does after a failed save (issue 24): the agent answers a
// ReportCheckpointFailed with an Advice, which the Python helper's
// save_and_commit follows on every rank (the ranks agree on the strongest
// advice any of them got: retry over go_on over raise):
//
//	{"ok":true}                                        raise the save's error (the default)
//	{"ok":true,"advice":"retry","retry_after_s":1.0}   save the same step again after the pause
//	{"ok":true,"advice":"go_on"}                       return False (not committed) and go on:
//	                                                   in-process workers keep their state in
//	                                                   memory and reconfigure() without it
//
// An agent that gives no advice (an older one) keeps the old behaviour.

// AdviceAction is what the agent tells a worker whose save failed.
type AdviceAction string

const (
	// AdviceRaise: the save's error stands (the worker raises it).
	AdviceRaise AdviceAction = ""
	// AdviceRetry: save the same step again after Advice.RetryAfter.
	AdviceRetry AdviceAction = "retry"
	// AdviceGoOn: do not raise; the step is not committed and the workers
	// go on without it (in process: they keep their state in memory).
	AdviceGoOn AdviceAction = "go_on"
)

// Advice answers a ReportCheckpointFailed.
type Advice struct {
	Action AdviceAction
	// RetryAfter is the pause before the next try (AdviceRetry).
	RetryAfter time.Duration
}

// Advisor decides the Advice for a believed ReportCheckpointFailed, after
// the Channel's handler accepted it. It may be called concurrently.
type Advisor func(r Report) Advice

// WithAdvisor makes the Channel answer every accepted checkpoint_failed
// report with a's advice (without it: AdviceRaise).
func WithAdvisor(a Advisor) Option { return func(c *Channel) { c.advisor = a } }

// advise fills a's advice for report r (a checkpoint_failed one).
func (c *Channel) advise(r Report, a *ack) {
	if c.advisor == nil || r.Type != ReportCheckpointFailed {
		return
	}
	adv := c.advisor(r)
	a.Advice = string(adv.Action)
	if adv.Action == AdviceRetry {
		a.RetryAfter = adv.RetryAfter.Seconds()
	}
}

// SendCheckpointFailed sends a ReportCheckpointFailed and returns the
// agent's advice: the Go workers' side of save_and_commit's failure path.
func SendCheckpointFailed(ctx context.Context, socketPath string, r Report) (Advice, error) {
	r.Type = ReportCheckpointFailed
	a, err := exchange(ctx, socketPath, r)
	if err != nil {
		return Advice{}, err
	}
	return Advice{Action: AdviceAction(a.Advice), RetryAfter: time.Duration(a.RetryAfter * float64(time.Second))}, nil
}

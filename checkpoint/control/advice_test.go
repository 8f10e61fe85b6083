package control

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A worker whose save failed is told what to do: the advisor's answer
// reaches it (retry with its pause, go on), only for checkpoint_failed
// reports the handler accepted; without an advisor the error stands.
func TestFailedSaveGetsTheAgentsAdvice(t *testing.T) {
	ch := newTestChannel(t, WithHandler(func(ctx context.Context, r Report) error {
		if r.Step == 99 {
			return errors.New("refused")
		}
		return nil
	}), WithAdvisor(func(r Report) Advice {
		if r.Step == 1 {
			return Advice{Action: AdviceRetry, RetryAfter: 1500 * time.Millisecond}
		}
		return Advice{Action: AdviceGoOn, RetryAfter: time.Second}
	}))
	ctx := testCtx(t, 10*time.Second)
	sock := ch.SocketPath()
	if a, err := SendCheckpointFailed(ctx, sock, Report{Step: 1, Error: "OSError: full"}); err != nil || a != (Advice{Action: AdviceRetry, RetryAfter: 1500 * time.Millisecond}) {
		t.Errorf("step 1: advice %+v, %v; want a retry after 1.5s", a, err)
	}
	if a, err := SendCheckpointFailed(ctx, sock, Report{Step: 2, Error: "OSError: full"}); err != nil || a != (Advice{Action: AdviceGoOn}) {
		t.Errorf("step 2: advice %+v, %v; want go_on (no pause)", a, err)
	}
	if _, err := SendCheckpointFailed(ctx, sock, Report{Step: 99}); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("a refused report: %v, want the handler's error", err)
	}

	plain := newTestChannel(t, WithHandler(func(ctx context.Context, r Report) error { return nil }))
	if a, err := SendCheckpointFailed(ctx, plain.SocketPath(), Report{Step: 1}); err != nil || a.Action != AdviceRaise {
		t.Errorf("no advisor: advice %+v, %v; want the error to stand", a, err)
	}
}

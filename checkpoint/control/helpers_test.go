package control

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// helperEnv makes the test binary run a helper (a worker) instead of the
// tests.
const helperEnv = "HYPERPODRUN_CONTROL_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		err := fmt.Errorf("unknown helper mode %q", mode)
		if mode == "reporter" {
			err = helperReporter()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helperReporter is a worker that reports a checkpoint (step $STEP) to
// $HYPERPODRUN_CONTROL_SOCKET and exits 0 when the agent acknowledged it.
func helperReporter() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var step int64
	fmt.Sscan(os.Getenv("STEP"), &step)
	return SendReport(ctx, os.Getenv(EnvControlSocket), Report{Type: ReportCheckpoint, Step: step, Path: fmt.Sprintf("/ckpt/%d", step)})
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// noChannelGoroutines fails if goroutines of a Channel are still running.
func noChannelGoroutines(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	testutil.Eventually(t, 5*time.Second, "Channel goroutines to end after Close", func() (bool, string) {
		stacks := string(buf[:runtime.Stack(buf, true)])
		return !strings.Contains(stacks, "control.(*Channel)"), stacks
	})
}

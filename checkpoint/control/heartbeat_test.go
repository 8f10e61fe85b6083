package control

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"
)

// TestHeartbeatIsRecordedWhileTheHandlerIsBusy: a worker's heartbeat is
// acknowledged and recorded even while a checkpoint report waits in the
// handler (a slow etcd commit must not look like a hung worker), it is
// never given to the handler, and a new round forgets it.
func TestHeartbeatIsRecordedWhileTheHandlerIsBusy(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{})
	var mu sync.Mutex
	var handled []string
	ch := newTestChannel(t, WithHandler(func(ctx context.Context, r Report) error {
		mu.Lock()
		handled = append(handled, r.Type)
		mu.Unlock()
		if r.Type == ReportCheckpoint {
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	}))
	ctx := testCtx(t, 10*time.Second)
	done := make(chan error, 1)
	go func() { done <- SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 1, Path: "/p"}) }()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("handler never called")
	}
	if err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportHeartbeat, Rank: 3, Stacks: "/logs/stacks_rank3.txt"}); err != nil {
		t.Fatalf("heartbeat while the handler is busy: %v", err)
	}
	if err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportHeartbeat, Rank: 3, Stacks: "/logs/stacks_rank3.txt"}); err != nil {
		t.Fatalf("second heartbeat: %v", err)
	}
	beats := ch.Heartbeats()
	if len(beats) != 1 || beats[0].Rank != 3 || beats[0].PID != os.Getpid() || beats[0].Count != 2 ||
		beats[0].Stacks != "/logs/stacks_rank3.txt" || beats[0].Last.Before(beats[0].First) {
		t.Fatalf("Heartbeats() = %+v, want one of rank 3 from this process, 2 beats, with its stacks file", beats)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, typ := range handled {
		if typ == ReportHeartbeat {
			t.Fatalf("the handler was given a heartbeat: %v", handled)
		}
	}
	ch.SetRound(0)
	if beats := ch.Heartbeats(); len(beats) != 0 {
		t.Fatalf("after SetRound: Heartbeats() = %+v, want none", beats)
	}
}

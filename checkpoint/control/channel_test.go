package control

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func newTestChannel(t *testing.T, opts ...Option) *Channel {
	t.Helper()
	ch, err := NewChannel(filepath.Join(t.TempDir(), "ctl"), opts...)
	if err != nil {
		t.Fatalf("NewChannel: %v", err)
	}
	t.Cleanup(func() { ch.Close() })
	return ch
}

func TestChannelEnvPointsAtSocketAndEventFile(t *testing.T) {
	ch := newTestChannel(t)
	env := ch.Env()
	if env[EnvControlDir] != ch.Dir() || !filepath.IsAbs(ch.Dir()) {
		t.Fatalf("%s = %q, want absolute %q", EnvControlDir, env[EnvControlDir], ch.Dir())
	}
	fi, err := os.Stat(env[EnvControlSocket])
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("%s = %q is not a socket (err %v)", EnvControlSocket, env[EnvControlSocket], err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	if env[EnvEventFile] != filepath.Join(ch.Dir(), EventFileName) {
		t.Errorf("%s = %q", EnvEventFile, env[EnvEventFile])
	}
}

func TestAnnounceWritesEventFileWorkersCanRead(t *testing.T) {
	ch := newTestChannel(t)
	if ev, err := ReadEvent(ch.EventPath()); err != nil || ev != nil {
		t.Fatalf("before any announcement: %v, %v; want nil, nil", ev, err)
	}
	deadline := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	in := Event{Kind: ScaleDown, NewWorldSize: 2, Deadline: deadline, Round: 7, TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	if err := ch.Announce(in); err != nil {
		t.Fatalf("Announce: %v", err)
	}
	ev, err := ReadEvent(ch.EventPath())
	if err != nil || ev == nil {
		t.Fatalf("ReadEvent: %v, %v", ev, err)
	}
	if ev.Kind != ScaleDown || ev.NewWorldSize != 2 || !ev.Deadline.Equal(deadline) || ev.Round != 7 || ev.TraceParent != in.TraceParent || ev.Seq != 1 {
		t.Fatalf("read back %+v, want %+v with seq 1", ev, in)
	}
	// The raw file is what the Python helper reads.
	raw, err := os.ReadFile(ch.EventPath())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("event.json is not JSON: %v\n%s", err, raw)
	}
	for k, want := range map[string]any{"kind": "scale_down", "new_world_size": 2.0, "round": 7.0, "seq": 1.0, "deadline_unix": float64(deadline.Unix())} {
		if m[k] != want {
			t.Errorf("event.json %s = %v, want %v", k, m[k], want)
		}
	}
	if _, ok := m["reason"]; ok {
		t.Errorf("event.json has a reason though none was given: %s", raw)
	}
	if err := ch.Announce(Event{Kind: Preemption, Reason: "preempted by higher-priority j2"}); err != nil {
		t.Fatal(err)
	}
	if ev, _ := ReadEvent(ch.EventPath()); ev == nil || ev.Seq != 2 || ev.Kind != Preemption || !ev.Deadline.IsZero() || ev.Reason != "preempted by higher-priority j2" {
		t.Fatalf("second announcement read back as %+v", ev)
	}
	if err := ch.ClearEvent(); err != nil {
		t.Fatalf("ClearEvent: %v", err)
	}
	if ev, err := ReadEvent(ch.EventPath()); err != nil || ev != nil {
		t.Fatalf("after ClearEvent: %v, %v", ev, err)
	}
	if err := ch.ClearEvent(); err != nil {
		t.Fatalf("ClearEvent twice: %v", err)
	}
}

func TestAnnounceRejectsBadEvents(t *testing.T) {
	ch := newTestChannel(t)
	for _, ev := range []Event{{}, {Kind: Resize, NewWorldSize: -1}, {Kind: Resize, Round: -3}} {
		if err := ch.Announce(ev); err == nil {
			t.Errorf("Announce(%+v) succeeded", ev)
		}
	}
	if _, err := os.Stat(ch.EventPath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused event left %s behind (%v)", ch.EventPath(), err)
	}
}

// A worker reading event.json while the agent replaces it never sees a
// partial file.
func TestAnnounceIsAtomicForConcurrentReaders(t *testing.T) {
	ch := newTestChannel(t)
	long := strings.Repeat("x", 64<<10) // makes a torn write likely if not atomic
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads, bad int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			data, err := os.ReadFile(ch.EventPath())
			if err != nil {
				continue
			}
			reads++
			var f eventFile
			if json.Unmarshal(data, &f) != nil || f.TraceParent != long {
				bad++
			}
		}
	}()
	for i := 0; i < 200; i++ {
		if err := ch.Announce(Event{Kind: Resize, NewWorldSize: i, TraceParent: long}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if bad > 0 {
		t.Fatalf("%d of %d reads saw a partial event file", bad, reads)
	}
}

func TestReportsDeliveredAndAcknowledged(t *testing.T) {
	ch := newTestChannel(t)
	ctx := testCtx(t, 10*time.Second)
	sent := []Report{
		{Type: ReportCheckpoint, Step: 120, Path: "/ckpt/step-120", Rank: 0, WorldSize: 3},
		{Type: ReportStopping, Step: 120, Rank: 2, WorldSize: 3},
		{Type: "progress", Step: 121, Rank: 1},
	}
	for _, r := range sent {
		if err := SendReport(ctx, ch.SocketPath(), r); err != nil {
			t.Fatalf("SendReport(%+v): %v", r, err)
		}
	}
	// SendReport returned, so each report is already queued.
	for _, want := range sent {
		select {
		case got := <-ch.Reports():
			if got.Type != want.Type || got.Step != want.Step || got.Path != want.Path || got.Rank != want.Rank || got.WorldSize != want.WorldSize {
				t.Fatalf("got %+v, want %+v", got, want)
			}
			if got.PID != os.Getpid() || got.Received.IsZero() || len(got.Raw) == 0 {
				t.Fatalf("report lacks pid/received/raw: %+v", got)
			}
		default:
			t.Fatalf("report %+v acknowledged but not queued", want)
		}
	}
}

// rawExchange sends lines over one connection and returns the replies.
func rawExchange(t *testing.T, sock string, lines ...string) []ack {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	rd := bufio.NewReader(conn)
	var out []ack
	for _, l := range lines {
		if _, err := conn.Write([]byte(l + "\n")); err != nil {
			t.Fatal(err)
		}
		reply, err := rd.ReadBytes('\n')
		if err != nil {
			t.Fatalf("no reply to %q: %v", l, err)
		}
		var a ack
		if err := json.Unmarshal(reply, &a); err != nil {
			t.Fatalf("reply %q: %v", reply, err)
		}
		out = append(out, a)
	}
	return out
}

func TestMalformedMessagesAreRefusedAndConnectionSurvives(t *testing.T) {
	ch := newTestChannel(t)
	acks := rawExchange(t, ch.SocketPath(),
		`not json`,
		`{"step":3}`,
		`{"type":"checkpoint","step":3}`,
		`{"type":"checkpoint","step":-1,"path":"/x"}`,
		`{"type":"checkpoint","step":"3","path":"/x"}`,
		`{"type":"checkpoint","step":3,"path":"/ckpt/3","rank":0}`,
	)
	for i, a := range acks[:5] {
		if a.OK || a.Error == "" {
			t.Errorf("message %d: got %+v, want a refusal with a reason", i, a)
		}
	}
	if !acks[5].OK {
		t.Fatalf("valid message after refusals: %+v", acks[5])
	}
	if got := <-ch.Reports(); got.Step != 3 || got.Path != "/ckpt/3" {
		t.Fatalf("got %+v", got)
	}
	select {
	case r := <-ch.Reports():
		t.Fatalf("refused message was delivered: %+v", r)
	default:
	}
}

func TestOverlongMessageIsRefused(t *testing.T) {
	ch := newTestChannel(t)
	conn, err := net.Dial("unix", ch.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	go conn.Write([]byte(`{"type":"x","path":"` + strings.Repeat("a", maxMessage+10) + "\"}\n"))
	reply, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	var a ack
	if json.Unmarshal(reply, &a) != nil || a.OK {
		t.Fatalf("reply %q, want a refusal", reply)
	}
}

func TestHandlerErrorReachesWorker(t *testing.T) {
	ch := newTestChannel(t, WithHandler(func(ctx context.Context, r Report) error {
		if r.Step < 10 {
			return errors.New("step too old")
		}
		return nil
	}))
	ctx := testCtx(t, 10*time.Second)
	err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 5, Path: "/p"})
	if err == nil || !strings.Contains(err.Error(), "step too old") {
		t.Fatalf("SendReport = %v, want the handler's error", err)
	}
	if err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 10, Path: "/p"}); err != nil {
		t.Fatalf("SendReport: %v", err)
	}
}

// The worker's acknowledgement waits for the handler (e.g. the etcd commit).
func TestAcknowledgementWaitsForHandler(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{})
	ch := newTestChannel(t, WithHandler(func(ctx context.Context, r Report) error {
		close(entered)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	ctx := testCtx(t, 10*time.Second)
	done := make(chan error, 1)
	go func() { done <- SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 1, Path: "/p"}) }()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("handler never called")
	}
	select {
	case err := <-done:
		t.Fatalf("SendReport returned (%v) before the handler finished", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("SendReport: %v", err)
	}
}

func TestCloseStopsEverything(t *testing.T) {
	entered := make(chan struct{})
	ch, err := NewChannel(filepath.Join(t.TempDir(), "ctl"), WithHandler(func(ctx context.Context, r Report) error {
		close(entered)
		<-ctx.Done() // a handler stuck until Close
		return ctx.Err()
	}))
	if err != nil {
		t.Fatal(err)
	}
	// An idle open connection and one stuck in the handler.
	idle, err := net.Dial("unix", ch.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	ctx := testCtx(t, 10*time.Second)
	sendErr := make(chan error, 1)
	go func() {
		sendErr <- SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 1, Path: "/p"})
	}()
	<-entered
	if err := ch.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-sendErr; err == nil {
		t.Fatal("report interrupted by Close was acknowledged")
	}
	if _, err := os.Stat(ch.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket still there after Close: %v", err)
	}
	if _, ok := <-ch.Reports(); ok {
		t.Fatal("Reports not closed")
	}
	if err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportStopping}); err == nil {
		t.Fatal("SendReport after Close succeeded")
	}
	if err := ch.Announce(Event{Kind: Resize}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Announce after Close = %v, want ErrClosed", err)
	}
	if err := ch.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	noChannelGoroutines(t)
}

func TestCloseWithUnreadReports(t *testing.T) {
	ch, err := NewChannel(filepath.Join(t.TempDir(), "ctl"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 10*time.Second)
	if err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportStopping, Step: 1}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	// Queued reports stay readable, then the channel ends.
	if r, ok := <-ch.Reports(); !ok || r.Type != ReportStopping {
		t.Fatalf("queued report lost: %+v %v", r, ok)
	}
	if _, ok := <-ch.Reports(); ok {
		t.Fatal("Reports not closed")
	}
	noChannelGoroutines(t)
}

func TestNewChannelReplacesStaleSocket(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ctl")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A socket left behind by an agent that died.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, SocketName), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	ch, err := NewChannel(dir)
	if err != nil {
		t.Fatalf("NewChannel over a stale socket: %v", err)
	}
	defer ch.Close()
	if err := SendReport(testCtx(t, 10*time.Second), ch.SocketPath(), Report{Type: ReportStopping}); err != nil {
		t.Fatalf("SendReport: %v", err)
	}
}

func TestNewChannelRefusesBadPaths(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, SocketName), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if ch, err := NewChannel(dir); err == nil {
		ch.Close()
		t.Fatal("NewChannel replaced a regular file named control.sock")
	}
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
	if ch, err := NewChannel(long); err == nil {
		ch.Close()
		t.Fatal("NewChannel accepted a socket path too long for sun_path")
	} else if !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("unclear error for a long path: %v", err)
	}
}

// reportFromWorker runs a worker process (in a process group of its own,
// as the launcher starts workers) that reports a checkpoint at step on ch.
// started is called with its pid right after it started, as the agent
// admits a worker right after spawning it. It returns the worker's error
// output, empty when its report was acknowledged.
func reportFromWorker(t *testing.T, ch *Channel, step int, started func(pid int)) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=reporter", EnvControlSocket+"="+ch.SocketPath(), EnvControlToken+"="+ch.Token(), fmt.Sprintf("STEP=%d", step))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if started != nil {
		started(cmd.Process.Pid)
	}
	if err := cmd.Wait(); err != nil {
		if stderr.Len() == 0 {
			t.Fatalf("worker: %v", err)
		}
		return stderr.String()
	}
	return ""
}

// TestChannelBelievesOnlyWorkersOfTheCurrentRound: once the agent tracks
// rounds, a report is accepted only from a process group admitted for the
// current round; a worker of an earlier round (its agent was frozen, its
// lease expired, a new round runs) is refused, so its rank 0 cannot commit
// a checkpoint over the new round's.
func TestChannelBelievesOnlyWorkersOfTheCurrentRound(t *testing.T) {
	ch := newTestChannel(t)
	ch.SetRound(3)
	// A worker of round 3, admitted when it started: believed, and its
	// report carries its round.
	if out := reportFromWorker(t, ch, 30, func(pid int) { ch.Admit(3, pid, 0) }); out != "" {
		t.Fatalf("report of a worker of the current round refused: %s", out)
	}
	select {
	case r := <-ch.Reports():
		if r.Step != 30 || r.Round != 3 || r.PeerPID <= 0 {
			t.Fatalf("accepted report %+v, want step 30 of round 3 with its sender's pid", r)
		}
	default:
		t.Fatal("acknowledged report not delivered")
	}

	// Round 3's worker, still alive when round 4 began, reports again.
	old := exec.Command(os.Args[0], "-test.run=^$")
	old.Env = append(os.Environ(), helperEnv+"=reporter", EnvControlSocket+"="+ch.SocketPath(), EnvControlToken+"="+ch.Token(), "STEP=50")
	old.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var oldErr strings.Builder
	old.Stderr = &oldErr
	ch.SetRound(4)
	ch.Admit(3, 12345, 0) // an admission for a round that is over is ignored
	start := time.Now()
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	ch.Admit(3, old.Process.Pid, 0)
	if err := old.Wait(); err == nil {
		t.Fatal("a worker of round 3 had its report accepted in round 4")
	}
	if !strings.Contains(oldErr.String(), ErrStaleRound.Error()) || !strings.Contains(oldErr.String(), "round 4") {
		t.Errorf("refusal %q does not say the sender is not a worker of round 4", oldErr.String())
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("refusal took %s", took)
	}
	select {
	case r := <-ch.Reports():
		t.Fatalf("stale report delivered: %+v", r)
	default:
	}

	// A worker of round 4 admitted a little after it connected (the agent
	// admits it once it is spawned) is believed.
	if out := reportFromWorker(t, ch, 40, func(pid int) {
		go func() { time.Sleep(200 * time.Millisecond); ch.Admit(4, pid, 0) }()
	}); out != "" {
		t.Fatalf("report of a worker admitted late refused: %s", out)
	}
	if r := <-ch.Reports(); r.Round != 4 || r.Step != 40 {
		t.Fatalf("accepted %+v, want step 40 of round 4", r)
	}

	// A report naming another round than the current one is refused, even
	// from an admitted process group.
	ch.Admit(4, syscall.Getpgrp(), 0)
	ctx := testCtx(t, 10*time.Second)
	err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 60, Path: "/c/60", Round: 3, Token: ch.Token()})
	if err == nil || !strings.Contains(err.Error(), "the report is of round 3, the current round is 4") {
		t.Fatalf("report naming round 3 in round 4 = %v, want a refusal", err)
	}
	if err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 61, Path: "/c/61", Round: 4, Token: ch.Token()}); err != nil {
		t.Fatalf("report naming the current round: %v", err)
	}
	<-ch.Reports()

	// No round current (fenced, or between rounds): nobody is believed.
	ch.SetRound(0)
	ch.Admit(0, syscall.Getpgrp(), 0)
	if err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 70, Path: "/c/70"}); err == nil || !strings.Contains(err.Error(), "no round is current") {
		t.Fatalf("report with no round current = %v, want a refusal", err)
	}
}

// Issue 11's attacks on the control channel: a process of the same user
// outside the job sends {"type":"checkpoint","step":9223372036854775807,
// "path":"/tmp/evil"}; an admitted worker sends a report without the
// round's token, or naming another rank. Each is refused with a clear
// error, and the real worker's report is accepted afterwards.
func TestChannelRefusesForgedReports(t *testing.T) {
	ch := newTestChannel(t)
	ch.SetRound(7)
	ctx := testCtx(t, 20*time.Second)
	// The exact forged message, from this (unadmitted) test process.
	conn, err := net.Dial("unix", ch.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte(`{"type":"checkpoint","step":9223372036854775807,"path":"/tmp/evil"}` + "\n"))
	reply, _ := bufio.NewReader(conn).ReadString('\n')
	conn.Close()
	if !strings.Contains(reply, "implausible checkpoint message: step 9223372036854775807") {
		t.Errorf("the forged step is not refused as implausible: %s", reply)
	}
	err = SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 100, Path: "/tmp/evil", Token: ch.Token()})
	if !errors.Is(err, ErrStaleRound) && (err == nil || !strings.Contains(err.Error(), "is not a worker of round 7")) {
		t.Errorf("a report from a process outside the job = %v, want refused as not a worker of round 7", err)
	}
	// An admitted process without the token, and with it but another rank.
	ch.Admit(7, syscall.Getpgrp(), 3)
	err = SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 100, Path: "/tmp/evil", Rank: 3, Token: "guess"})
	if err == nil || !strings.Contains(err.Error(), "no or a wrong control token") {
		t.Errorf("a report with a wrong token = %v, want refused", err)
	}
	err = SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 100, Path: "/tmp/evil", Rank: 0, Token: ch.Token()})
	if err == nil || !strings.Contains(err.Error(), "is the worker of rank 3, and its report names rank 0") {
		t.Errorf("a report naming another rank = %v, want refused", err)
	}
	select {
	case r := <-ch.Reports():
		t.Fatalf("a forged report was delivered: %+v", r)
	default:
	}
	// The job goes on: its worker's real report is accepted.
	if err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 100, Path: "/ckpt/100", Rank: 3, Token: ch.Token()}); err != nil {
		t.Fatalf("the real report after the attacks: %v", err)
	}
	if r := <-ch.Reports(); r.Step != 100 || r.Path != "/ckpt/100" || r.Round != 7 {
		t.Fatalf("accepted %+v", r)
	}
	// Not beyond the step the workers announced they stop after.
	if err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportStopping, Step: 120, Rank: 3, Token: ch.Token()}); err != nil {
		t.Fatal(err)
	}
	<-ch.Reports()
	err = SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 500, Path: "/tmp/evil", Rank: 3, Token: ch.Token()})
	if err == nil || !strings.Contains(err.Error(), "step 500 is beyond step 120, after which this round's workers said they stop") {
		t.Errorf("a checkpoint beyond the announced stop = %v, want refused", err)
	}
	if err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 120, Path: "/ckpt/120", Rank: 3, Token: ch.Token()}); err != nil {
		t.Fatalf("the checkpoint at the announced step: %v", err)
	}
	<-ch.Reports()
	// A new round, a new token: the old one is worthless.
	old := ch.Token()
	ch.SetRound(8)
	if ch.Token() == old {
		t.Error("the control token did not change with the round")
	}
	if env := ch.Env(); env[EnvControlToken] != ch.Token() {
		t.Errorf("Env gives token %q, want the round's %q", env[EnvControlToken], ch.Token())
	}
}

// Issue 14's in-process resize: a worker of the current round that left its
// process group asks for its next assignment and waits; the agent answers
// it once the next round is known, with that round's environment (and a
// new token, which the old round's token no longer matches), or tells it to
// leave. A worker outside the round cannot park, and a parked worker that
// hangs up is no longer listed.
func TestReconfigureParksWorkerUntilReleased(t *testing.T) {
	ch := newTestChannel(t)
	ch.SetRound(5)
	ctx := testCtx(t, 20*time.Second)
	// Not admitted: refused at once (after the admission wait).
	if _, err := RequestAssignment(ctx, ch.SocketPath(), Report{Rank: 1, Token: ch.Token()}); err == nil || !errors.Is(err, ErrStaleRound) && !strings.Contains(err.Error(), "not a worker of round 5") {
		t.Fatalf("reconfigure from a process outside the round = %v, want refused", err)
	}
	pg := syscall.Getpgrp()
	ch.Admit(5, pg, 1)
	if _, err := RequestAssignment(ctx, ch.SocketPath(), Report{Rank: 1, Token: "guess"}); err == nil || !strings.Contains(err.Error(), "wrong control token") {
		t.Fatalf("reconfigure with a wrong token = %v, want refused", err)
	}
	type result struct {
		a   *Assignment
		err error
	}
	ask := func(rank int) <-chan result {
		out := make(chan result, 1)
		token := ch.Token()
		go func() {
			a, err := RequestAssignment(ctx, ch.SocketPath(), Report{Rank: rank, Step: 42, Token: token})
			out <- result{a, err}
		}()
		return out
	}
	waitParked := func(want int) map[int]int {
		t.Helper()
		for {
			p, changed := ch.Parked()
			if len(p) == want {
				return p
			}
			select {
			case <-changed:
			case <-ctx.Done():
				t.Fatalf("parked workers %v, want %d", p, want)
			}
		}
	}
	got := ask(1)
	if p := waitParked(1); p[pg] != 1 {
		t.Fatalf("parked %v, want process group %d with rank 1", p, pg)
	}
	// Between rounds the worker stays parked.
	ch.SetRound(0)
	select {
	case r := <-got:
		t.Fatalf("answered before the next round: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	ch.SetRound(6)
	ch.Admit(6, pg, 0)
	if n := ch.Release(map[int]Assignment{pg: {Round: 6, Env: map[string]string{"RANK": "0", EnvControlToken: ch.Token()}}, 999999: {Leave: true}}); n != 1 {
		t.Fatalf("Release answered %d workers, want 1", n)
	}
	r := <-got
	if r.err != nil || r.a == nil || r.a.Round != 6 || r.a.Env["RANK"] != "0" || r.a.Env[EnvControlToken] != ch.Token() || r.a.Leave {
		t.Fatalf("assignment %+v (err %v), want round 6, rank 0 and the new token", r.a, r.err)
	}
	waitParked(0)
	// With its new token the worker's reports are believed in round 6.
	if err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 43, Path: "/c/43", Rank: 0, Token: r.a.Env[EnvControlToken]}); err != nil {
		t.Fatalf("report with the new round's token: %v", err)
	}
	<-ch.Reports()

	// Told to leave.
	got = ask(0)
	waitParked(1)
	ch.Release(map[int]Assignment{pg: {Leave: true, Reason: "not in round 7"}})
	if r := <-got; r.err != nil || !r.a.Leave {
		t.Fatalf("leave answer %+v (err %v)", r.a, r.err)
	}

	// A worker that hangs up while parked is forgotten.
	cctx, cancel := context.WithCancel(ctx)
	out := make(chan error, 1)
	go func() {
		_, err := RequestAssignment(cctx, ch.SocketPath(), Report{Rank: 0, Token: ch.Token()})
		out <- err
	}()
	waitParked(1)
	cancel()
	if err := <-out; err == nil {
		t.Fatal("a cancelled request returned no error")
	}
	waitParked(0)
}

// Issue 14's prewarm: a joining node starts its workers before it
// registers. Such a worker holds no rank: it is believed for one thing
// only, asking for its first assignment with the prewarm token (parked
// with rank -1), nothing else, until the agent admits it for a round and
// answers it; then it is an ordinary worker of that round. A forgotten
// prewarm (the agent gave it up) is believed for nothing.
func TestPrewarmedWorkerAsksOnlyForItsFirstAssignment(t *testing.T) {
	ch := newTestChannel(t)
	ch.SetRound(0) // no round yet: the node has not even registered
	ctx := testCtx(t, 20*time.Second)
	pg := syscall.Getpgrp()
	ptoken := ch.PrewarmEnv()[EnvControlToken]
	if ptoken == "" || ptoken == ch.Token() {
		t.Fatalf("prewarm token %q: want its own, not the round's %q", ptoken, ch.Token())
	}
	ch.AdmitPrewarmed(pg)
	err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 3, Path: "/c/3", Token: ptoken})
	if !errors.Is(err, ErrStaleRound) && (err == nil || !strings.Contains(err.Error(), "holds no rank yet")) {
		t.Fatalf("checkpoint report from a prewarmed worker = %v, want refused: it holds no rank", err)
	}
	if _, err := RequestAssignment(ctx, ch.SocketPath(), Report{Token: "guess"}); err == nil || !strings.Contains(err.Error(), "wrong control token") {
		t.Fatalf("first-assignment request with a wrong token = %v, want refused", err)
	}
	type result struct {
		a   *Assignment
		err error
	}
	got := make(chan result, 1)
	go func() {
		a, err := RequestAssignment(ctx, ch.SocketPath(), Report{Rank: 0, Token: ptoken})
		got <- result{a, err}
	}()
	for {
		p, changed := ch.Parked()
		if r, ok := p[pg]; ok {
			if r != -1 {
				t.Fatalf("prewarmed worker parked with rank %d, want -1 (none)", r)
			}
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatal("the prewarmed worker's request was not parked")
		}
	}
	ch.SetRound(4)
	ch.Admit(4, pg, 2)
	if n := ch.Release(map[int]Assignment{pg: {Round: 4, Env: map[string]string{"RANK": "2", EnvControlToken: ch.Token()}}}); n != 1 {
		t.Fatalf("Release answered %d, want 1", n)
	}
	r := <-got
	if r.err != nil || r.a == nil || r.a.Round != 4 || r.a.Env["RANK"] != "2" {
		t.Fatalf("first assignment %+v (err %v), want round 4 rank 2", r.a, r.err)
	}
	// Now a worker of round 4, with the round's token and rank.
	if err := SendReport(ctx, ch.SocketPath(), Report{Type: ReportCheckpoint, Step: 5, Path: "/c/5", Rank: 2, Token: r.a.Env[EnvControlToken]}); err != nil {
		t.Fatalf("report of the assigned worker: %v", err)
	}
	if rep := <-ch.Reports(); rep.Round != 4 || rep.Rank != 2 {
		t.Fatalf("accepted %+v, want round 4 rank 2", rep)
	}
	if _, err := RequestAssignment(ctx, ch.SocketPath(), Report{Rank: 2, Token: ptoken}); err == nil || !strings.Contains(err.Error(), "wrong control token") {
		t.Fatalf("the prewarm token after admission = %v, want refused", err)
	}
	// A prewarm given up is believed for nothing.
	ch.SetRound(0)
	ptoken = ch.PrewarmEnv()[EnvControlToken]
	ch.AdmitPrewarmed(pg)
	ch.ForgetPrewarmed()
	if _, err := RequestAssignment(ctx, ch.SocketPath(), Report{Token: ptoken}); !errors.Is(err, ErrStaleRound) && (err == nil || !strings.Contains(err.Error(), "no round is current")) {
		t.Fatalf("request of a forgotten prewarmed worker = %v, want refused", err)
	}
}

func TestEventFileSaysInProcess(t *testing.T) {
	ch := newTestChannel(t)
	if err := ch.Announce(Event{Kind: ScaleDown, NewWorldSize: 2, Round: 3, InProcess: true}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(ch.EventPath())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"inprocess":true`) {
		t.Errorf("event file %s does not say inprocess", data)
	}
	ev, err := ReadEvent(ch.EventPath())
	if err != nil || !ev.InProcess {
		t.Fatalf("ReadEvent = %+v, %v; want InProcess", ev, err)
	}
}

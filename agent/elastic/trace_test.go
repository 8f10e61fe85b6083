package elastic

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/launcher"
)

// A stdlib worker speaking the sync-signal protocol: it records its
// TRACEPARENT, and on an elastic event reports that it stops and exits 0.
const protocolWorker = `
import os, sys, time
import hyperpodrun_elastic as he
from hyperpodrun_elastic import _events
out = os.environ["OUT"]
with open(os.path.join(out, "tp.%s.%s" % (os.environ["HYPERPODRUN_ROUND"], os.environ["RANK"])), "w") as f:
    f.write(os.environ.get("TRACEPARENT", ""))
step = 0
while True:
    step += 1
    time.sleep(0.02)
    if step == 3 and os.environ["RANK"] == "0":
        # The workers' first report of a round: a committed checkpoint.
        ok = he.report_checkpoint(step, os.path.join(out, "ckpt"))
        with open(os.path.join(out, "reported.%s" % os.environ["HYPERPODRUN_ROUND"]), "w") as f:
            f.write(str(ok))
    if he.elastic_event_detected():
        # Whether the configured elastic signal arrived (not only the file,
        # which is written just before it and may be read first).
        deadline = time.time() + 2
        while not _events._state.signalled and time.time() < deadline:
            time.sleep(0.01)
        with open(os.path.join(out, "sig.%s.%s" % (os.environ["HYPERPODRUN_ROUND"], os.environ["RANK"])), "w") as f:
            f.write("%s %s" % (_events._state.signalled, os.environ.get("HYPERPODRUN_ELASTIC_SIGNAL")))
        he.report_stopping(step)
        sys.exit(0)
`

// TestScaleEventIsOneTraceWithWorkersTraceparent runs a planned change with
// the default elastic signal and with --elastic-signal SIGUSR2: the workers
// get the configured signal (and its number in HYPERPODRUN_ELASTIC_SIGNAL),
// stop, and the change is one trace that reaches the restarted workers.
func TestScaleEventIsOneTraceWithWorkersTraceparent(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	for _, sig := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2} {
		t.Run(launcher.SignalName(sig), func(t *testing.T) { scaleEventTrace(t, py, sig) })
	}
}

func scaleEventTrace(t *testing.T, py string, elasticSig syscall.Signal) {
	scaleEventTraceWith(t, py, elasticSig, 0)
}

// TestScaleEventEndsAtTheFirstHeartbeat: under --hang-timeout the workers'
// heartbeats (one per elastic_event_detected() call) are their progress,
// and the first one at the new size ends the scaling event.
func TestScaleEventEndsAtTheFirstHeartbeat(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	scaleEventTraceWith(t, py, syscall.SIGUSR1, time.Minute)
}

// scaleEventTraceWith runs the planned change with --hang-timeout hang.
func scaleEventTraceWith(t *testing.T, py string, elasticSig syscall.Signal, hang time.Duration) {
	job := "traced-" + strings.ToLower(launcher.SignalName(elasticSig))
	if hang > 0 {
		job += "-hb"
	}
	_, file, _, _ := runtime.Caller(0)
	pyPath := filepath.Join(filepath.Dir(file), "..", "..", "checkpoint", "python")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, cli := etcdtest.Start(t)
	out := t.TempDir()
	script := filepath.Join(out, "worker.py")
	os.WriteFile(script, []byte(protocolWorker), 0o644)

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	type agentRun struct {
		sigs chan os.Signal
		done chan error
	}
	var agents []agentRun
	for i, name := range []string{"n0", "n1"} {
		sigs := make(chan os.Signal, 1)
		o := Options{
			Spec: launcher.Spec{Entrypoint: script, PythonExec: py, NProcPerNode: 1, RunID: job,
				LogDir: filepath.Join(out, name), Env: map[string]string{"OUT": out, "PYTHONPATH": pyPath},
				Stdout: io.Discard, Stderr: io.Discard},
			MinNodes: 1, MaxNodes: 2, RdzvID: job, RdzvConf: "last_call_timeout=0.5", LocalAddr: "127.0.0.1",
			ShutdownSignal: syscall.SIGTERM, ShutdownTimeout: 5 * time.Second, GracefulTimeout: 10 * time.Second,
			ElasticSignal: elasticSig, Signals: sigs, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), HangTimeout: hang,
		}
		os.MkdirAll(o.Spec.LogDir, 0o755)
		done := make(chan error, 1)
		go func(i int) {
			done <- RunElasticWith(ctx, o, ElasticDeps{Client: cli, Tracer: tp, NodeID: name})
		}(i)
		agents = append(agents, agentRun{sigs, done})
	}
	waitFile := func(pattern string) string {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			m, _ := filepath.Glob(filepath.Join(out, pattern))
			if len(m) > 0 {
				b, _ := os.ReadFile(m[0])
				if len(b) > 0 {
					return string(b)
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s", pattern)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFile("tp.1.0")
	waitFile("tp.1.1")
	waitFile("reported.1") // a committed checkpoint before the change
	// A planned change: the job's target goes from 2 nodes to 1.
	if err := fleet.New(cli, "").SetTarget(ctx, job, 1); err != nil {
		t.Fatal(err)
	}
	tpWorker := waitFile("tp.2.0")
	waitFile("reported.2") // the restarted workers' first report
	// The first round's workers were woken by the configured signal.
	for _, rank := range []string{"0", "1"} {
		if got, want := waitFile("sig.1."+rank), fmt.Sprintf("True %d", int(elasticSig)); got != want {
			t.Errorf("rank %s's worker at the change: signalled/configured %q, want %q", rank, got, want)
		}
	}
	for _, a := range agents {
		a.sigs <- syscall.SIGTERM
	}
	for _, a := range agents {
		<-a.done
	}
	spans := exp.GetSpans()
	named := func(name string) []*tracetest.SpanStub {
		var out []*tracetest.SpanStub
		for i := range spans {
			if spans[i].Name != name {
				continue
			}
			for _, a := range spans[i].Attributes {
				if a.Key == "reason" && a.Value.AsString() == "TargetChanged" {
					out = append(out, &spans[i])
				}
			}
		}
		return out
	}
	// Both agents traced the change (the one that became a spare ends its
	// span when it leaves), in one trace.
	events := named("scale_event")
	if len(events) != 2 {
		t.Fatalf("%d scale_event spans for the target change among %d spans, want one per agent", len(events), len(spans))
	}
	traceID := events[0].SpanContext.TraceID()
	for _, d := range append(events, named("decision")...) {
		if d.SpanContext.TraceID() != traceID {
			t.Errorf("an agent traced the change in another trace (%s %s, want %s)", d.Name, d.SpanContext.TraceID(), traceID)
		}
	}
	got := map[string]bool{}
	for _, s := range spans {
		if s.SpanContext.TraceID() == traceID {
			got[s.Name] = true
		}
	}
	for _, want := range []string{"decision", "signal", "checkpoint_wait", "rendezvous", "barrier", "restart"} {
		if !got[want] {
			t.Errorf("scale event trace lacks a %q span; has %v", want, got)
		}
	}
	if !strings.Contains(tpWorker, traceID.String()) {
		t.Errorf("restarted worker's TRACEPARENT %q is not in the scale event's trace %s", tpWorker, traceID)
	}
	first := "checkpoint"
	if hang > 0 {
		first = "heartbeat"
	}
	checkEventAttributes(t, job, first, spans, events)
}

// checkEventAttributes: each node's scale_event says who, why and from
// what size to what; the node that stays has a first_step span and the
// downtime, and its checkpoint wait names the committed step (issue 29).
func checkEventAttributes(t *testing.T, job, firstReport string, spans tracetest.SpanStubs, events []*tracetest.SpanStub) {
	t.Helper()
	attrs := func(s *tracetest.SpanStub) map[string]string {
		m := map[string]string{}
		for _, a := range s.Attributes {
			m[string(a.Key)] = a.Value.String()
		}
		return m
	}
	var stayed *tracetest.SpanStub
	for _, ev := range events {
		a := attrs(ev)
		if a["job"] != job || (a["node"] != "n0" && a["node"] != "n1") || a["from_size"] != "2" || a["to_size"] != "1" || a["from_round"] != "1" {
			t.Errorf("scale_event attributes %v: want job %s, its node, from_size 2, to_size 1, from_round 1", a, job)
		}
		if _, ok := a["downtime"]; ok {
			stayed = ev
		}
	}
	if stayed == nil {
		t.Fatalf("no scale_event has a downtime: %v / %v", attrs(events[0]), attrs(events[1]))
	}
	a := attrs(stayed)
	if d, err := strconv.ParseFloat(a["downtime"], 64); err != nil || d <= 0 || d > 30 {
		t.Errorf("downtime %q, want seconds > 0", a["downtime"])
	}
	if a["to_round"] != "2" || a["first_report"] != firstReport || (firstReport == "checkpoint" && a["first_step"] != "3") {
		t.Errorf("the staying node's scale_event %v: want to_round 2 and first_report %s (a checkpoint: first_step 3)", a, firstReport)
	}
	var first, wait bool
	for i := range spans {
		s := &spans[i]
		if s.Parent.SpanID() != stayed.SpanContext.SpanID() {
			continue
		}
		switch s.Name {
		case "first_step":
			first = true
		case "checkpoint_wait":
			if _, ok := attrs(s)["checkpoint_step"]; ok {
				wait = true
			}
		}
	}
	if !first || !wait {
		t.Errorf("the staying node's scale_event lacks a first_step span (%v) or a checkpoint_wait with checkpoint_step (%v)", first, wait)
	}
}

func TestDowntimeRules(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	for _, tc := range []struct {
		rule                    string
		stopped, started, first time.Time
		want                    float64
	}{
		{"from the workers' stop to their first report", at(0), at(2), at(5), 5},
		{"stop unknown: from the start at the new size", time.Time{}, at(2), at(5), 3},
		{"a stop after the start (clock step) counts from the start", at(3), at(2), at(5), 3},
		{"a report before the stop is no downtime", at(5), at(5), at(4), 0},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := downtime(tc.stopped, tc.started, tc.first); got != tc.want {
				t.Errorf("downtime = %v, want %v", got, tc.want)
			}
		})
	}
}

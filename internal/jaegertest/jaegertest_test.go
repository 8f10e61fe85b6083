package jaegertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/internal/tracestore"
)

// A span exported with the OTel SDK over OTLP/HTTP is read back by service
// through the query API, with its parent, its attributes and its duration.
func TestExportedSpansReadBackByService(t *testing.T) {
	j := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(j.OTLPHTTP+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("jaegertest-svc"))))
	tr := tp.Tracer("jaegertest")
	start := time.Now().Add(-time.Second)
	rctx, root := tr.Start(ctx, "root.op", trace.WithTimestamp(start))
	root.SetAttributes(attribute.String("job", "tj"), attribute.Int("to_size", 1))
	_, child := tr.Start(rctx, "child.op", trace.WithTimestamp(start.Add(100*time.Millisecond)))
	child.End(trace.WithTimestamp(start.Add(400 * time.Millisecond)))
	root.End(trace.WithTimestamp(start.Add(500 * time.Millisecond)))
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatalf("export: %v", err)
	}

	var got []tracestore.Trace
	testutil.Eventually(t, 30*time.Second, "the trace in jaeger", func() (bool, string) {
		got, err = j.Traces(ctx, "jaegertest-svc")
		if err != nil {
			return false, err.Error()
		}
		return len(got) == 1 && len(got[0].Spans) == 2, fmt.Sprintf("%d traces: %+v", len(got), got)
	})
	tr0 := got[0]
	if want := root.SpanContext().TraceID().String(); tr0.TraceID != want {
		t.Errorf("trace ID %s, want %s", tr0.TraceID, want)
	}
	r, c := tr0.Spans[0], tr0.Spans[1]
	if r.Operation != "root.op" || c.Operation != "child.op" {
		t.Fatalf("spans %q, %q: want root.op then child.op", r.Operation, c.Operation)
	}
	if c.ParentSpanID != r.SpanID || r.ParentSpanID != "" {
		t.Errorf("child's parent %q, root %q (root's parent %q)", c.ParentSpanID, r.SpanID, r.ParentSpanID)
	}
	if r.Service != "jaegertest-svc" || c.Service != "jaegertest-svc" {
		t.Errorf("services %q, %q", r.Service, c.Service)
	}
	if r.Attributes["job"] != "tj" || r.Attributes["to_size"] != "1" {
		t.Errorf("root attributes %v", r.Attributes)
	}
	if r.Duration != 500*time.Millisecond || c.Duration != 300*time.Millisecond {
		t.Errorf("durations %s, %s: want 500ms, 300ms", r.Duration, c.Duration)
	}
	if d := c.Start.Sub(r.Start); d != 100*time.Millisecond {
		t.Errorf("child starts %s after root, want 100ms", d)
	}

	// Found by tag too; a tag no span carries finds nothing.
	cl := tracestore.NewClient(j.Query)
	if ts, err := cl.Traces(ctx, "jaegertest-svc", map[string]string{"job": "tj"}, 10); err != nil || len(ts) != 1 {
		t.Errorf("by job=tj: %d traces, %v", len(ts), err)
	}
	if ts, err := cl.Traces(ctx, "jaegertest-svc", map[string]string{"job": "other"}, 10); err != nil || len(ts) != 0 {
		t.Errorf("by job=other: %d traces, %v", len(ts), err)
	}
	if svcs, err := cl.Services(ctx); err != nil || len(svcs) != 1 || svcs[0] != "jaegertest-svc" {
		t.Errorf("services %v, %v", svcs, err)
	}
}

// With $JAEGERTEST_DUMP, a test's Jaeger leaves its traces in that
// directory as the query API's JSON, which tracestore parses back.
func TestDumpLeavesTheTraces(t *testing.T) {
	dir := t.TempDir()
	t.Run("traced", func(t *testing.T) {
		t.Setenv("JAEGERTEST_DUMP", dir)
		j := Start(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(j.OTLPHTTP+"/v1/traces"))
		if err != nil {
			t.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("dumped"))))
		_, s := tp.Tracer("t").Start(ctx, "dumped.op")
		s.End()
		if err := tp.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, "the span in jaeger", func() (bool, string) {
			ts, err := j.Traces(ctx, "dumped")
			return err == nil && len(ts) == 1, fmt.Sprint(ts, err)
		})
	})
	body, err := os.ReadFile(filepath.Join(dir, "TestDumpLeavesTheTraces_traced.dumped.json"))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := tracestore.ParseTraces(body)
	if err != nil || len(ts) != 1 || ts[0].Spans[0].Operation != "dumped.op" {
		t.Errorf("dumped traces %+v, %v", ts, err)
	}
}

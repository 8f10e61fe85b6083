package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestNothingExportedWithoutConfiguration(t *testing.T) {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Setenv(k, "")
	}
	if Enabled() {
		t.Fatal("enabled without OTEL_* configuration")
	}
	tp, shutdown, err := Setup(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(context.Background())
	_, span := tp.Tracer("t").Start(context.Background(), "x")
	if span.IsRecording() {
		t.Error("spans are recorded without configuration")
	}
	span.End()
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	if Enabled() {
		t.Error("OTEL_TRACES_EXPORTER=none did not disable export")
	}
}

func TestOTLPHTTPExport(t *testing.T) {
	var got atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/traces" && r.Method == http.MethodPost {
			got.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	tp, shutdown, err := Setup(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := tp.Tracer("t").Start(context.Background(), "scale_event")
	if tpv := TraceParent(ctx); !strings.HasPrefix(tpv, "00-"+span.SpanContext().TraceID().String()) {
		t.Errorf("traceparent %q does not carry the span's trace", tpv)
	}
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got.Load() == 0 {
		t.Error("no OTLP export request reached the collector")
	}
}

func TestBadExporterSettings(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
	if _, _, err := Setup(context.Background(), "test"); err == nil {
		t.Error("unsupported exporter accepted")
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
	if _, _, err := Setup(context.Background(), "test"); err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Errorf("bad protocol: %v", err)
	}
}

// A traceparent rendered by TraceParent parents a span in another process.
func TestFromTraceParentRoundTrip(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	tp := TraceParent(trace.ContextWithSpanContext(context.Background(), sc))
	ctx, ok := FromTraceParent(tp)
	got := trace.SpanContextFromContext(ctx)
	if !ok || got.TraceID() != tid || got.SpanID() != sid || !got.IsRemote() {
		t.Errorf("FromTraceParent(%q) = %v %v, want trace %s span %s, remote", tp, got, ok, tid, sid)
	}
	for _, bad := range []string{"", "00-zz-00f067aa0ba902b7-01", "garbage"} {
		if _, ok := FromTraceParent(bad); ok {
			t.Errorf("FromTraceParent(%q) is valid", bad)
		}
	}
}

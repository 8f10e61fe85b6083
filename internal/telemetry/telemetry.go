// Package telemetry sets up OpenTelemetry tracing from the standard OTEL_*
// environment variables. With none of them set nothing is exported and the
// tracer is a no-op, so tracing costs nothing by default.
package telemetry

import (
	"context"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Enabled reports whether the environment asks for trace export:
// OTEL_TRACES_EXPORTER other than "none", or an OTLP endpoint.
func Enabled() bool {
	if e := os.Getenv("OTEL_TRACES_EXPORTER"); e != "" {
		return e != "none"
	}
	if os.Getenv("OTEL_SDK_DISABLED") == "true" {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup returns the tracer provider for service (OTLP over gRPC or HTTP per
// OTEL_EXPORTER_OTLP_PROTOCOL; the exporters read the other OTEL_*
// variables themselves) and a shutdown function that flushes it. Without
// configuration it returns a no-op provider.
func Setup(ctx context.Context, service string) (trace.TracerProvider, func(context.Context) error, error) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	if !Enabled() {
		return noop.NewTracerProvider(), func(context.Context) error { return nil }, nil
	}
	var exp sdktrace.SpanExporter
	var err error
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch {
	case os.Getenv("OTEL_TRACES_EXPORTER") != "" && os.Getenv("OTEL_TRACES_EXPORTER") != "otlp":
		return nil, nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: only otlp (or none) is supported", os.Getenv("OTEL_TRACES_EXPORTER"))
	case proto == "grpc":
		exp, err = otlptracegrpc.New(ctx)
	case proto == "" || strings.HasPrefix(proto, "http"):
		exp, err = otlptracehttp.New(ctx)
	default:
		return nil, nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: use grpc, http/protobuf or http/json", proto)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("create OTLP trace exporter: %w", err)
	}
	res, _ := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp, tp.Shutdown, nil
}

// TraceParent renders a span context as a W3C traceparent header value
// (the TRACEPARENT given to workers), or "" when it is not valid.
func TraceParent(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier["traceparent"]
}

// FromTraceParent returns a context whose remote parent is the span a W3C
// traceparent names (the coordinator's decision span, carried in a job's
// desired record), and whether tp was valid; with an invalid one the
// context has no parent.
func FromTraceParent(tp string) (context.Context, bool) {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
	return ctx, trace.SpanContextFromContext(ctx).IsValid()
}

// Package telemetry sets up OpenTelemetry tracing from the standard OTEL_*
// environment variables, as the OpenTelemetry specification says
// (go.opentelemetry.io/contrib/exporters/autoexport): OTEL_TRACES_EXPORTER
// (otlp, console, none), OTEL_EXPORTER_OTLP_* (endpoint, protocol,
// headers, timeouts), OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES. With
// none of them set nothing is exported and the tracer is a no-op, so
// tracing costs nothing by default.
package telemetry

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// HeadersFileEnv names a file holding OTLP exporter headers in the
// OTEL_EXPORTER_OTLP_HEADERS format (key=value pairs, comma-separated,
// values URL-encoded). The node agent gives a job's hyperpodrun its
// collector's headers (which may hold tokens) this way, in a file only
// the job's uid can read, instead of in its environment.
const HeadersFileEnv = "HYPERPODRUN_OTLP_HEADERS_FILE"

// Resource attribute keys naming where a process runs, beside the
// semantic conventions' service.name and host.name.
const (
	// NodeAttr is the fleet node (hyperpod-agent --node-name).
	NodeAttr = "hyperpodrun.node"
	// JobAttr is the job (hyperpodrun --rdzv-id).
	JobAttr = "hyperpodrun.job"
)

// Enabled reports whether the environment asks for trace export.
func Enabled() bool { return enabled(os.Getenv) }

// enabled is the rule of Enabled over getenv: OTEL_SDK_DISABLED=true
// turns everything off; an OTEL_TRACES_EXPORTER other than "none" turns
// export on; unset, an OTLP endpoint does (the specification's default
// exporter is otlp, but with nowhere configured to send to, nothing is
// exported and nothing is paid).
func enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	if e := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); e != "" {
		return e != "none"
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup returns the tracer provider for service (the exporter chosen by
// OTEL_TRACES_EXPORTER, OTLP over gRPC or HTTP per
// OTEL_EXPORTER_OTLP_PROTOCOL; the exporters read the other OTEL_*
// variables themselves) and a shutdown function that flushes it. The
// resource is service.name service, host.name, attrs (e.g. NodeAttr,
// JobAttr), then OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, which win.
// Without configuration it returns a no-op provider.
func Setup(ctx context.Context, service string, attrs ...attribute.KeyValue) (trace.TracerProvider, func(context.Context) error, error) {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	if !Enabled() {
		return noop.NewTracerProvider(), func(context.Context) error { return nil }, nil
	}
	exp, err := newExporter(ctx)
	if err != nil {
		return nil, nil, err
	}
	res, err := newResource(ctx, service, attrs)
	if err != nil {
		return nil, nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp, tp.Shutdown, nil
}

// newExporter is autoexport's exporter, except that OTLP headers from
// HeadersFileEnv's file are added to the OTLP exporter it would make.
func newExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	file := os.Getenv(HeadersFileEnv)
	kind := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))
	if file == "" || (kind != "" && kind != "otlp") {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("trace exporter (OTEL_TRACES_EXPORTER=%q, OTEL_EXPORTER_OTLP_PROTOCOL=%q): %w", kind, os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), err)
		}
		return exp, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("OTLP headers file (%s): %w", HeadersFileEnv, err)
	}
	h, err := ParseHeaders(string(b))
	if err != nil {
		return nil, fmt.Errorf("OTLP headers file %s: %w", file, err)
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch proto {
	case "grpc":
		return otlptracegrpc.New(ctx, otlptracegrpc.WithHeaders(h))
	case "", "http/protobuf":
		return otlptracehttp.New(ctx, otlptracehttp.WithHeaders(h))
	}
	return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: use grpc or http/protobuf", proto)
}

// newResource describes this process: service, host and attrs, then what
// the environment says (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME win).
func newResource(ctx context.Context, service string, attrs []attribute.KeyValue) (*resource.Resource, error) {
	base := append([]attribute.KeyValue{semconv.ServiceName(service)}, attrs...)
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithHost(), resource.WithAttributes(base...), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("trace resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME): %w", err)
	}
	return res, nil
}

// ParseHeaders reads OTLP headers in the OTEL_EXPORTER_OTLP_HEADERS
// format: key=value pairs separated by commas (or newlines, for a file),
// values URL-encoded. Blank entries are skipped.
func ParseHeaders(s string) (map[string]string, error) {
	h := map[string]string{}
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '\n' || r == '\r' }) {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		k, v, ok := strings.Cut(f, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			// The entry may hold a token: name its position, not its text.
			return nil, fmt.Errorf("header entry %d is not key=value", len(h)+1)
		}
		val, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("header %s: its value is not URL-encoded", k)
		}
		h[k] = val
	}
	return h, nil
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

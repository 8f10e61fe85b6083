package jobrunner

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/hyperpodrun/hyperpodrun/agent/node/containers"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/telemetry"
)

// Tracing of the node agent's actions and the jobs' tracing configuration
// (issue 29).
//
// The agent's own spans (Config.Tracer) are children of the coordinator's
// decision span, named by the traceparent in the job's desired record:
// agent.start_job (reading the job and starting its hyperpodrun),
// agent.drain_job and agent.stop_job (from the drain signal to the run's
// exit; stop when the coordinator took the whole allocation away).
//
// A job's hyperpodrun exports its own spans with the configuration the
// agent was given for jobs (Config.JobTracing: hyperpod-agent
// --job-otlp-endpoint, --job-otlp-protocol, --job-otlp-headers-file),
// never the agent's environment: the runner sets the OTEL_* variables of
// the job's environment from it, and writes the headers (tokens, maybe)
// to a file of the run's own directory, the job's alone, whose path
// hyperpodrun reads from telemetry.HeadersFileEnv.

// JobTracing is where the jobs' hyperpodruns (and their workers, which
// inherit hyperpodrun's environment) export traces. Zero: nowhere.
type JobTracing struct {
	// Endpoint is the OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT), e.g.
	// http://collector:4318 (http/protobuf) or http://collector:4317 (grpc).
	Endpoint string
	// Protocol is OTEL_EXPORTER_OTLP_PROTOCOL: grpc or http/protobuf
	// (default).
	Protocol string
	// HeadersFile is an agent-side file of OTLP headers in the
	// OTEL_EXPORTER_OTLP_HEADERS format, read at each job start and
	// copied into the run's directory for the job alone.
	HeadersFile string
}

// Check says what is wrong with t (nil when nothing): the endpoint, the
// protocol, and the headers file, read and parsed (its text is never
// repeated in the error).
func (t JobTracing) Check() error {
	if t.Endpoint == "" {
		if t.Protocol != "" || t.HeadersFile != "" {
			return fmt.Errorf("--job-otlp-protocol and --job-otlp-headers-file need --job-otlp-endpoint")
		}
		return nil
	}
	if u, err := url.Parse(t.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--job-otlp-endpoint %q: want http(s)://host:port", t.Endpoint)
	}
	switch t.Protocol {
	case "", "grpc", "http/protobuf":
	default:
		return fmt.Errorf("--job-otlp-protocol %q: want grpc or http/protobuf", t.Protocol)
	}
	if t.HeadersFile != "" {
		b, err := os.ReadFile(t.HeadersFile)
		if err != nil {
			return fmt.Errorf("--job-otlp-headers-file: %w", err)
		}
		if _, err := telemetry.ParseHeaders(string(b)); err != nil {
			return fmt.Errorf("--job-otlp-headers-file %s: %w", t.HeadersFile, err)
		}
	}
	return nil
}

// headersFileName is the headers file's name in a run's directory.
const headersFileName = "otlp.headers"

// tracingEnv is the tracing environment of job's hyperpodrun on node
// (team: the job's team): none without an endpoint; else the OTLP
// exporter's settings, the service and resource naming node, job and team,
// and headersPath (the job's copy of the headers, "" for none). A
// variable the job's own run.env sets (own) is the job's choice and is
// left out.
func tracingEnv(t JobTracing, node, job, team, headersPath string, own map[string]string) []string {
	if t.Endpoint == "" {
		return nil
	}
	proto := t.Protocol
	if proto == "" {
		proto = "http/protobuf"
	}
	res := []string{telemetry.NodeAttr + "=" + url.PathEscape(node), telemetry.JobAttr + "=" + url.PathEscape(job)}
	if team != "" {
		res = append(res, "hyperpodrun.team="+url.PathEscape(team))
	}
	env := map[string]string{
		"OTEL_TRACES_EXPORTER":        "otlp",
		"OTEL_EXPORTER_OTLP_ENDPOINT": t.Endpoint,
		"OTEL_EXPORTER_OTLP_PROTOCOL": proto,
		"OTEL_SERVICE_NAME":           "hyperpodrun",
		"OTEL_RESOURCE_ATTRIBUTES":    strings.Join(res, ","),
	}
	if headersPath != "" {
		env[telemetry.HeadersFileEnv] = headersPath
	}
	var out []string
	for k, v := range env {
		if _, set := own[k]; !set {
			out = append(out, k+"="+v)
		}
	}
	sort.Strings(out)
	return out
}

// jobTracingEnv writes the headers file of a run into runDir (the job's
// own directory, seen by the job at seenDir) and returns the run's tracing
// environment.
func (r *Runner) jobTracingEnv(spec *fleet.JobSpec, runDir, seenDir string, id Identity) ([]string, error) {
	t := r.cfg.JobTracing
	if t.Endpoint == "" {
		return nil, nil
	}
	path := ""
	if t.HeadersFile != "" {
		b, err := os.ReadFile(t.HeadersFile)
		if err != nil {
			return nil, fmt.Errorf("read the jobs' OTLP headers file: %w", err)
		}
		if err := WriteJobFile(runDir, headersFileName, b, id); err != nil {
			return nil, fmt.Errorf("write the job's OTLP headers file: %w", err)
		}
		path = seenDir + "/" + headersFileName
	}
	return tracingEnv(t, r.node.Name, spec.Name, spec.Team, path, spec.Run.Env), nil
}

// tracedContainerSpec is containerSpec with the run's tracing environment
// (its headers file in runDir, seen at containers.RunDir).
func (r *Runner) tracedContainerSpec(spec *fleet.JobSpec, env []string, creds *fleet.JobCreds, runDir string, gen int64, id Identity) (containers.Spec, error) {
	tenv, err := r.jobTracingEnv(spec, runDir, containers.RunDir, id)
	if err != nil {
		return containers.Spec{}, err
	}
	return r.containerSpec(spec, append(env, tenv...), creds, runDir, gen, id)
}

// decisionContext is the context of the coordinator's decision about job
// (its desired record's traceparent), and the record; a background context
// when tracing is off, or there is no record or no decision span.
func (r *Runner) decisionContext(ctx context.Context, job string) (context.Context, *fleet.Desired) {
	if r.cfg.Tracer == nil {
		return context.Background(), nil
	}
	rctx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	d, err := r.st.Desired(rctx, job)
	if err != nil {
		r.log.Debug("read the job's desired record for its trace", "job", job, "err", err)
		return context.Background(), nil
	}
	if p, ok := telemetry.FromTraceParent(d.TraceParentOrEmpty()); ok {
		return p, d
	}
	return context.Background(), d
}

// tracer is the agent's tracer (nil when tracing is off).
func (r *Runner) tracer() trace.Tracer {
	if r.cfg.Tracer == nil {
		return nil
	}
	return r.cfg.Tracer.Tracer("github.com/hyperpodrun/hyperpodrun/agent/node/jobrunner")
}

// jobAttrs are the attributes of an agent span about job.
func (r *Runner) jobAttrs(job string, d *fleet.Desired) []attribute.KeyValue {
	a := []attribute.KeyValue{attribute.String("job", job), attribute.String("node", r.node.Name)}
	if d != nil {
		a = append(a, attribute.Int64("generation", d.Generation), attribute.Int("to_size", d.Target()))
		if d.Team != "" {
			a = append(a, attribute.String("team", d.Team))
		}
	}
	return a
}

// traceStart begins the agent.start_job span of a start of job; the
// returned function ends it with the start's outcome.
func (r *Runner) traceStart(ctx context.Context, job string) func(*error) {
	tr := r.tracer()
	if tr == nil {
		return func(*error) {}
	}
	parent, d := r.decisionContext(ctx, job)
	_, span := tr.Start(parent, "agent.start_job", trace.WithAttributes(r.jobAttrs(job, d)...))
	return func(err *error) {
		if *err != nil {
			span.SetStatus(codes.Error, (*err).Error())
		}
		r.mu.Lock()
		_, running := r.jobs[job]
		r.mu.Unlock()
		span.SetAttributes(attribute.Bool("started", running))
		span.End()
	}
}

// traceDrain records the drain of a run that ended: an agent.drain_job
// span (agent.stop_job when the coordinator stopped the job) from the
// drain signal (drained) to now, with the run's outcome.
func (r *Runner) traceDrain(job string, drained time.Time, runErr error) {
	tr := r.tracer()
	if tr == nil || drained.IsZero() {
		return
	}
	parent, d := r.decisionContext(context.Background(), job)
	if !d.TookAway(r.node.Name) {
		// The node leaves (hyperpod-agent drains), not the decision's.
		parent = context.Background()
	}
	name := "agent.drain_job"
	if d != nil && d.Stop != nil {
		name = "agent.stop_job"
	}
	_, span := tr.Start(parent, name, trace.WithTimestamp(drained), trace.WithAttributes(r.jobAttrs(job, d)...))
	if runErr != nil {
		span.SetStatus(codes.Error, runErr.Error())
	}
	span.End()
}

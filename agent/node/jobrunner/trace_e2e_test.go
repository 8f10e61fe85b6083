package jobrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdtest"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
	"github.com/hyperpodrun/hyperpodrun/internal/jaegertest"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/internal/tracestore"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// traceWorker writes its environment once per round, commits a checkpoint
// at its third step (its first report at a size), and on an elastic event
// reports that it stops and exits 0.
const traceWorker = `
import json, os, sys, time
import hyperpodrun_elastic as he
out, rnd, rank = os.environ["OUT"], os.environ["HYPERPODRUN_ROUND"], os.environ["RANK"]
tmp = os.path.join(out, ".env.%s.%s" % (rnd, rank))
with open(tmp, "w") as f:
    json.dump(dict(os.environ), f)
os.rename(tmp, os.path.join(out, "env.%s.%s" % (rnd, rank)))
step = 0
while True:
    step += 1
    time.sleep(0.05)
    if step == 3 and rank == "0":
        ok = he.report_checkpoint(step, os.path.join(out, "ckpt"))
        with open(os.path.join(out, "reported.%s" % rnd), "w") as f:
            f.write(str(ok))
    if he.elastic_event_detected():
        he.report_stopping(step)
        sys.exit(0)
`

// sdkProvider exports service's spans to Jaeger's OTLP/HTTP receiver.
func sdkProvider(t *testing.T, j *jaegertest.Jaeger, service string) *sdktrace.TracerProvider {
	t.Helper()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(j.OTLPHTTP+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(service))))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp
}

// A resize of a job of real hyperpodruns, on a real coordinator and two
// real node agents, all exporting to a real Jaeger (issue 29): Jaeger
// holds one trace for it, rooted at the coordinator's decision, with the
// node agents' and every hyperpodrun's spans under it and the downtime
// on the staying node's scale event. The agents' own OTEL_* settings and
// secrets never reach the job, which exports through the configuration the
// agent was given for jobs.
func TestResizeIsOneTraceInJaeger(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	j := jaegertest.Start(t)
	hpr := hyperpodrun(t)
	// The agent's environment: a wrong collector and a secret. A job that
	// inherited either would export nowhere, or hold the secret.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
	t.Setenv("OTEL_SERVICE_NAME", "leaked-agent-service")
	t.Setenv("AGENT_SECRET_TOKEN", "hunter2-agent-only")
	srv, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	st := fleet.New(cli, "")
	f := newProcessFleet(t, cli, srv.Endpoints, hpr)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("jaeger:\n%s", j.Log(3000))
		}
	})
	f.startCoordinator(coordinator.Config{Tracer: sdkProvider(t, j, "hyperpod-coordinator")})

	headers := filepath.Join(t.TempDir(), "otlp.headers")
	if err := os.WriteFile(headers, []byte("x-tenant=team%20t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	agentTP := sdkProvider(t, j, "hyperpod-agent")
	for _, node := range []string{"node-a", "node-b"} {
		f.startAgent(node, Config{AllowRootJobs: true, DrainMargin: 5 * time.Second,
			Tracer: agentTP, JobTracing: JobTracing{Endpoint: j.OTLPHTTP, HeadersFile: headers}})
	}

	dir := t.TempDir()
	worker := filepath.Join(dir, "worker.py")
	if err := os.WriteFile(worker, []byte(traceWorker), 0o644); err != nil {
		t.Fatal(err)
	}
	_, file, _, _ := runtime.Caller(0)
	pyPath := filepath.Join(filepath.Dir(file), "..", "..", "..", "checkpoint", "python")
	if err := st.PutTeam(ctx, policy.Team{Name: "t", Weight: 1, Quotas: []policy.FlavorQuota{{Flavor: e2eFlavor, Nominal: 2}}}); err != nil {
		t.Fatal(err)
	}
	if err := st.SubmitJob(ctx, fleet.JobSpec{Job: policy.Job{Name: "tj", Team: "t", PerNode: policy.Resources{Accelerators: 1}, MinNodes: 1, MaxNodes: 2, Elastic: true},
		Run: fleet.RunSpec{Script: worker, Python: py, GracefulTimeoutSeconds: 10,
			// The job's own settings still reach it (a faster export).
			Env: map[string]string{"OUT": dir, "PYTHONPATH": pyPath, "OTEL_BSP_SCHEDULE_DELAY": "200"}}}); err != nil {
		t.Fatal(err)
	}
	// envs are the environments the workers wrote, by round and rank.
	envs := func() map[string]map[string]string {
		m := map[string]map[string]string{}
		files, _ := filepath.Glob(filepath.Join(dir, "env.*"))
		for _, f := range files {
			var e map[string]string
			if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &e) == nil {
				m[strings.TrimPrefix(filepath.Base(f), "env.")] = e
			}
		}
		return m
	}
	twoNodeRound := ""
	testutil.Eventually(t, 60*time.Second, "the job to train on both nodes", func() (bool, string) {
		for k, e := range envs() {
			if e["WORLD_SIZE"] == "2" {
				twoNodeRound = e["HYPERPODRUN_ROUND"]
				_, ok := envs()[twoNodeRound+".1"]
				return ok && fileExists(filepath.Join(dir, "reported."+twoNodeRound)), k
			}
		}
		return false, fmt.Sprint(len(envs()), " environments")
	})

	t.Run("the agent's environment never reaches the job", func(t *testing.T) {
		for k, e := range envs() {
			for name, v := range e {
				if strings.Contains(v, "hunter2") || name == "AGENT_SECRET_TOKEN" {
					t.Errorf("worker %s got the agent's secret: %s=%s", k, name, v)
				}
				if strings.Contains(v, "x-tenant") || strings.Contains(v, "team%20t") {
					t.Errorf("worker %s has the OTLP headers in its environment: %s", k, name)
				}
			}
			if e["OTEL_EXPORTER_OTLP_ENDPOINT"] != j.OTLPHTTP || e["OTEL_SERVICE_NAME"] != "hyperpodrun" {
				t.Errorf("worker %s: OTEL_EXPORTER_OTLP_ENDPOINT %q, OTEL_SERVICE_NAME %q: want the jobs' collector %s and hyperpodrun, not the agent's settings",
					k, e["OTEL_EXPORTER_OTLP_ENDPOINT"], e["OTEL_SERVICE_NAME"], j.OTLPHTTP)
			}
			if !strings.Contains(e["OTEL_RESOURCE_ATTRIBUTES"], "hyperpodrun.job=tj") || !strings.Contains(e["OTEL_RESOURCE_ATTRIBUTES"], "hyperpodrun.node=node-") {
				t.Errorf("worker %s: OTEL_RESOURCE_ATTRIBUTES %q does not name its node and job", k, e["OTEL_RESOURCE_ATTRIBUTES"])
			}
			if hf := e["HYPERPODRUN_OTLP_HEADERS_FILE"]; hf == "" || strings.Contains(hf, "=") {
				t.Errorf("worker %s: HYPERPODRUN_OTLP_HEADERS_FILE %q, want the path of the job's copy", k, hf)
			}
		}
	})

	// The user resizes the job to one node.
	if _, err := st.UpdateJob(ctx, "tj", func(js *fleet.JobSpec) error { js.MaxNodes = 1; return nil }); err != nil {
		t.Fatal(err)
	}
	oneNodeRound := ""
	testutil.Eventually(t, 60*time.Second, "the job to train on one node", func() (bool, string) {
		for _, e := range envs() {
			if e["WORLD_SIZE"] == "1" && e["HYPERPODRUN_ROUND"] > twoNodeRound {
				oneNodeRound = e["HYPERPODRUN_ROUND"]
				return fileExists(filepath.Join(dir, "reported."+oneNodeRound)), "waiting for its first report"
			}
		}
		return false, ""
	})

	// Jaeger's trace of the resize.
	var resize tracestore.Trace
	testutil.Eventually(t, 30*time.Second, "the resize's trace in Jaeger, complete", func() (bool, string) {
		traces, err := j.Traces(ctx, "hyperpodrun")
		if err != nil {
			return false, err.Error()
		}
		var found []tracestore.Trace
		for _, tr := range traces {
			for _, s := range tr.Spans {
				if s.Operation == "coordinator.decision" && s.Attributes["from_size"] == "2" && s.Attributes["to_size"] == "1" {
					found = append(found, tr)
					break
				}
			}
		}
		if len(found) != 1 {
			return false, fmt.Sprintf("%d traces of the resize among %d", len(found), len(traces))
		}
		resize = found[0]
		why := traceComplete(resize)
		return why == "", why
	})
	checkResizeTrace(t, resize)
	// One trace for the resize: no span of its handling went elsewhere.
	traces, err := j.Traces(ctx, "hyperpodrun")
	if err != nil {
		t.Fatal(err)
	}
	// The placement that started the job (one decision, or a first node
	// then a growth): each agent's start is a child of a decision.
	testutil.Eventually(t, 20*time.Second, "both agents' starts under the placement's decisions", func() (bool, string) {
		agentTraces, err := j.Traces(ctx, "hyperpod-agent")
		if err != nil {
			return false, err.Error()
		}
		starts := map[string]bool{}
		var seen []string
		for _, tr := range agentTraces {
			decisions := map[string]bool{}
			for _, s := range tr.Spans {
				if s.Operation == "coordinator.decision" && s.Attributes["job"] == "tj" && s.Attributes["to_size"] != "0" {
					decisions[s.SpanID] = true
				}
			}
			for _, s := range tr.Spans {
				seen = append(seen, s.Service+"/"+s.Operation+fmt.Sprint(s.Attributes))
				if s.Operation == "agent.start_job" && s.Attributes["started"] == "true" {
					if !decisions[s.ParentSpanID] {
						return false, fmt.Sprintf("agent.start_job on %s is not a child of a decision", s.Attributes["node"])
					}
					starts[s.Attributes["node"]] = true
				}
			}
		}
		return starts["node-a"] && starts["node-b"], fmt.Sprintf("starts %v among %v", starts, seen)
	})
	for _, tr := range traces {
		for _, s := range tr.Spans {
			if s.Operation == "scale_event" && s.Attributes["from_size"] == "2" && tr.TraceID != resize.TraceID {
				t.Errorf("a scale_event of the resize (node %s) is in another trace %s, not %s", s.Attributes["node"], tr.TraceID, resize.TraceID)
			}
		}
	}
}

// traceComplete says what the resize's trace still lacks ("" when
// nothing): spans of the three services, both nodes' scale events and
// the drained node's agent span, and the downtime.
func traceComplete(tr tracestore.Trace) string {
	services := map[string]bool{}
	events, downtime, drain := 0, false, false
	for _, s := range tr.Spans {
		services[s.Service] = true
		switch s.Operation {
		case "scale_event":
			events++
			if _, ok := s.Attributes["downtime"]; ok {
				downtime = true
			}
		case "agent.drain_job":
			drain = true
		}
	}
	var missing []string
	for _, svc := range []string{"hyperpod-coordinator", "hyperpod-agent", "hyperpodrun"} {
		if !services[svc] {
			missing = append(missing, "a span of "+svc)
		}
	}
	if events < 2 {
		missing = append(missing, fmt.Sprintf("both nodes' scale events (has %d)", events))
	}
	if !downtime {
		missing = append(missing, "the downtime")
	}
	if !drain {
		missing = append(missing, "the agent's drain")
	}
	return strings.Join(missing, ", ")
}

// checkResizeTrace: every span of the trace descends from its one
// decision span, and the hyperpodrun spans tell the story.
func checkResizeTrace(t *testing.T, tr tracestore.Trace) {
	t.Helper()
	byID := map[string]tracestore.Span{}
	var decision tracestore.Span
	for _, s := range tr.Spans {
		byID[s.SpanID] = s
		if s.Operation == "coordinator.decision" {
			if decision.SpanID != "" {
				t.Errorf("two decision spans in the resize's trace")
			}
			decision = s
		}
	}
	var ops []string
	for _, s := range tr.Spans {
		ops = append(ops, s.Service+"/"+s.Operation)
		if s.SpanID == decision.SpanID {
			continue
		}
		cur, hops := s, 0
		for cur.ParentSpanID != "" && cur.SpanID != decision.SpanID && hops < 20 {
			p, ok := byID[cur.ParentSpanID]
			if !ok {
				break
			}
			cur, hops = p, hops+1
		}
		if cur.SpanID != decision.SpanID {
			t.Errorf("%s %s (parent %q) does not descend from the decision span %s", s.Service, s.Operation, s.ParentSpanID, decision.SpanID)
		}
	}
	sort.Strings(ops)
	t.Logf("the resize's trace %s: %d spans: %v", tr.TraceID, len(tr.Spans), ops)
	have := map[string]bool{}
	for _, o := range ops {
		have[o] = true
	}
	for _, want := range []string{"hyperpodrun/scale_event", "hyperpodrun/signal", "hyperpodrun/checkpoint_wait", "hyperpodrun/rendezvous",
		"hyperpodrun/barrier", "hyperpodrun/restart", "hyperpodrun/first_step", "hyperpod-agent/agent.drain_job"} {
		if !have[want] {
			t.Errorf("the resize's trace has no %s span; it has %v", want, ops)
		}
	}
	for _, s := range tr.Spans {
		if s.Operation != "scale_event" {
			continue
		}
		a := s.Attributes
		if a["job"] != "tj" || a["team"] != "t" || a["from_size"] != "2" || a["to_size"] != "1" || a["node"] == "" || a["generation"] == "" {
			t.Errorf("scale_event on %s: attributes %v lack job, team, node, generation or from/to size", a["node"], a)
		}
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

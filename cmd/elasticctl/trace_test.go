package main

import (
	"context"
	"encoding/json"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"

	"github.com/hyperpodrun/hyperpodrun/internal/jaegertest"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/coordinator"
	"github.com/hyperpodrun/hyperpodrun/operator-shim/policy"
)

// startTracedCoordinator runs a coordinator that exports its spans to
// Jaeger over OTLP/HTTP, as hyperpod-coordinator does with
// OTEL_EXPORTER_OTLP_ENDPOINT set.
func startTracedCoordinator(t *testing.T, cli *clientv3.Client, j *jaegertest.Jaeger) {
	t.Helper()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(j.OTLPHTTP+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(coordinatorService))))
	coord := coordinator.New(cli, coordinator.Config{Engine: policy.Config{MinStablePeriod: -1}, Resync: 100 * time.Millisecond, Tracer: tp})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { coord.Run(ctx); close(done) }()
	t.Cleanup(func() {
		stop()
		<-done
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		tp.Shutdown(sctx)
	})
}

// describe job --trace reads the job's scale events back from a real
// Jaeger and shows them as waterfalls, newest first: the user's resize
// with its sizes, code and who asked; --svg draws them; -o json carries
// them; a store that does not answer is an error that names the flag.
func TestDescribeTraceShowsTheResizesWaterfalls(t *testing.T) {
	j := jaegertest.Start(t)
	ep, cli := startFleet(t, 2)
	startTracedCoordinator(t, cli, j)
	mustCtl(t, ep, "apply", "-f", writeFile(t, "teams.yaml", teamsYAML))
	mustCtl(t, ep, "submit", "-f", writeFile(t, "sweep.yaml", strings.Replace(elasticJob, "maxNodes: 4", "maxNodes: 2", 1)))
	waitJobRow(t, ep, "sweep", "2", "1:2")
	mustCtl(t, ep, "resize", "job", "sweep", "--max", "1")
	waitJobRow(t, ep, "sweep", "1", "1:1")
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	svg := filepath.Join(t.TempDir(), "sweep.svg")
	var out string
	testutil.Eventually(t, 30*time.Second, "describe --trace showing both scale events", func() (bool, string) {
		out = mustCtl(t, ep, "describe", "job", "sweep", "--trace", "--trace-query", j.Query, "--svg", svg)
		return strings.Count(out, "coordinator.decision") == 2, out
	})
	shrink := strings.Index(out, "2→1 SpecChanged by user "+u.Username)
	admit := strings.Index(out, "0→2 WithinQuota")
	if shrink < 0 || admit < 0 || shrink > admit {
		t.Errorf("describe --trace: want the resize (2→1 SpecChanged by user %s) above the admission (0→2):\n%s", u.Username, out)
	}
	for _, want := range []string{"Traces:     the last 2 scale event(s) of job sweep, newest first (from " + j.Query + ")",
		"reason: shrunk from 2 to 1 nodes at the user's request", "|#", coordinatorService} {
		if !strings.Contains(out, want) {
			t.Errorf("describe --trace lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(svg)
	if err != nil || strings.Count(string(b), `class="span"`) != 2 || !strings.Contains(string(b), "2→1 SpecChanged by user "+u.Username) {
		t.Errorf("--svg: %v\n%s", err, b)
	}
	var d struct{ Traces []struct{ TraceID string } }
	if js := mustCtl(t, ep, "describe", "job", "sweep", "--trace", "--trace-query", j.Query, "-o", "json"); json.Unmarshal([]byte(js), &d) != nil || len(d.Traces) != 2 {
		t.Errorf("describe --trace -o json: %d traces\n%s", len(d.Traces), js)
	}
	// Only the last --trace-limit.
	if out := mustCtl(t, ep, "describe", "job", "sweep", "--trace", "--trace-query", j.Query, "--trace-limit", "1"); strings.Count(out, "coordinator.decision") != 1 || !strings.Contains(out, "2→1") {
		t.Errorf("--trace-limit 1:\n%s", out)
	}
	// A store that does not answer: the description, then an error.
	dead := "http://127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
	out, errs, code := ctl(t, ep, "describe", "job", "sweep", "--trace", "--trace-query", dead)
	if code != 1 || !strings.Contains(out, "Job:        sweep") || !strings.Contains(errs, "--trace-query") {
		t.Errorf("a dead store: exit %d\n%s\n%s", code, out, errs)
	}
	if _, errs, code := ctl(t, ep, "describe", "job", "sweep", "--svg", svg); code != 2 || !strings.Contains(errs, "give --trace too") {
		t.Errorf("--svg without --trace: exit %d %q", code, errs)
	}
	if _, errs, code := ctl(t, ep, "describe", "team", "research", "--trace"); code != 2 || !strings.Contains(errs, "describe job NAME --trace") {
		t.Errorf("describe team --trace: exit %d %q", code, errs)
	}
}

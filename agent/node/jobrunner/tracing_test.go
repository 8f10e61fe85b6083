package jobrunner

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestTracingEnvRules(t *testing.T) {
	for _, tc := range []struct {
		rule    string
		t       JobTracing
		team    string
		headers string
		own     map[string]string
		want    []string
	}{
		{"no endpoint: no tracing variable at all", JobTracing{}, "t", "", nil, nil},
		{"an endpoint: otlp over http/protobuf, the service and the node, job and team", JobTracing{Endpoint: "http://c:4318"}, "t", "", nil, []string{
			"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
			"OTEL_RESOURCE_ATTRIBUTES=hyperpodrun.node=node-a,hyperpodrun.job=j,hyperpodrun.team=t",
			"OTEL_SERVICE_NAME=hyperpodrun", "OTEL_TRACES_EXPORTER=otlp"}},
		{"grpc as given; no team, no team attribute", JobTracing{Endpoint: "http://c:4317", Protocol: "grpc"}, "", "", nil, []string{
			"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
			"OTEL_RESOURCE_ATTRIBUTES=hyperpodrun.node=node-a,hyperpodrun.job=j",
			"OTEL_SERVICE_NAME=hyperpodrun", "OTEL_TRACES_EXPORTER=otlp"}},
		{"headers travel as a file path, never as values", JobTracing{Endpoint: "http://c:4318", HeadersFile: "/etc/agent/h"}, "t", "/run/x/otlp.headers", nil, []string{
			"HYPERPODRUN_OTLP_HEADERS_FILE=/run/x/otlp.headers",
			"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
			"OTEL_RESOURCE_ATTRIBUTES=hyperpodrun.node=node-a,hyperpodrun.job=j,hyperpodrun.team=t",
			"OTEL_SERVICE_NAME=hyperpodrun", "OTEL_TRACES_EXPORTER=otlp"}},
		{"the job's own run.env wins", JobTracing{Endpoint: "http://c:4318"}, "t", "", map[string]string{"OTEL_SERVICE_NAME": "trainer", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://mine:4318"}, []string{
			"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
			"OTEL_RESOURCE_ATTRIBUTES=hyperpodrun.node=node-a,hyperpodrun.job=j,hyperpodrun.team=t",
			"OTEL_TRACES_EXPORTER=otlp"}},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			got := tracingEnv(tc.t, "node-a", "j", tc.team, tc.headers, tc.own)
			if !slices.Equal(got, tc.want) {
				t.Errorf("tracingEnv =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestJobTracingCheckRules(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	bad := filepath.Join(dir, "bad")
	os.WriteFile(good, []byte("authorization=Bearer%20x\n"), 0o600)
	os.WriteFile(bad, []byte("just-a-token\n"), 0o600)
	for _, tc := range []struct {
		rule string
		t    JobTracing
		ok   bool
	}{
		{"nothing: no tracing", JobTracing{}, true},
		{"an http endpoint", JobTracing{Endpoint: "http://127.0.0.1:4318"}, true},
		{"grpc with headers", JobTracing{Endpoint: "https://c:4317", Protocol: "grpc", HeadersFile: good}, true},
		{"a protocol without an endpoint", JobTracing{Protocol: "grpc"}, false},
		{"headers without an endpoint", JobTracing{HeadersFile: good}, false},
		{"an endpoint without a scheme", JobTracing{Endpoint: "c:4318"}, false},
		{"an unknown protocol", JobTracing{Endpoint: "http://c:4318", Protocol: "http/json"}, false},
		{"a missing headers file", JobTracing{Endpoint: "http://c:4318", HeadersFile: filepath.Join(dir, "none")}, false},
		{"a malformed headers file, not repeated", JobTracing{Endpoint: "http://c:4318", HeadersFile: bad}, false},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			err := tc.t.Check()
			if (err == nil) != tc.ok {
				t.Fatalf("Check() = %v, want ok %v", err, tc.ok)
			}
			if err != nil && strings.Contains(err.Error(), "just-a-token") {
				t.Errorf("the error repeats the headers file: %v", err)
			}
		})
	}
}

package telemetry

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The rule of Enabled, by the specification's variables.
func TestEnabledRules(t *testing.T) {
	for _, tc := range []struct {
		rule string
		env  map[string]string
		want bool
	}{
		{"nothing set: no-op", nil, false},
		{"an OTLP endpoint: otlp", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
		{"a traces endpoint: otlp", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true},
		{"exporter otlp without endpoint: the default endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{"exporter console", map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
		{"exporter none beats an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{"SDK disabled beats an exporter", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"}, false},
		{"SDK disabled is case-insensitive", map[string]string{"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{"SDK disabled=false is not disabled", map[string]string{"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := enabled(func(k string) string { return tc.env[k] }); got != tc.want {
				t.Errorf("enabled(%v) = %v, want %v", tc.env, got, tc.want)
			}
		})
	}
}

func TestParseHeadersRules(t *testing.T) {
	for _, tc := range []struct {
		rule, in string
		want     map[string]string
		err      bool
	}{
		{"one pair", "authorization=Bearer%20tok", map[string]string{"authorization": "Bearer tok"}, false},
		{"comma-separated, spaces trimmed", " a=1 , b = 2 ", map[string]string{"a": "1", "b": "2"}, false},
		{"newline-separated file with a trailing newline", "a=1\nb=2\n", map[string]string{"a": "1", "b": "2"}, false},
		{"a value may hold '='", "x-sig=a=b", map[string]string{"x-sig": "a=b"}, false},
		{"empty file: no headers", "\n", map[string]string{}, false},
		{"no '=' is refused", "token", nil, true},
		{"an empty key is refused", "=v", nil, true},
		{"a bad escape is refused", "a=%zz", nil, true},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			got, err := ParseHeaders(tc.in)
			if (err != nil) != tc.err {
				t.Fatalf("ParseHeaders(%q) error %v, want error %v", tc.in, err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), "tok") {
				t.Errorf("the error repeats the entry: %v", err)
			}
			if !tc.err && !equalMaps(got, tc.want) {
				t.Errorf("ParseHeaders(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// clearOTEL empties every OTEL_ variable and the headers file variable
// for the test.
func clearOTEL(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "")
		}
	}
	t.Setenv(HeadersFileEnv, "")
}

// The resource names the service, the node and job given by the program,
// and OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win as the
// specification says.
func TestResourceFromProgramAndEnvironment(t *testing.T) {
	clearOTEL(t)
	res, err := newResource(context.Background(), "hyperpodrun", []attribute.KeyValue{attribute.String(NodeAttr, "node-a"), attribute.String(JobAttr, "j")})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range res.Attributes() {
		got[string(kv.Key)] = kv.Value.String()
	}
	host, _ := os.Hostname()
	for k, want := range map[string]string{"service.name": "hyperpodrun", NodeAttr: "node-a", JobAttr: "j", "host.name": host} {
		if got[k] != want {
			t.Errorf("resource %s = %q, want %q (all: %v)", k, got[k], want, got)
		}
	}
	t.Setenv("OTEL_SERVICE_NAME", "trainer")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", NodeAttr+"=node-b,team=t1")
	res, err = newResource(context.Background(), "hyperpodrun", []attribute.KeyValue{attribute.String(NodeAttr, "node-a")})
	if err != nil {
		t.Fatal(err)
	}
	got = map[string]string{}
	for _, kv := range res.Attributes() {
		got[string(kv.Key)] = kv.Value.String()
	}
	for k, want := range map[string]string{"service.name": "trainer", NodeAttr: "node-b", "team": "t1"} {
		if got[k] != want {
			t.Errorf("with OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES: resource %s = %q, want %q", k, got[k], want)
		}
	}
}

// OTEL_TRACES_EXPORTER=console prints the spans on standard output (of
// a child process: the exporter holds the real standard output).
func TestConsoleExporter(t *testing.T) {
	if os.Getenv("TELEMETRY_CONSOLE_CHILD") == "1" {
		tp, shutdown, err := Setup(context.Background(), "console-test")
		if err != nil {
			t.Fatal(err)
		}
		_, span := tp.Tracer("t").Start(context.Background(), "console-span")
		span.End()
		if err := shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		return
	}
	clearOTEL(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestConsoleExporter$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TELEMETRY_CONSOLE_CHILD=1", "OTEL_TRACES_EXPORTER=console")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"Name":"console-span"`) || !strings.Contains(string(out), "console-test") {
		t.Errorf("console exporter printed %q, want the span and its service", out)
	}
}

// Headers from HYPERPODRUN_OTLP_HEADERS_FILE reach the collector with
// every export, over HTTP (the default protocol) and not through the
// environment.
func TestHeadersFileReachesTheCollector(t *testing.T) {
	clearOTEL(t)
	var mu sync.Mutex
	var auth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "headers")
	if err := os.WriteFile(file, []byte("Authorization=Bearer%20s3cret\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv(HeadersFileEnv, file)
	tp, shutdown, err := Setup(context.Background(), "headers-test")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tp.(*sdktrace.TracerProvider); !ok {
		t.Fatalf("Setup returned %T, want an SDK provider", tp)
	}
	_, span := tp.Tracer("t").Start(context.Background(), "x")
	span.End()
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(auth) == 0 || auth[0] != "Bearer s3cret" {
		t.Errorf("collector saw Authorization %q, want the file's header", auth)
	}
	t.Setenv(HeadersFileEnv, filepath.Join(t.TempDir(), "missing"))
	if _, _, err := Setup(context.Background(), "headers-test"); err == nil || !strings.Contains(err.Error(), HeadersFileEnv) {
		t.Errorf("a missing headers file: %v, want an error naming %s", err, HeadersFileEnv)
	}
}

// Package jaegertest starts a real Jaeger v2 (the `jaeger` binary: OTLP
// receiver, in-memory storage, query API) on loopback for a test, and reads
// back what was exported to it through the query API (internal/tracestore).
//
// The binary is built from github.com/jaegertracing/jaeger at a pinned
// release by scripts/jaeger.sh and cached outside the repository ($JAEGER,
// else $JAEGER_CACHE or /var/cache/hyperpodrun). When it is absent, the tests
// that need it skip with a message saying how to build it, unless $CI is set:
// there they fail, since .ci/run builds it.
//
// With $JAEGERTEST_DUMP set to a directory, each Jaeger writes every
// service's traces there (the query API's JSON) before it stops: real
// traces for internal/tracestore's picture (docs/images/resize-trace.svg).
package jaegertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/syncbuf"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/internal/tracestore"
)

// daemonLogLimit bounds the daemon's output kept for a failing test's
// message (a long test's chatty daemon starts the buffer over past it).
const daemonLogLimit = 4 << 20

// Version is the Jaeger release the tests run against.
const Version = "v1.76.0"

// binary is the jaeger of Version that scripts/jaeger.sh builds and caches.
var binary = testutil.CachedBinary{Name: "jaeger", File: "jaeger-" + Version, Env: "JAEGER", CacheEnv: "JAEGER_CACHE",
	Build: "scripts/jaeger.sh", Takes: "a few minutes"}

// Binary returns the jaeger binary's path: $JAEGER, else the cache of
// scripts/jaeger.sh; ok is false when it does not exist.
func Binary() (path string, ok bool) { return binary.Path() }

// Jaeger is a running Jaeger.
type Jaeger struct {
	// OTLPHTTP is the OTLP/HTTP receiver's base URL ("http://127.0.0.1:P"),
	// the value of OTEL_EXPORTER_OTLP_ENDPOINT for the http/protobuf
	// protocol.
	OTLPHTTP string
	// OTLPGRPC is the OTLP/gRPC receiver's address ("127.0.0.1:P").
	OTLPGRPC string
	// Query is the query service's base URL ("http://127.0.0.1:P").
	Query string

	cmd  *exec.Cmd
	done chan struct{}
	log  *syncbuf.Buffer
}

// config is a minimal all-in-one configuration: OTLP in, memory storage,
// the query API, no other listener (the defaults' fixed ports would clash
// between tests).
const config = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 100000
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%d
      http:
        endpoint: 127.0.0.1:%d
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`

// Start runs a Jaeger for the test and stops it when the test ends
// (checking that the process is gone). It skips the test when the binary
// is absent and $CI is unset.
func Start(t testing.TB) *Jaeger {
	t.Helper()
	bin := binary.Require(t)
	dir := t.TempDir()
	var err error
	for try := 1; ; try++ {
		// A free port can be taken by another process before Jaeger
		// binds it: then Jaeger exits at once, and another set is tried.
		var j *Jaeger
		if j, err = start(t, bin, dir); err == nil {
			return j
		}
		if try == 3 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatal(err)
		}
	}
}

// start runs one Jaeger on fresh free ports and waits until it is ready;
// on failure it is stopped.
func start(t testing.TB, bin, dir string) (*Jaeger, error) {
	queryHTTP, queryGRPC, otlpGRPC, otlpHTTP := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	cfg := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, config, queryHTTP, queryGRPC, otlpGRPC, otlpHTTP), 0o600); err != nil {
		return nil, err
	}
	j := &Jaeger{
		OTLPHTTP: "http://127.0.0.1:" + strconv.Itoa(otlpHTTP),
		OTLPGRPC: "127.0.0.1:" + strconv.Itoa(otlpGRPC),
		Query:    "http://127.0.0.1:" + strconv.Itoa(queryHTTP),
		done:     make(chan struct{}), log: &syncbuf.Buffer{Limit: daemonLogLimit},
	}
	j.cmd = exec.Command(bin, "--config", "file:"+cfg)
	j.cmd.Env = quietEnv(os.Environ())
	j.cmd.Stdout, j.cmd.Stderr = j.log, j.log
	j.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := j.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start jaeger: %w", err)
	}
	go func() { j.cmd.Wait(); close(j.done) }()
	if err := j.waitReady(60 * time.Second); err != nil {
		j.stop(t)
		return nil, fmt.Errorf("jaeger not ready: %w\n%s", err, j.log.Tail(4000))
	}
	t.Cleanup(func() {
		if dir := os.Getenv("JAEGERTEST_DUMP"); dir != "" {
			j.dump(t, dir)
		}
		j.stop(t)
	})
	return j, nil
}

// quietEnv is env without the OTel SDK's settings, which Jaeger's own
// telemetry would follow (exporting its spans to the test's collector, or
// to localhost:4317), and with that telemetry off.
func quietEnv(env []string) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "OTEL_") {
			out = append(out, kv)
		}
	}
	return append(out, "OTEL_SDK_DISABLED=true", "OTEL_TRACES_EXPORTER=none")
}

// Traces returns every trace the store holds a span of service in (up to
// 1000), newest first.
func (j *Jaeger) Traces(ctx context.Context, service string) ([]tracestore.Trace, error) {
	return tracestore.NewClient(j.Query).Traces(ctx, service, nil, 1000)
}

// Log is Jaeger's output so far (its last n bytes).
func (j *Jaeger) Log(n int) string { return j.log.Tail(n) }

// dump writes, before Jaeger stops, the query API's answer for every
// service's traces to dir/<test>.<service>.json ($JAEGERTEST_DUMP): real
// traces to render pictures from (internal/tracestore's picture test).
func (j *Jaeger) dump(t testing.TB, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svcs, err := tracestore.NewClient(j.Query).Services(ctx)
	if err != nil {
		t.Errorf("JAEGERTEST_DUMP: %v", err)
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Errorf("JAEGERTEST_DUMP: %v", err)
		return
	}
	for _, svc := range svcs {
		body, err := get(ctx, j.Query+"/api/traces?limit=1000&service="+url.QueryEscape(svc))
		if err == nil {
			name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "." + svc + ".json"
			err = os.WriteFile(filepath.Join(dir, name), body, 0o644)
		}
		if err != nil {
			t.Errorf("JAEGERTEST_DUMP %s: %v", svc, err)
		}
	}
}

func get(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return body, err
}

func (j *Jaeger) stop(t testing.TB) {
	// Killed: its storage is memory, and after SIGTERM it waits 10 s for
	// its query server's connections to close.
	j.cmd.Process.Kill()
	<-j.done
	if err := syscall.Kill(j.cmd.Process.Pid, 0); err == nil {
		t.Errorf("jaeger (pid %d) still alive after stop", j.cmd.Process.Pid)
	}
}

// waitReady waits until the query API answers and the OTLP/HTTP receiver
// accepts connections.
func (j *Jaeger) waitReady(timeout time.Duration) error {
	cl := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-j.done:
			return errors.New("jaeger exited")
		default:
		}
		last = ping(cl, j.Query+"/api/services", http.StatusOK)
		if last == nil {
			// The receiver answers a GET of its traces path with 405.
			last = ping(cl, j.OTLPHTTP+"/v1/traces", http.StatusMethodNotAllowed)
		}
		if last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("after %s: %w", timeout, last)
}

func ping(cl *http.Client, url string, want int) error {
	resp, err := cl.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

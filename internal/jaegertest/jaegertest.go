// Package jaegertest starts a real Jaeger v2 (the `jaeger` binary: OTLP
// receiver, in-memory storage, query API) on loopback for a test, and reads
// back what was exported to it through the query API (internal/tracestore).
//
// The binary is built from github.com/jaegertracing/jaeger at a pinned
// release by scripts/jaeger.sh and cached outside the repository ($JAEGER,
// else $JAEGER_CACHE or /var/cache/hyperpodrun). When it is absent, the tests
// that need it skip with a message saying how to build it, unless $CI is set:
// there they fail, since .ci/run builds it.
package jaegertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
	"github.com/hyperpodrun/hyperpodrun/internal/tracestore"
)

// Version is the Jaeger release the tests run against.
const Version = "v1.76.0"

// Binary returns the jaeger binary's path: $JAEGER, else the cache of
// scripts/jaeger.sh; ok is false when it does not exist.
func Binary() (path string, ok bool) {
	if p := os.Getenv("JAEGER"); p != "" {
		_, err := os.Stat(p)
		return p, err == nil
	}
	dir := os.Getenv("JAEGER_CACHE")
	if dir == "" {
		dir = "/var/cache/hyperpodrun"
	}
	p := filepath.Join(dir, "jaeger-"+Version)
	_, err := os.Stat(p)
	return p, err == nil
}

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
	log  *syncBuffer
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
	bin, ok := Binary()
	if !ok {
		if os.Getenv("CI") != "" {
			t.Fatalf("no jaeger at %s, and $CI is set: .ci/run must build it (scripts/jaeger.sh)", bin)
		}
		t.Skipf("no jaeger at %s: build it with scripts/jaeger.sh (a few minutes; .ci/run does it), or set JAEGER", bin)
	}
	queryHTTP, queryGRPC, otlpGRPC, otlpHTTP := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, config, queryHTTP, queryGRPC, otlpGRPC, otlpHTTP), 0o600); err != nil {
		t.Fatal(err)
	}
	j := &Jaeger{
		OTLPHTTP: "http://127.0.0.1:" + strconv.Itoa(otlpHTTP),
		OTLPGRPC: "127.0.0.1:" + strconv.Itoa(otlpGRPC),
		Query:    "http://127.0.0.1:" + strconv.Itoa(queryHTTP),
		done:     make(chan struct{}), log: &syncBuffer{},
	}
	j.cmd = exec.Command(bin, "--config", "file:"+cfg)
	j.cmd.Stdout, j.cmd.Stderr = j.log, j.log
	j.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := j.cmd.Start(); err != nil {
		t.Fatalf("start jaeger: %v", err)
	}
	go func() { j.cmd.Wait(); close(j.done) }()
	t.Cleanup(func() { j.stop(t) })
	if err := j.waitReady(60 * time.Second); err != nil {
		t.Fatalf("jaeger not ready: %v\n%s", err, j.log.tail(4000))
	}
	return j
}

// Traces returns every trace the store holds a span of service in (up to
// 1000), newest first.
func (j *Jaeger) Traces(ctx context.Context, service string) ([]tracestore.Trace, error) {
	return tracestore.NewClient(j.Query).Traces(ctx, service, nil, 1000)
}

// Log is Jaeger's output so far (its last n bytes).
func (j *Jaeger) Log(n int) string { return j.log.tail(n) }

func (j *Jaeger) stop(t testing.TB) {
	j.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-j.done:
	case <-time.After(15 * time.Second):
		j.cmd.Process.Kill()
		<-j.done
	}
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

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b.Len() > 4<<20 {
		b.b.Reset()
	}
	return b.b.Write(p)
}

func (b *syncBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.b.String()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

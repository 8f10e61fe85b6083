package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/devices"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/syncbuf"
	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

var (
	trn2Sysfs = filepath.Join("..", "..", "devices", "testdata", "neuron", "trn2", "sys", "devices", "virtual", "neuron_device")
	trn2Dev   = filepath.Join("..", "..", "devices", "testdata", "neuron", "trn2", "dev")
)

// syncBuffer is a bytes.Buffer safe for the agent's logger and the test.
type syncBuffer = syncbuf.Buffer

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errb syncBuffer
	code = run(append([]string{"hyperpod-agent"}, args...), &out, &errb, nil)
	return code, out.String(), errb.String()
}

// `hyperpod-agent devices` prints the inventory as a table or as the JSON
// stored in etcd.
func TestDevicesCommand(t *testing.T) {
	code, out, errs := runCLI("devices", "-o", "json", "--disable-nvml", "--node-name", "trn-7",
		"--neuron-sysfs-root", trn2Sysfs, "--dev-root", trn2Dev)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	inv, err := devices.ParseInventory("stdout", []byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if inv.Node != "trn-7" || inv.Flavor != "trainium2" || len(inv.NeuronDevices()) != 16 || inv.NeuronCores() != 64 {
		t.Errorf("inventory: node %q flavor %q", inv.Node, inv.Flavor)
	}

	code, out, errs = runCLI("devices", "--disable-nvml", "--neuron-sysfs-root", trn2Sysfs, "--dev-root", trn2Dev)
	if code != exitOK || !strings.Contains(out, "NEURON  15") || !strings.Contains(out, "Trainium2") || !strings.Contains(out, "8 (4 logical)") {
		t.Errorf("table exit %d:\n%s%s", code, out, errs)
	}

	// A corrupt tree: the table still prints, the error names the file, exit 1.
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS(filepath.Join("..", "..", "devices", "testdata", "neuron", "inf2"))); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(root, "sys", "devices", "virtual", "neuron_device", "neuron4", "core_count")
	if err := os.WriteFile(bad, []byte("two"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runCLI("devices", "--disable-nvml", "--neuron-sysfs-root", filepath.Join(root, "sys", "devices", "virtual", "neuron_device"),
		"--dev-root", filepath.Join(root, "dev"))
	if code != exitFailure || !strings.Contains(errs, bad) || !strings.Contains(out, "UNHEALTHY") {
		t.Errorf("corrupt tree: exit %d\n%s\n%s", code, out, errs)
	}
}

// Bad flags are a clear error and exit status 2.
func TestUsageErrors(t *testing.T) {
	cacert, cert, key := writeCert(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run"}, "--etcd-endpoints is required"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--lease-ttl", "soon"}, `invalid value "soon" for flag -lease-ttl`},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--lease-ttl", "500ms"}, "--lease-ttl 500ms: must be at least 1s"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--refresh-interval", "1ms"}, "--refresh-interval"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--etcd-prefix", "nodes/"}, "--etcd-prefix"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--etcd-cert", cert}, "--etcd-cert and --etcd-key go together"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--etcd-cacert", "/no/such/ca.pem"}, "--etcd-cacert: stat /no/such/ca.pem"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--etcd-cacert", cacert, "--etcd-cert", cert, "--etcd-key", cacert}, "etcd TLS"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--node-name", "a/b"}, "--node-name"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--listen", "nonsense:99999"}, "listen"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--log-level", "loud"}, "--log-level"},
		{[]string{"run", "--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--job-user", "root"}, "is root: jobs run as an unprivileged user"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--job-user", "no-such-user-zz"}, "--job-user \"no-such-user-zz\""},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--job-etcd-cert", "/c.pem"}, "--job-etcd-cert and --job-etcd-key go together"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--job-uid-range", "0-100"}, "includes uid 0 (root)"},
		{[]string{"run", "--etcd-endpoints", "http://x:2379", "--job-uid-range", "300-200"}, "below the first"},
		{[]string{"devices", "-o", "yaml"}, `--output "yaml"`},
		{[]string{"devices", "extra"}, "unexpected arguments"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
	} {
		code, _, errs := runCLI(c.args...)
		if code != exitUsage || !strings.Contains(errs, c.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", c.args, code, errs, c.want)
		}
	}
	// Good TLS flags pass validation (the run then fails later, not here).
	full := etcdconn.Options{CACert: cacert, Cert: cert, Key: key}
	if _, err := full.TLSConfig(); err != nil {
		t.Errorf("TLS config: %v", err)
	}
	caOnly := etcdconn.Options{CACert: cacert}
	if cfg, err := caOnly.TLSConfig(); err != nil || cfg.RootCAs == nil {
		t.Errorf("CA-only TLS: %v", err)
	}
}

// `hyperpod-agent run --embedded-etcd` registers, serves /healthz and
// /metrics, and drains on SIGTERM with exit status 0.
func TestRunEmbeddedAndSIGTERM(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))

	sig := make(chan os.Signal, 2)
	var out, errb syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"hyperpod-agent", "run", "--log-format", "json", "--embedded-etcd", "--listen", addr, "--job-user", "nobody",
			"--node-name", "try-1", "--lease-ttl", "2s", "--disable-nvml",
			"--neuron-sysfs-root", trn2Sysfs, "--dev-root", trn2Dev}, &out, &errb, sig)
	}()
	testutil.Eventually(t, 20*time.Second, "the agent to be healthy", func() (bool, string) {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false, fmt.Sprintf("%v\n%s", err, errb.String())
		}
		resp.Body.Close()
		return resp.StatusCode == 200, fmt.Sprintf("%s\n%s", resp.Status, errb.String())
	})
	resp, err := http.Get("http://" + addr + "/inventory")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var inv devices.Inventory
	if err := json.Unmarshal(body, &inv); err != nil || inv.Flavor != "trainium2" || inv.State != devices.StateReady {
		t.Fatalf("/inventory: %v %s", err, body)
	}

	sig <- syscall.SIGTERM
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("exit %d\n%s", code, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no exit within 20s of SIGTERM")
	}
	logs := errb.String()
	for _, want := range []string{`"msg":"registered"`, `"msg":"signal received; draining"`, `"msg":"drained; leases revoked"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
}

// writeCert writes a self-signed CA certificate and key (PEM).
func writeCert(t *testing.T) (cacert, cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "hyperpod-agent-test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert = filepath.Join(dir, "tls.crt")
	key = filepath.Join(dir, "tls.key")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, cert, key
}

// An agent running as root refuses to run jobs as root unless told so.
func TestRootAgentNeedsAJobUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only an agent running as root refuses")
	}
	var stderr strings.Builder
	code := run([]string{"hyperpod-agent", "run", "--embedded-etcd"}, &strings.Builder{}, &stderr, nil)
	if code != 2 || !strings.Contains(stderr.String(), "give --job-user <unprivileged user>") {
		t.Errorf("exit %d, %q; want 2 and the way out", code, stderr.String())
	}
}

// The base of the jobs' run directories holds every job's password file
// and TMPDIR: one someone else owns or anyone may write is refused before
// the agent starts, with what is wrong and the fix.
func TestRunDirBaseIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a directory someone else owns")
	}
	for _, tc := range []struct {
		name  string
		setup func(d string)
		want  string
	}{
		{"owned by nobody", func(d string) { os.Chown(d, 65534, 65534) }, "is owned by uid 65534, not by root or the agent"},
		{"mode 0777", func(d string) { os.Chmod(d, 0o777) }, "is writable by group or others (mode 0777)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := os.MkdirTemp("", "hpa")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(d)
			tc.setup(d)
			code, _, errs := runCLI("run", "--embedded-etcd", "--job-uid-range", "200000-299999", "--job-run-dir", d, "--disable-nvml",
				"--neuron-sysfs-root", trn2Sysfs, "--dev-root", trn2Dev, "--node-name", "try-1", "--listen", "")
			if code != exitUsage || !strings.Contains(errs, "--job-run-dir: "+d+" "+tc.want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, errs, tc.want)
			}
		})
	}
}

// The jobs' tracing flags are checked before anything starts, and a bad
// headers file's text is never repeated (it may hold a token).
func TestJobTracingFlagsChecked(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "headers")
	if err := os.WriteFile(bad, []byte("Bearer-s3cret-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--job-otlp-protocol", "grpc"}, "need --job-otlp-endpoint"},
		{[]string{"--job-otlp-endpoint", "collector:4318"}, "--job-otlp-endpoint \"collector:4318\": want http(s)://host:port"},
		{[]string{"--job-otlp-endpoint", "http://c:4318", "--job-otlp-protocol", "carrier-pigeon"}, "--job-otlp-protocol \"carrier-pigeon\""},
		{[]string{"--job-otlp-endpoint", "http://c:4318", "--job-otlp-headers-file", "/no/such/headers"}, "--job-otlp-headers-file: open /no/such/headers"},
		{[]string{"--job-otlp-endpoint", "http://c:4318", "--job-otlp-headers-file", bad}, "is not key=value"},
	} {
		code, _, errs := runCLI(append([]string{"run", "--etcd-endpoints", "http://x:2379"}, c.args...)...)
		if code != exitUsage || !strings.Contains(errs, c.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", c.args, code, errs, c.want)
		}
		if strings.Contains(errs, "s3cret") {
			t.Errorf("%q: stderr repeats the headers file: %q", c.args, errs)
		}
	}
}

package etcdflags

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
)

// parse runs a command declaring s's flags with args and returns what
// Parse made of them.
func parse(t *testing.T, s Set, args ...string) (etcdconn.Options, string, error) {
	t.Helper()
	var o etcdconn.Options
	var prefix string
	var perr error
	app := &cli.App{Name: "cmd", Flags: s.Flags(), Writer: &strings.Builder{}, ErrWriter: &strings.Builder{},
		ExitErrHandler: func(*cli.Context, error) {},
		Action: func(c *cli.Context) error {
			o, prefix, perr = s.Parse(c)
			return nil
		}}
	if err := app.Run(append([]string{"cmd"}, args...)); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return o, prefix, perr
}

// Each flag's HYPERPOD_ETCD_* variable sets it on every command; a flag on
// the command line wins; elasticctl's own ELASTICCTL_ETCD_* come first; a
// fallback (elasticctl's context) fills what neither gives.
func TestParseSources(t *testing.T) {
	ca, cert, key := writeCert(t)
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	type want struct {
		eps                 string
		prefix              string
		ca, cert, key, user string
		password            string
	}
	def := want{eps: "http://127.0.0.1:2379", prefix: "/hyperpodrun"}
	daemon := Set{DefaultEndpoints: []string{DefaultEndpoint}}
	ctl := Set{EnvPrefix: "ELASTICCTL_ETCD_", DefaultEndpoints: []string{DefaultEndpoint}}
	for _, tc := range []struct {
		name string
		set  Set
		env  map[string]string
		args []string
		want func(w *want)
	}{
		{name: "defaults", set: daemon, want: func(*want) {}},
		{name: "HYPERPOD_ETCD_ENDPOINTS", set: daemon, env: map[string]string{"HYPERPOD_ETCD_ENDPOINTS": "h1:1,h2:2"},
			want: func(w *want) { w.eps = "http://h1:1 http://h2:2" }},
		{name: "HYPERPOD_ETCD_PREFIX", set: daemon, env: map[string]string{"HYPERPOD_ETCD_PREFIX": "/team-a"},
			want: func(w *want) { w.prefix = "/team-a" }},
		{name: "HYPERPOD_ETCD_CACERT", set: daemon, env: map[string]string{"HYPERPOD_ETCD_CACERT": ca},
			want: func(w *want) { w.ca, w.eps = ca, "https://127.0.0.1:2379" }},
		{name: "HYPERPOD_ETCD_CERT and _KEY", set: daemon, env: map[string]string{"HYPERPOD_ETCD_CERT": cert, "HYPERPOD_ETCD_KEY": key},
			want: func(w *want) { w.cert, w.key, w.eps = cert, key, "https://127.0.0.1:2379" }},
		{name: "HYPERPOD_ETCD_USER and _PASSWORD", set: daemon, env: map[string]string{"HYPERPOD_ETCD_USER": "u", "HYPERPOD_ETCD_PASSWORD": "p"},
			want: func(w *want) { w.user, w.password = "u", "p" }},
		{name: "HYPERPOD_ETCD_PASSWORD_FILE wins over _PASSWORD", set: daemon,
			env:  map[string]string{"HYPERPOD_ETCD_USER": "u", "HYPERPOD_ETCD_PASSWORD_FILE": pwFile, "HYPERPOD_ETCD_PASSWORD": "p"},
			want: func(w *want) { w.user, w.password = "u", "s3cret" }},
		{name: "flags win over the environment", set: daemon, env: map[string]string{"HYPERPOD_ETCD_ENDPOINTS": "env:1", "HYPERPOD_ETCD_PREFIX": "/env"},
			args: []string{"--etcd-endpoints", "flag:1", "--etcd-endpoints", "flag:2", "--etcd-prefix", "/flag"},
			want: func(w *want) { w.eps, w.prefix = "http://flag:1 http://flag:2", "/flag" }},
		{name: "elasticctl's variables come first", set: ctl,
			env:  map[string]string{"ELASTICCTL_ETCD_ENDPOINTS": "ctl:1", "HYPERPOD_ETCD_ENDPOINTS": "hp:1", "HYPERPOD_ETCD_USER": "u", "ELASTICCTL_ETCD_PASSWORD": "ctlpw", "HYPERPOD_ETCD_PASSWORD": "hppw"},
			want: func(w *want) { w.eps, w.user, w.password = "http://ctl:1", "u", "ctlpw" }},
		{name: "elasticctl reads HYPERPOD_ETCD_* too", set: ctl, env: map[string]string{"HYPERPOD_ETCD_PREFIX": "/hp"},
			want: func(w *want) { w.prefix = "/hp" }},
		{name: "the fallback fills what is not given", set: Set{DefaultEndpoints: []string{DefaultEndpoint}, Fallback: Values{Endpoints: "ctx:1", Prefix: "/ctx", User: "cu"}},
			args: []string{"--etcd-prefix", "/flag"},
			want: func(w *want) { w.eps, w.prefix, w.user = "http://ctx:1", "/flag", "cu" }},
		{name: "no endpoint where none is needed", set: Set{NoEndpoints: true},
			want: func(w *want) { w.eps = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			w := def
			tc.want(&w)
			o, prefix, err := parse(t, tc.set, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			eps := ""
			if len(o.Endpoints) > 0 {
				got, err := etcdconn.ParseEndpoints(o.Endpoints, schemeOf(t, o), "--etcd-endpoints")
				if err != nil {
					t.Fatal(err)
				}
				eps = strings.Join(got, " ")
			}
			got := want{eps: eps, prefix: prefix, ca: o.CACert, cert: o.Cert, key: o.Key, user: o.User, password: o.Password}
			if got != w {
				t.Errorf("got %+v\nwant %+v", got, w)
			}
		})
	}
}

// schemeOf is the scheme etcdconn gives bare endpoints: https with TLS.
func schemeOf(t *testing.T, o etcdconn.Options) string {
	cfg, err := o.TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		return "https"
	}
	return "http"
}

// Every bad value is refused before anything connects, with an error that
// names the flag and says what to give instead.
func TestParseRefuses(t *testing.T) {
	_, cert, _ := writeCert(t)
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	empty := filepath.Join(dir, "empty")
	notPEM := filepath.Join(dir, "ca.txt")
	for f, mode := range map[string]os.FileMode{open: 0o644, empty: 0o600, notPEM: 0o600} {
		body := "pw\n"
		if f == empty {
			body = "\n"
		}
		if err := os.WriteFile(f, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	daemon := Set{DefaultEndpoints: []string{DefaultEndpoint}}
	for _, tc := range []struct {
		name string
		set  Set
		env  map[string]string
		args []string
		want []string
	}{
		{name: "relative prefix", set: daemon, args: []string{"--etcd-prefix", "nodes/"}, want: []string{`--etcd-prefix "nodes/"`, "want an absolute key prefix like /hyperpodrun"}},
		{name: "root prefix", set: daemon, args: []string{"--etcd-prefix", "/"}, want: []string{`--etcd-prefix "/"`, "absolute key prefix like /hyperpodrun"}},
		{name: "trailing slash", set: daemon, args: []string{"--etcd-prefix", "/team/"}, want: []string{`--etcd-prefix "/team/"`, "drop the trailing slash: /team"}},
		{name: "empty segment", set: daemon, args: []string{"--etcd-prefix", "/a//b"}, want: []string{"--etcd-prefix", "empty segment"}},
		{name: "space in prefix", set: daemon, args: []string{"--etcd-prefix", "/a b"}, want: []string{"--etcd-prefix", "spaces"}},
		{name: "bad prefix from the environment", set: daemon, env: map[string]string{"HYPERPOD_ETCD_PREFIX": "x"}, want: []string{`--etcd-prefix "x"`}},
		{name: "missing endpoints", set: Set{RequiredHint: "(or --embedded-etcd for a local try-out)"}, want: []string{"--etcd-endpoints is required (or --embedded-etcd for a local try-out)"}},
		{name: "bad endpoint", set: daemon, args: []string{"--etcd-endpoints", "ftp://h:1"}, want: []string{"--etcd-endpoints: bad etcd endpoint", "want host:port"}},
		{name: "cert without key", set: daemon, args: []string{"--etcd-cert", cert}, want: []string{"--etcd-cert and --etcd-key go together"}},
		{name: "missing CA file", set: daemon, args: []string{"--etcd-cacert", "/no/such/ca.pem"}, want: []string{"--etcd-cacert: stat /no/such/ca.pem"}},
		{name: "CA file without PEM", set: daemon, args: []string{"--etcd-cacert", notPEM}, want: []string{"--etcd-cacert: " + notPEM + " holds no PEM certificate"}},
		{name: "CA missing with no endpoint needed", set: Set{NoEndpoints: true}, args: []string{"--etcd-cacert", "/no/such/ca.pem"}, want: []string{"--etcd-cacert: stat"}},
		{name: "password file others read", set: daemon, args: []string{"--etcd-user", "u", "--etcd-password-file", open}, want: []string{"--etcd-password-file", "chmod 600 " + open}},
		{name: "empty password file", set: daemon, args: []string{"--etcd-user", "u", "--etcd-password-file", empty}, want: []string{"--etcd-password-file", "want the etcd user's password on its first line"}},
		{name: "missing password file", set: daemon, args: []string{"--etcd-user", "u", "--etcd-password-file", "/no/such/pw"}, want: []string{"--etcd-password-file: stat /no/such/pw"}},
		{name: "password without user", set: daemon, env: map[string]string{"HYPERPOD_ETCD_PASSWORD": "p"}, want: []string{"without --etcd-user", "$HYPERPOD_ETCD_PASSWORD"}},
		{name: "elasticctl password without user", set: Set{EnvPrefix: "ELASTICCTL_ETCD_", DefaultEndpoints: []string{DefaultEndpoint}},
			env: map[string]string{"ELASTICCTL_ETCD_PASSWORD": "p"}, want: []string{"without --etcd-user", "$ELASTICCTL_ETCD_PASSWORD"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, _, err := parse(t, tc.set, tc.args...)
			if err == nil {
				t.Fatalf("%q accepted", tc.args)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v; want %q", err, w)
				}
			}
		})
	}
}

// Every command declares the same flags with the same variables.
func TestFlagsAreTheSameEverywhere(t *testing.T) {
	names := func(s Set) (out []string) {
		for _, f := range s.Flags() {
			out = append(out, f.Names()[0])
			if ev, ok := f.(interface{ GetEnvVars() []string }); ok {
				out = append(out, ev.GetEnvVars()...)
			}
		}
		return out
	}
	daemon := names(Set{})
	for _, want := range []string{Endpoints, "HYPERPOD_ETCD_ENDPOINTS", Prefix, "HYPERPOD_ETCD_PREFIX", CACert, "HYPERPOD_ETCD_CACERT", Cert, "HYPERPOD_ETCD_CERT",
		Key, "HYPERPOD_ETCD_KEY", User, "HYPERPOD_ETCD_USER", PasswordFile, "HYPERPOD_ETCD_PASSWORD_FILE"} {
		if !slices.Contains(daemon, want) {
			t.Errorf("the flags lack %s: %v", want, daemon)
		}
	}
	ctl := names(Set{EnvPrefix: "ELASTICCTL_ETCD_"})
	for _, n := range daemon {
		if !slices.Contains(ctl, n) {
			t.Errorf("elasticctl's flags lack %s: %v", n, ctl)
		}
	}
}

// writeCert writes a self-signed certificate and its key (PEM); the
// certificate is also the CA.
func writeCert(t *testing.T) (cacert, cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcdflags-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
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
	cert, key = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, cert, key
}

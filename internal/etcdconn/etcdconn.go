// Package etcdconn is the one place an etcd client is set up: endpoints
// parsed from flags, TLS from PEM files, user and password, a dial timeout,
// and a reachability probe, with errors that name the caller's own flags
// (hyperpodrun's --rdzv-endpoint and --rdzv-conf keys, the daemons' and
// elasticctl's --etcd-* flags).
package etcdconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// DefaultDialTimeout bounds the reachability check when Options leaves it zero.
const DefaultDialTimeout = 5 * time.Second

// ReconnectBackoff is how a client re-dials etcd after its connection
// broke. gRPC's default grows to 120 s: after a one-minute etcd outage a
// client could wait 40 s more before it tried again, and a node that came
// back that late found its job finished without it (its peers had
// rejoined, re-formed the job and trained to the end). Capped at 2 s with
// 20 % jitter, every client is back within about 2.4 s of etcd, and 5,000
// nodes retrying a dead etcd cost it about 2,500 refused dials a second,
// spread by the jitter.
var ReconnectBackoff = backoff.Config{
	BaseDelay:  100 * time.Millisecond,
	Multiplier: 1.6,
	Jitter:     0.2,
	MaxDelay:   2 * time.Second,
}

// DialOptions are the gRPC options every etcd client of the project
// uses: the bounded ReconnectBackoff.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           ReconnectBackoff,
		MinConnectTimeout: 5 * time.Second,
	})}
}

// Flags names the caller's flags, for error messages.
type Flags struct {
	// Endpoints is the endpoints flag, e.g. "--etcd-endpoints".
	Endpoints string
	// CACert, Cert and Key name the TLS file settings, e.g. "--etcd-cacert"
	// or "--rdzv-conf cacert".
	CACert, Cert, Key string
	// Auth names where TLS and auth settings come from, for the hint on a
	// failed probe, e.g. "--rdzv-conf".
	Auth string
}

// DaemonFlags are the --etcd-* flags of hyperpod-agent,
// hyperpod-coordinator and elasticctl.
var DaemonFlags = Flags{Endpoints: "--etcd-endpoints", CACert: "--etcd-cacert", Cert: "--etcd-cert", Key: "--etcd-key", Auth: "the --etcd-* TLS flags"}

// RdzvFlags are hyperpodrun's --rdzv-endpoint and --rdzv-conf keys.
var RdzvFlags = Flags{Endpoints: "--rdzv-endpoint", CACert: "--rdzv-conf cacert", Cert: "--rdzv-conf cert", Key: "--rdzv-conf key", Auth: "TLS/auth in --rdzv-conf"}

// Options says how to reach etcd.
type Options struct {
	// Endpoints hold "host:port" or URLs, several comma-separated.
	Endpoints []string
	// CACert, Cert and Key are PEM file paths for TLS.
	CACert, Cert, Key string
	// User and Password enable etcd authentication.
	User, Password string
	// Protocol is "http" or "https"; it applies to endpoints given without
	// a scheme. TLS files imply https.
	Protocol string
	// DialTimeout bounds the reachability check (default DefaultDialTimeout).
	DialTimeout time.Duration
	// Logger receives the client's own logs (default: discarded).
	Logger *zap.Logger
	// Flags names the caller's flags in errors (default DaemonFlags).
	Flags Flags
}

func (o *Options) flags() Flags {
	if o.Flags.Endpoints == "" {
		return DaemonFlags
	}
	return o.Flags
}

// ParseEndpoints splits endpoint values ("host:port", URLs, several
// comma-separated) into etcd client URLs. scheme applies to bare host:port
// entries ("http" when empty); a bare host gets etcd's client port, 2379.
// flag names the caller's flag in errors.
func ParseEndpoints(endpoints []string, scheme, flag string) ([]string, error) {
	if scheme == "" {
		scheme = "http"
	}
	var out []string
	for _, e := range endpoints {
		for _, ep := range strings.Split(e, ",") {
			ep = strings.TrimSpace(ep)
			if ep == "" {
				continue
			}
			if !strings.Contains(ep, "://") {
				if _, _, err := net.SplitHostPort(ep); err != nil {
					ep = net.JoinHostPort(strings.Trim(ep, "[]"), "2379")
				}
				ep = scheme + "://" + ep
			}
			u, err := url.Parse(ep)
			if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "unix" && u.Scheme != "unixs") {
				return nil, fmt.Errorf("%s: bad etcd endpoint %q: want host:port or http(s)://host:port", flag, ep)
			}
			out = append(out, ep)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no etcd endpoint given: want host:port[,host:port...]", flag)
	}
	return slices.Compact(out), nil
}

// TLSConfig builds the client TLS config from the PEM files; nil when none
// is given and the protocol is not https.
func (o *Options) TLSConfig() (*tls.Config, error) {
	f := o.flags()
	if o.CACert == "" && o.Cert == "" && o.Key == "" {
		if o.Protocol == "https" {
			return &tls.Config{MinVersion: tls.VersionTLS12}, nil
		}
		return nil, nil
	}
	if (o.Cert == "") != (o.Key == "") {
		return nil, fmt.Errorf("%s and %s go together", f.Cert, f.Key)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CACert != "" {
		pem, err := os.ReadFile(o.CACert)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.CACert, unwrapPath(err))
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: %s holds no PEM certificate", f.CACert, o.CACert)
		}
		cfg.RootCAs = pool
	}
	if o.Cert != "" {
		cert, err := tls.LoadX509KeyPair(o.Cert, o.Key)
		if err != nil {
			return nil, fmt.Errorf("etcd TLS (%s %q, %s %q): %w", f.Cert, o.Cert, f.Key, o.Key, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// unwrapPath keeps "stat <file>: no such file" readable after the flag name.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("stat %s: %w", pe.Path, pe.Err)
	}
	return err
}

// Validate checks the settings without connecting: the endpoints parse,
// the TLS files load, a password comes with a user. Its errors are the
// caller's bad input.
func (o *Options) Validate() error {
	_, _, err := o.resolve()
	return err
}

// resolve returns the endpoint URLs and the TLS config.
func (o *Options) resolve() ([]string, *tls.Config, error) {
	f := o.flags()
	tlsCfg, err := o.TLSConfig()
	if err != nil {
		return nil, nil, err
	}
	scheme := o.Protocol
	if scheme == "" && tlsCfg != nil {
		scheme = "https"
	}
	eps, err := ParseEndpoints(o.Endpoints, scheme, f.Endpoints)
	if err != nil {
		return nil, nil, err
	}
	if o.Password != "" && o.User == "" {
		return nil, nil, errors.New("an etcd password was given without a user")
	}
	return eps, tlsCfg, nil
}

// Connect builds a client and checks that etcd answers. It fails with a
// clear error ("cannot reach etcd at ...; check --etcd-endpoints") when no
// endpoint answers within the dial timeout.
func Connect(ctx context.Context, o Options) (*clientv3.Client, error) {
	f := o.flags()
	eps, tlsCfg, err := o.resolve()
	if err != nil {
		return nil, err
	}
	timeout := o.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	lg := o.Logger
	if lg == nil {
		lg = zap.NewNop()
	}
	joined := strings.Join(eps, ",")
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            eps,
		DialTimeout:          timeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		TLS:                  tlsCfg,
		Username:             o.User,
		Password:             o.Password,
		Logger:               lg,
		MaxCallSendMsgSize:   4 << 20,
		MaxCallRecvMsgSize:   64 << 20,
		DialOptions:          DialOptions(),
	})
	if err != nil {
		return nil, fmt.Errorf("cannot reach etcd at %s: %w; check %s", joined, err, f.Endpoints)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := probe(pctx, cli, eps); err != nil {
		cli.Close()
		return nil, fmt.Errorf("cannot reach etcd at %s within %s: %w; check %s (and %s)", joined, timeout, err, f.Endpoints, f.Auth)
	}
	return cli, nil
}

// probe succeeds when any endpoint answers a Status call.
func probe(ctx context.Context, cli *clientv3.Client, eps []string) error {
	errc := make(chan error, len(eps))
	for _, ep := range eps {
		go func() {
			_, err := cli.Status(ctx, ep)
			errc <- err
		}()
	}
	var errs []error
	for range eps {
		err := <-errc
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errs[0]
}

// PasswordEnv is the environment variable the daemons (hyperpod-agent,
// hyperpod-coordinator) read an etcd password from when no password file
// is given. A password is never a command-line argument: /proc/*/cmdline
// is world-readable.
const PasswordEnv = "HYPERPOD_ETCD_PASSWORD"

// ReadPassword returns the password in file (its first line, without the
// line end) or else in the environment variable env ("" when neither is
// set). flag names the file's flag in errors. A file others may read is
// refused: the password would not be secret.
func ReadPassword(file, env, flag string) (string, error) {
	if file == "" {
		return os.Getenv(env), nil
	}
	fi, err := os.Stat(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, unwrapPath(err))
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("%s: %s is readable by others (mode %04o): chmod 600 %s", flag, file, fi.Mode().Perm(), file)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, unwrapPath(err))
	}
	pw, _, _ := strings.Cut(string(b), "\n")
	pw = strings.TrimRight(pw, "\r")
	if pw == "" {
		return "", fmt.Errorf("%s: %s is empty: want the etcd user's password on its first line", flag, file)
	}
	return pw, nil
}

// SimpleTokens reports whether the etcd cli is logged in to hands out
// "simple" auth tokens (its default) rather than JWTs. A simple token dies
// with an etcd restart, and etcd's Go client then retries its watches with
// the dead token (etcd-io/etcd#11954): a fleet with auth on needs etcd
// started with --auth-token jwt,... (docs/security.md). False without a
// user. It costs one authentication, bounded by authCheckTimeout: an etcd
// that went away after the connection does not hang a daemon's start.
func SimpleTokens(ctx context.Context, cli *clientv3.Client) (bool, error) {
	if cli.Username == "" {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, authCheckTimeout)
	defer cancel()
	resp, err := cli.Authenticate(ctx, cli.Username, cli.Password)
	if err != nil {
		return false, fmt.Errorf("authenticate as %q: %w", cli.Username, err)
	}
	return !strings.HasPrefix(resp.Token, "eyJ"), nil
}

// authCheckTimeout bounds SimpleTokens' authentication.
var authCheckTimeout = DefaultDialTimeout

// SimpleTokenWarning is what the daemons log when SimpleTokens is true.
const SimpleTokenWarning = "etcd hands out simple auth tokens, which die with an etcd restart and leave etcd's Go client retrying its watches; start etcd with --auth-token jwt,pub-key=...,priv-key=...,sign-method=RS256 (docs/security.md)"

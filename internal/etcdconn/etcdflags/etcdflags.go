// Package etcdflags declares the --etcd-* flags of the hyperpod commands
// (hyperpod-agent, hyperpod-coordinator, hyperpod-kube-controller,
// elasticctl) once: the same names, the same HYPERPOD_ETCD_* environment
// variables, and one parse into etcdconn.Options and a validated key
// prefix, whose errors name the flag and the fix. hyperpodrun's
// torchrun-compatible --rdzv-endpoint and --rdzv-conf are not these flags.
package etcdflags

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// The flags' names (without the leading dashes).
const (
	Endpoints    = "etcd-endpoints"
	Prefix       = "etcd-prefix"
	CACert       = "etcd-cacert"
	Cert         = "etcd-cert"
	Key          = "etcd-key"
	User         = "etcd-user"
	PasswordFile = "etcd-password-file"
)

// EnvPrefix begins the environment variable of every flag and of the
// password: HYPERPOD_ETCD_ENDPOINTS, HYPERPOD_ETCD_PREFIX,
// HYPERPOD_ETCD_CACERT, HYPERPOD_ETCD_CERT, HYPERPOD_ETCD_KEY,
// HYPERPOD_ETCD_USER, HYPERPOD_ETCD_PASSWORD_FILE and
// HYPERPOD_ETCD_PASSWORD (etcdconn.PasswordEnv).
const EnvPrefix = "HYPERPOD_ETCD_"

// DefaultEndpoint is where the daemons look for etcd when no endpoint is
// given and one is not required.
const DefaultEndpoint = "127.0.0.1:2379"

// Set says how one command declares and reads the flags. The zero value
// is a daemon's: HYPERPOD_ETCD_* only, endpoints required.
type Set struct {
	// EnvPrefix, when set, begins variables read before the
	// HYPERPOD_ETCD_* ones, e.g. "ELASTICCTL_ETCD_" (elasticctl's own,
	// kept for its users).
	EnvPrefix string
	// DefaultEndpoints are used when no endpoint is given; none makes
	// --etcd-endpoints required.
	DefaultEndpoints []string
	// RequiredHint is appended to the error for a missing endpoint, e.g.
	// "(or --embedded-etcd for a local try-out)".
	RequiredHint string
	// NoEndpoints accepts a missing endpoint (hyperpod-agent's
	// --embedded-etcd): Options.Endpoints is then empty.
	NoEndpoints bool
	// Fallback holds values used for flags not given (elasticctl's config
	// context), before the defaults.
	Fallback Values
	// Auth names where TLS and auth settings come from, in the hint of a
	// failed connection (default etcdconn.DaemonFlags.Auth).
	Auth string
}

// Values are the flags' values as strings; Endpoints comma-separated.
type Values struct {
	Endpoints, Prefix, CACert, Cert, Key, User, PasswordFile string
}

// env names the variables of the flag with suffix, first read first.
func (s Set) env(suffix string) []string {
	if s.EnvPrefix != "" && s.EnvPrefix != EnvPrefix {
		return []string{s.EnvPrefix + suffix, EnvPrefix + suffix}
	}
	return []string{EnvPrefix + suffix}
}

// Flags declares the --etcd-* flags.
func (s Set) Flags() []cli.Flag {
	eps := "etcd endpoints: host:port or URLs, comma-separated or repeated, e.g. https://etcd-0:2379,https://etcd-1:2379"
	if len(s.DefaultEndpoints) > 0 {
		eps += " (default " + strings.Join(s.DefaultEndpoints, ",") + ")"
	}
	return []cli.Flag{
		endpointsFlag{&cli.StringSliceFlag{Name: Endpoints, EnvVars: s.env("ENDPOINTS"), Usage: eps}},
		&cli.StringFlag{Name: Prefix, EnvVars: s.env("PREFIX"), Usage: "key prefix of the fleet in etcd (default " + fleet.DefaultPrefix + ")"},
		&cli.StringFlag{Name: CACert, EnvVars: s.env("CACERT"), Usage: "PEM file of the CA that signed etcd's server certificate (enables TLS)"},
		&cli.StringFlag{Name: Cert, EnvVars: s.env("CERT"), Usage: "PEM client certificate for etcd (with --etcd-key)"},
		&cli.StringFlag{Name: Key, EnvVars: s.env("KEY"), Usage: "PEM private key of --etcd-cert"},
		&cli.StringFlag{Name: User, EnvVars: s.env("USER"), Usage: "etcd user (etcd auth on; docs/security.md)"},
		&cli.StringFlag{Name: PasswordFile, EnvVars: s.env("PASSWORD_FILE"),
			Usage: "file holding the etcd user's password on its first line (mode 0600); else $" + s.env("PASSWORD")[0] + ". Never on the command line"},
	}
}

// endpointsFlag is a repeatable --etcd-endpoints whose help reads as one
// flag's ("--etcd-endpoints value  usage"), not a list's.
type endpointsFlag struct{ *cli.StringSliceFlag }

// String is the flag's line in the help.
func (f endpointsFlag) String() string {
	return (&cli.StringFlag{Name: f.Name, Usage: f.Usage, EnvVars: f.EnvVars}).String()
}

// Parse reads the flags into connection options and the validated key
// prefix. Its errors are the caller's bad input: each names the flag and
// what to give instead.
func (s Set) Parse(c *cli.Context) (etcdconn.Options, string, error) {
	v := s.values(c)
	prefix := v.Prefix
	if prefix == "" {
		prefix = fleet.DefaultPrefix
	}
	if err := fleet.ValidatePrefix(prefix); err != nil {
		return etcdconn.Options{}, "", fmt.Errorf("--%s %q: %w", Prefix, prefix, err)
	}
	o := etcdconn.Options{
		Endpoints: splitEndpoints(v.Endpoints),
		CACert:    expandHome(v.CACert), Cert: expandHome(v.Cert), Key: expandHome(v.Key),
		User:  v.User,
		Flags: etcdconn.DaemonFlags,
	}
	if s.Auth != "" {
		o.Flags.Auth = s.Auth
	}
	if len(o.Endpoints) == 0 {
		o.Endpoints = s.DefaultEndpoints
	}
	pw, err := s.password(expandHome(v.PasswordFile))
	if err != nil {
		return o, "", err
	}
	o.Password = pw
	if o.Password != "" && o.User == "" {
		return o, "", fmt.Errorf("an etcd password was given (--%s or $%s) without --%s", PasswordFile, s.env("PASSWORD")[0], User)
	}
	if len(o.Endpoints) == 0 {
		if !s.NoEndpoints {
			return o, "", errors.New(strings.TrimSpace("--" + Endpoints + " is required " + s.RequiredHint))
		}
		_, err := o.TLSConfig()
		return o, prefix, err
	}
	return o, prefix, o.Validate()
}

// values picks each flag's value: given (flag or environment), else the
// fallback.
func (s Set) values(c *cli.Context) Values {
	pick := func(flag, fallback string) string {
		if c.IsSet(flag) {
			if flag == Endpoints {
				return strings.Join(c.StringSlice(flag), ",")
			}
			return c.String(flag)
		}
		return fallback
	}
	f := s.Fallback
	return Values{
		Endpoints: pick(Endpoints, f.Endpoints), Prefix: pick(Prefix, f.Prefix),
		CACert: pick(CACert, f.CACert), Cert: pick(Cert, f.Cert), Key: pick(Key, f.Key),
		User: pick(User, f.User), PasswordFile: pick(PasswordFile, f.PasswordFile),
	}
}

// password reads the password file, else the first password variable set.
func (s Set) password(file string) (string, error) {
	if file != "" {
		return etcdconn.ReadPassword(file, "", "--"+PasswordFile)
	}
	for _, env := range s.env("PASSWORD") {
		if pw := os.Getenv(env); pw != "" {
			return pw, nil
		}
	}
	return "", nil
}

// splitEndpoints splits comma-separated endpoints, dropping empty ones.
func splitEndpoints(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// expandHome expands a leading "~/" (a flag written --etcd-cacert=~/ca.pem
// reaches us unexpanded by the shell).
func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	return p
}

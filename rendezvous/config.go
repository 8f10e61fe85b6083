package rendezvous

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// Defaults for the Config fields left zero.
//
// DefaultLeaseTTL is 6s so that an etcd leader change never fences a
// node: a node fences when its keepalive stays unconfirmed for TTL -
// FenceMargin - TTL/6 (lease.go), 3.5s with 6s, while etcd with its
// default election timeout (1s) elects a new leader in 1-2s, 2.7s seen on
// a loaded machine (3s left 1.75s, and leader kills fenced most nodes).
// A lost node is still noticed within the TTL; a dead hyperpodrun's lease
// is revoked at once by its watchdog.
const (
	DefaultLeaseTTL        = 6 * time.Second
	DefaultLastCallTimeout = 1 * time.Second
	DefaultJoinTimeout     = 600 * time.Second
	DefaultAckTimeout      = 1 * time.Second
	DefaultMemberListLimit = 256
)

// Config configures one node's participation in a job's rendezvous.
type Config struct {
	// Prefix is the etcd key prefix (default fleet.DefaultPrefix). The
	// rendezvous keeps its private records under the job's rdzv/ keys and
	// reads the job's desired record (target size and placement) and its
	// global restart count; package fleet names them all.
	Prefix string
	// JobID identifies the job (torchrun's --rdzv-id). Required.
	JobID string
	// NodeID is unique per agent. Default: hostname-pid-random.
	NodeID string
	// Addr is the address other nodes reach this node at; it becomes
	// MASTER_ADDR when this node has group rank 0. Default: the hostname if
	// it resolves, else 127.0.0.1.
	Addr string
	// LocalWorldSize is the number of workers on this node (nodes may differ).
	LocalWorldSize int
	// MinNodes and MaxNodes are torchrun's --nnodes MIN:MAX.
	MinNodes, MaxNodes int
	// Sizes, when set, are the only node counts a round may have
	// (ascending, within MinNodes..MaxNodes; MinNodes and MaxNodes become
	// its ends), as a job spec's sizes; Step, when above 1, allows
	// MinNodes, MinNodes+Step, ... up to MaxNodes, as a job spec's step.
	// The coordinator's engine sizes the job within the same rule, and no
	// round ever forms outside it: after a lost node the round shrinks to
	// the largest allowed size the nodes left can fill. Default: every
	// size in MinNodes..MaxNodes. --rdzv-conf sizes=2:4:8 or step=2.
	Sizes []int
	Step  int
	// LeaseTTL is this node's liveness lease (default DefaultLeaseTTL,
	// 6s). etcd rounds it up to whole seconds and to its own minimum (2s
	// with default timings). Below about 5s an etcd leader change with
	// etcd's default election timeout can fence nodes.
	LeaseTTL time.Duration
	// LastCallTimeout: once at least MinNodes (but fewer than the size
	// wanted) are present, wait this long for more before closing a round
	// (default 1s). Shrinking after a loss or failure never waits.
	LastCallTimeout time.Duration
	// JoinTimeout bounds Join: it fails if no round includes this node by
	// then (default 600s).
	JoinTimeout time.Duration
	// RegisterTimeout bounds how long registration (lease and member key)
	// retries an etcd that does not answer (default JoinTimeout, so a node
	// fenced by an etcd outage rejoins when etcd is back). A rendezvous whose
	// etcd cannot come back (c10d's, hosted by a node) sets it shorter.
	RegisterTimeout time.Duration
	// AckTimeout: a proposed round closes once every member acknowledged it;
	// members whose agent has not acknowledged it after AckTimeout without
	// any acknowledgement progress are left out (they may be dead with a
	// lease not yet expired) and rejoin as spares if alive (default 1s).
	AckTimeout time.Duration
	// FenceMargin: LeaseLost fires at last-confirmed-keepalive-send + TTL -
	// FenceMargin, strictly before the server may expire the lease
	// (default TTL/4, at least 250ms).
	FenceMargin time.Duration
	// MemberListLimit: Round.Members is filled when the round has at most
	// this many nodes (default 256); larger rounds fill only Round.Self to
	// keep every node's reads O(1); Node.Members fetches the whole list.
	// A negative value always fills Members.
	MemberListLimit int
	// OnRenew, when set, is called each time the node proves its lease
	// alive for longer than before (at registration and after each
	// confirmed keepalive), from the keepalive path, with the node's lock
	// held: it must return at once and must not call the node. The agent
	// uses it to renew the deadline of its workers' watchdog, which does
	// not depend on the agent's main loop.
	OnRenew func(Renewal)
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
}

// Renewal is one proof that a node's lease is alive.
type Renewal struct {
	// FenceAt is when the node fires LeaseLost unless the lease is proven
	// alive again first (Expiry - FenceMargin).
	FenceAt time.Time
	// Expiry is the earliest time at which etcd may expire the lease: the
	// send time of the confirmed keepalive plus the TTL it was granted.
	Expiry time.Time
}

func (c *Config) setDefaults() error {
	c.Prefix = fleet.NormalizePrefix(c.Prefix)
	if c.Prefix == "" || !strings.HasPrefix(c.Prefix, "/") {
		return fmt.Errorf("rendezvous: prefix %q must start with '/' and name a key path", c.Prefix)
	}
	if c.JobID == "" {
		return errors.New("rendezvous: JobID (--rdzv-id) is required")
	}
	if err := checkToken("job id", c.JobID); err != nil {
		return err
	}
	if c.NodeID == "" {
		c.NodeID = defaultNodeID()
	}
	if err := checkToken("node id", c.NodeID); err != nil {
		return err
	}
	if c.Addr == "" {
		c.Addr = defaultAddr()
	}
	if err := checkToken("addr", c.Addr); err != nil {
		return err
	}
	if c.LocalWorldSize <= 0 {
		return fmt.Errorf("rendezvous: LocalWorldSize must be positive, got %d", c.LocalWorldSize)
	}
	if c.MinNodes <= 0 || c.MaxNodes < c.MinNodes {
		return fmt.Errorf("rendezvous: invalid --nnodes %d:%d (need 1 <= MIN <= MAX)", c.MinNodes, c.MaxNodes)
	}
	if err := c.checkSizes(); err != nil {
		return err
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.LastCallTimeout == 0 {
		c.LastCallTimeout = DefaultLastCallTimeout
	}
	if c.JoinTimeout == 0 {
		c.JoinTimeout = DefaultJoinTimeout
	}
	if c.RegisterTimeout <= 0 || c.RegisterTimeout > c.JoinTimeout {
		c.RegisterTimeout = c.JoinTimeout
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	if c.MemberListLimit == 0 {
		c.MemberListLimit = DefaultMemberListLimit
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"LeaseTTL", c.LeaseTTL}, {"LastCallTimeout", c.LastCallTimeout}, {"JoinTimeout", c.JoinTimeout}, {"AckTimeout", c.AckTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("rendezvous: %s must not be negative, got %s", d.name, d.v)
		}
	}
	if c.FenceMargin < 0 {
		return fmt.Errorf("rendezvous: FenceMargin must not be negative, got %s", c.FenceMargin)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// checkSizes validates Sizes and Step and narrows MinNodes and MaxNodes
// to the ends of Sizes.
func (c *Config) checkSizes() error {
	switch {
	case c.Step < 0:
		return fmt.Errorf("rendezvous: step must be >= 1, got %d", c.Step)
	case len(c.Sizes) > 0 && c.Step > 1:
		return errors.New("rendezvous: give sizes or step, not both")
	case len(c.Sizes) == 0:
		return nil
	}
	for i, z := range c.Sizes {
		if z < c.MinNodes || z > c.MaxNodes || (i > 0 && z <= c.Sizes[i-1]) {
			return fmt.Errorf("rendezvous: sizes %v must be ascending node counts within --nnodes %d:%d", c.Sizes, c.MinNodes, c.MaxNodes)
		}
	}
	c.MinNodes, c.MaxNodes = c.Sizes[0], c.Sizes[len(c.Sizes)-1]
	return nil
}

// AllowedSize is the largest node count of at most n that a round of the
// job may have (Sizes, Step, MinNodes..MaxNodes), or 0 when n is below the
// smallest.
func (c Config) AllowedSize(n int) int {
	return fitSize(n, c.MinNodes, c.MaxNodes, c.Sizes, c.Step)
}

// SizesConf is the --rdzv-conf entry that carries a job spec's allowed
// sizes to its rendezvous (Config.Sizes, Config.Step): "sizes=2:4:8" for
// discrete sizes within the job's bounds, "step=2" for a step above 1,
// "" when every size within the bounds is allowed.
func SizesConf(j api.Job) string {
	lo, hi := j.Bounds()
	if len(j.Sizes) > 0 {
		var parts []string
		for _, z := range j.Sizes {
			if z >= lo && z <= hi {
				parts = append(parts, strconv.Itoa(z))
			}
		}
		if len(parts) == 0 {
			return ""
		}
		return "sizes=" + strings.Join(parts, ":")
	}
	if j.Step > 1 {
		return "step=" + strconv.Itoa(j.Step)
	}
	return ""
}

// parseSizes reads sizes=2:4:8.
func parseSizes(v string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(v, ":") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("rendezvous: --rdzv-conf sizes=%s: want node counts separated by ':', e.g. sizes=2:4:8", v)
		}
		out = append(out, n)
	}
	return out, nil
}

// checkToken rejects values that cannot live in a key segment or in the
// whitespace-separated round record.
func checkToken(what, v string) error {
	if len(v) > 512 {
		return fmt.Errorf("rendezvous: %s is longer than 512 bytes", what)
	}
	for _, r := range v {
		if r <= ' ' || r == 0x7f || r == '/' && what != "addr" {
			return fmt.Errorf("rendezvous: %s %q must not contain whitespace, control characters or '/'", what, v)
		}
	}
	return nil
}

func defaultNodeID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "node"
	}
	h = strings.Map(func(r rune) rune {
		if r <= ' ' || r == '/' || r == 0x7f {
			return '_'
		}
		return r
	}, h)
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", h, os.Getpid(), hex.EncodeToString(b[:]))
}

func defaultAddr() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if addrs, err := net.DefaultResolver.LookupHost(ctx, h); err == nil && len(addrs) > 0 {
		return h
	}
	return "127.0.0.1"
}

// ClientOptions are the etcd client settings carried by --rdzv-conf
// (cacert, cert, key, user, password, protocol, dial_timeout); package
// etcdconn connects with them, naming hyperpodrun's flags in its errors.
type ClientOptions = etcdconn.Options

var confKeys = []string{
	"ack_timeout", "cacert", "cert", "dial_timeout", "join_timeout", "key",
	"last_call_timeout", "lease_ttl", "password", "password_file", "prefix", "protocol", "sizes", "step", "timeout", "user",
}

// ParseConf parses torchrun's --rdzv-conf value ("k=v,k2=v2") into cfg and
// returns the etcd client options it carries. Durations are seconds (float
// allowed, e.g. "2.5") or Go durations ("1500ms"). Keys: lease_ttl,
// last_call_timeout, join_timeout (torch's "timeout" is an alias),
// ack_timeout, prefix, sizes (e.g. 2:4:8) and step (Config.Sizes,
// Config.Step), and for the client cacert, cert, key, user,
// password_file (a 0600 file holding the password; password= also works,
// as torch's does, but shows in /proc/<pid>/cmdline), protocol,
// dial_timeout. An unknown key is an error naming it and the valid
// ones.
func ParseConf(conf string, cfg *Config) (ClientOptions, error) {
	opts := ClientOptions{Flags: etcdconn.RdzvFlags}
	for _, kv := range strings.Split(conf, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return ClientOptions{}, fmt.Errorf("rendezvous: --rdzv-conf entry %q is not key=value", kv)
		}
		var err error
		switch k {
		case "lease_ttl":
			cfg.LeaseTTL, err = parseSeconds(k, v)
		case "last_call_timeout":
			cfg.LastCallTimeout, err = parseSeconds(k, v)
		case "join_timeout", "timeout":
			cfg.JoinTimeout, err = parseSeconds(k, v)
		case "ack_timeout":
			cfg.AckTimeout, err = parseSeconds(k, v)
		case "dial_timeout":
			opts.DialTimeout, err = parseSeconds(k, v)
		case "sizes":
			cfg.Sizes, err = parseSizes(v)
		case "step":
			cfg.Step, err = strconv.Atoi(v)
			if err != nil || cfg.Step < 1 {
				err = fmt.Errorf("rendezvous: --rdzv-conf step=%s: want a node count >= 1", v)
			}
		case "prefix":
			if !strings.HasPrefix(v, "/") {
				err = fmt.Errorf("rendezvous: --rdzv-conf prefix=%q must start with '/'", v)
			}
			cfg.Prefix = v
		case "cacert":
			opts.CACert = v
		case "cert":
			opts.Cert = v
		case "key":
			opts.Key = v
		case "user":
			opts.User = v
		case "password":
			// torch's etcd backend takes it here; it shows in
			// /proc/<pid>/cmdline, so password_file is the way.
			opts.Password = v
		case "password_file":
			opts.Password, err = etcdconn.ReadPassword(v, "", "--rdzv-conf password_file")
		case "protocol":
			v = strings.ToLower(v)
			if v != "http" && v != "https" {
				err = fmt.Errorf("rendezvous: --rdzv-conf protocol=%q: want http or https", v)
			}
			opts.Protocol = v
		default:
			return ClientOptions{}, fmt.Errorf("rendezvous: unknown --rdzv-conf key %q (valid keys: %s)", k, strings.Join(confKeys, ", "))
		}
		if err != nil {
			return ClientOptions{}, err
		}
	}
	if (opts.Cert == "") != (opts.Key == "") {
		return ClientOptions{}, errors.New("rendezvous: --rdzv-conf cert and key must be given together")
	}
	if opts.Password != "" && opts.User == "" {
		return ClientOptions{}, errors.New("rendezvous: --rdzv-conf password given without user")
	}
	return opts, nil
}

func parseSeconds(k, v string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if f <= 0 || math.IsNaN(f) || math.IsInf(f, 0) || f > 1e9 {
			return 0, fmt.Errorf("rendezvous: --rdzv-conf %s=%s: want a positive number of seconds", k, v)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("rendezvous: --rdzv-conf %s=%s: want a positive number of seconds (e.g. 2.5) or a duration (e.g. 1500ms)", k, v)
	}
	return d, nil
}

package rendezvous

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

func TestParseConf(t *testing.T) {
	var cfg Config
	opts, err := ParseConf(" lease_ttl=2.5, last_call_timeout=1500ms,join_timeout=900,ack_timeout=0.25,prefix=/x/y,cacert=/ca.pem,cert=/c.pem,key=/k.pem,user=u,password=p,protocol=HTTPS,dial_timeout=2", &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LeaseTTL != 2500*time.Millisecond || cfg.LastCallTimeout != 1500*time.Millisecond ||
		cfg.JoinTimeout != 900*time.Second || cfg.AckTimeout != 250*time.Millisecond || cfg.Prefix != "/x/y" {
		t.Fatalf("cfg: %+v", cfg)
	}
	if opts.CACert != "/ca.pem" || opts.Cert != "/c.pem" || opts.Key != "/k.pem" || opts.User != "u" ||
		opts.Password != "p" || opts.Protocol != "https" || opts.DialTimeout != 2*time.Second {
		t.Fatalf("opts: %+v", opts)
	}
	// torch's etcd backend calls the join timeout "timeout".
	if _, err := ParseConf("timeout=30", &cfg); err != nil || cfg.JoinTimeout != 30*time.Second {
		t.Fatalf("timeout alias: %v %v", cfg.JoinTimeout, err)
	}
	if _, err := ParseConf("", &cfg); err != nil {
		t.Fatalf("empty conf: %v", err)
	}
	for conf, want := range map[string]string{
		"read_timeout=5":      `unknown --rdzv-conf key "read_timeout" (valid keys: ack_timeout,`,
		"lease_ttl=abc":       "lease_ttl=abc: want a positive number of seconds",
		"lease_ttl=-1":        "lease_ttl=-1: want a positive",
		"join_timeout=0":      "join_timeout=0: want a positive",
		"lease_ttl":           `entry "lease_ttl" is not key=value`,
		"prefix=rel":          "must start with '/'",
		"cert=/c.pem":         "cert and key must be given together",
		"password=p":          "password given without user",
		"protocol=ftp":        "want http or https",
		"last_call_timeout=x": "last_call_timeout=x",
	} {
		if _, err := ParseConf(conf, &cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseConf(%q) = %v; want error containing %q", conf, err, want)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	base := Config{JobID: "j", NodeID: "n", Addr: "a", LocalWorldSize: 1, MinNodes: 1, MaxNodes: 1}
	for name, mut := range map[string]func(*Config){
		"no job":      func(c *Config) { c.JobID = "" },
		"bad job":     func(c *Config) { c.JobID = "a/b" },
		"space node":  func(c *Config) { c.NodeID = "a b" },
		"nproc 0":     func(c *Config) { c.LocalWorldSize = 0 },
		"min > max":   func(c *Config) { c.MinNodes = 3; c.MaxNodes = 2 },
		"min 0":       func(c *Config) { c.MinNodes = 0 },
		"neg ttl":     func(c *Config) { c.LeaseTTL = -time.Second },
		"bad prefix":  func(c *Config) { c.Prefix = "x" },
		"addr spaces": func(c *Config) { c.Addr = "a b" },
	} {
		c := base
		mut(&c)
		if err := c.setDefaults(); err == nil {
			t.Errorf("%s: accepted %+v", name, c)
		}
	}
	c := Config{JobID: "j", LocalWorldSize: 2, MinNodes: 1, MaxNodes: 4}
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if c.NodeID == "" || c.Addr == "" || c.Prefix != fleet.DefaultPrefix || c.LeaseTTL != DefaultLeaseTTL ||
		c.LastCallTimeout != DefaultLastCallTimeout || c.JoinTimeout != DefaultJoinTimeout || c.Logger == nil {
		t.Fatalf("defaults: %+v", c)
	}
}

// A wrong endpoint fails fast with a message that says what to check.
func TestNewClientUnreachable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	start := time.Now()
	cli, err := NewClient([]string{addr}, ClientOptions{DialTimeout: time.Second})
	if err == nil {
		cli.Close()
		t.Fatal("NewClient succeeded against a closed port")
	}
	msg := err.Error()
	if !strings.Contains(msg, "cannot reach etcd at http://"+addr) || !strings.Contains(msg, "check --rdzv-endpoint") {
		t.Fatalf("unclear error: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("NewClient took %s to fail", took)
	}
}

func TestNewClientReachable(t *testing.T) {
	t.Parallel()
	hostPort := strings.TrimPrefix(etcd.Endpoints[0], "http://")
	// A dead endpoint next to a live one is fine.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	cli, err := NewClient([]string{dead + "," + hostPort}, ClientOptions{DialTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cli.Close()
}

// The password reaches hyperpodrun through a file, not its command line.
func TestParseConfPasswordFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "pw")
	if err := os.WriteFile(good, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg Config
	opts, err := ParseConf("user=hyperpod-job-x,password_file="+good, &cfg)
	if err != nil || opts.User != "hyperpod-job-x" || opts.Password != "s3cret" {
		t.Fatalf("ParseConf = %+v, %v; want the password read from the file", opts, err)
	}
	open := filepath.Join(dir, "open")
	if err := os.WriteFile(open, []byte("s3cret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for conf, want := range map[string]string{
		"user=u,password_file=" + open:                       "is readable by others (mode 0644): chmod 600",
		"user=u,password_file=" + filepath.Join(dir, "none"): "--rdzv-conf password_file: stat",
		"password_file=" + good:                              "password given without user",
	} {
		if _, err := ParseConf(conf, &cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseConf(%q) = %v; want error containing %q", conf, err, want)
		}
	}
}

// The job's allowed sizes reach the rendezvous through --rdzv-conf.
func TestConfSizesAndStep(t *testing.T) {
	var cfg Config
	if _, err := ParseConf("sizes=2:4:8", &cfg); err != nil || !slices.Equal(cfg.Sizes, []int{2, 4, 8}) {
		t.Fatalf("sizes=2:4:8: %v %v", cfg.Sizes, err)
	}
	if _, err := ParseConf("step=2", &cfg); err != nil || cfg.Step != 2 {
		t.Fatalf("step=2: %v %v", cfg.Step, err)
	}
	for conf, want := range map[string]string{
		"sizes=2:x": "want node counts separated by ':'",
		"sizes=0":   "want node counts",
		"step=0":    "step=0: want a node count >= 1",
	} {
		if _, err := ParseConf(conf, &Config{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseConf(%q) = %v; want error containing %q", conf, err, want)
		}
	}
	base := Config{JobID: "j", NodeID: "n", Addr: "a", LocalWorldSize: 1, MinNodes: 1, MaxNodes: 8}
	for name, mut := range map[string]func(*Config){
		"sizes not ascending":   func(c *Config) { c.Sizes = []int{4, 2} },
		"size above max":        func(c *Config) { c.Sizes = []int{2, 16} },
		"sizes and step":        func(c *Config) { c.Sizes, c.Step = []int{2, 4}, 2 },
		"negative step":         func(c *Config) { c.Step = -1 },
		"size below --nnodes":   func(c *Config) { c.MinNodes = 2; c.Sizes = []int{1, 2} },
		"repeated size in list": func(c *Config) { c.Sizes = []int{2, 2} },
	} {
		c := base
		mut(&c)
		if err := c.setDefaults(); err == nil {
			t.Errorf("%s: accepted %+v", name, c)
		}
	}
	c := base
	c.Sizes = []int{2, 4}
	if err := c.setDefaults(); err != nil || c.MinNodes != 2 || c.MaxNodes != 4 {
		t.Fatalf("sizes {2,4} in 1:8: MinNodes %d MaxNodes %d err %v; want 2:4", c.MinNodes, c.MaxNodes, err)
	}
}

// A job spec's sizes and step reach its rendezvous as its engine sees them.
func TestSizesConfCarriesTheJobSpec(t *testing.T) {
	for _, tc := range []struct {
		rule      string
		job       api.Job
		conf      string
		wantSizes []int
		wantStep  int
		min, max  int
	}{
		{"discrete sizes", api.Job{Sizes: []int{2, 4}}, "sizes=2:4", []int{2, 4}, 0, 2, 4},
		{"sizes clipped to explicit bounds", api.Job{MinNodes: 2, MaxNodes: 4, Sizes: []int{1, 2, 4, 8}}, "sizes=2:4", []int{2, 4}, 0, 2, 4},
		{"step", api.Job{MinNodes: 2, MaxNodes: 6, Step: 2}, "step=2", nil, 2, 2, 6},
		{"every size", api.Job{MinNodes: 1, MaxNodes: 4}, "", nil, 0, 1, 4},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			conf := SizesConf(tc.job)
			if conf != tc.conf {
				t.Fatalf("SizesConf = %q, want %q", conf, tc.conf)
			}
			lo, hi := tc.job.Bounds()
			c := Config{JobID: "j", NodeID: "n", Addr: "a", LocalWorldSize: 1, MinNodes: lo, MaxNodes: hi}
			if _, err := ParseConf(conf, &c); err != nil {
				t.Fatal(err)
			}
			if err := c.setDefaults(); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.Sizes, tc.wantSizes) || c.Step != tc.wantStep || c.MinNodes != tc.min || c.MaxNodes != tc.max {
				t.Fatalf("config sizes %v step %d nnodes %d:%d, want %v %d %d:%d", c.Sizes, c.Step, c.MinNodes, c.MaxNodes, tc.wantSizes, tc.wantStep, tc.min, tc.max)
			}
		})
	}
}

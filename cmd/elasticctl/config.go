package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"
	"gopkg.in/yaml.v3"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn/etcdflags"
)

// Config is elasticctl's config file (~/.config/elasticctl/config.yaml):
// named contexts, as kubeconfig has, each an etcd to talk to.
//
//	current-context: prod
//	contexts:
//	- name: prod
//	  endpoints: [https://etcd-0:2379, https://etcd-1:2379]
//	  prefix: /hyperpodrun
//	  cacert: /etc/elasticctl/ca.pem
//	  cert: /etc/elasticctl/me.pem
//	  key: /etc/elasticctl/me-key.pem
//	  user: alice
//	  passwordFile: ~/.config/elasticctl/alice.password
type Config struct {
	CurrentContext string          `yaml:"current-context"`
	Contexts       []ConfigContext `yaml:"contexts"`
}

// ConfigContext is one etcd and the credentials to use it.
type ConfigContext struct {
	Name         string   `yaml:"name"`
	Endpoints    []string `yaml:"endpoints"`
	Prefix       string   `yaml:"prefix,omitempty"`
	CACert       string   `yaml:"cacert,omitempty"`
	Cert         string   `yaml:"cert,omitempty"`
	Key          string   `yaml:"key,omitempty"`
	User         string   `yaml:"user,omitempty"`
	PasswordFile string   `yaml:"passwordFile,omitempty"`
}

// configPath is --config, or the default location (XDG first).
func configPath(c *cli.Context) (path string, explicit bool) {
	if p := c.String("config"); p != "" {
		return p, true
	}
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "elasticctl", "config.yaml"), false
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", false
	}
	return filepath.Join(home, ".config", "elasticctl", "config.yaml"), false
}

// loadContext reads the context to use: --context, else the file's
// current-context. No file (at the default place) and no --context mean
// no context.
func loadContext(c *cli.Context) (*ConfigContext, error) {
	path, explicit := configPath(c)
	want := c.String("context")
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit && want == "" {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && len(bytes.TrimSpace(data)) > 0 {
		return nil, fmt.Errorf("%s: %s", path, yamlMessage(strings.TrimPrefix(err.Error(), "yaml: ")))
	}
	if want == "" {
		want = cfg.CurrentContext
	}
	if want == "" {
		return nil, nil
	}
	var names []string
	for i := range cfg.Contexts {
		if cfg.Contexts[i].Name == want {
			return &cfg.Contexts[i], nil
		}
		names = append(names, cfg.Contexts[i].Name)
	}
	msg := fmt.Sprintf("%s: no context named %q", path, want)
	if s := closest(want, names); s != "" {
		msg += fmt.Sprintf(": did you mean %q?", s)
	} else if len(names) > 0 {
		msg += ": it has " + strings.Join(names, ", ")
	}
	return nil, errors.New(msg)
}

// connection resolves how to reach etcd: a flag (or its ELASTICCTL_ETCD_*
// or HYPERPOD_ETCD_* variable) wins over the context, which wins over the
// defaults. There is no password flag (/proc/*/cmdline is
// world-readable): a password file, else $ELASTICCTL_ETCD_PASSWORD or
// $HYPERPOD_ETCD_PASSWORD.
func connection(c *cli.Context) (etcdconn.Options, string, error) {
	ctx, err := loadContext(c)
	if err != nil {
		return etcdconn.Options{}, "", err
	}
	if ctx == nil {
		ctx = &ConfigContext{}
	}
	s := etcdSet
	s.Fallback = etcdflags.Values{Endpoints: strings.Join(ctx.Endpoints, ","), Prefix: ctx.Prefix, CACert: ctx.CACert, Cert: ctx.Cert,
		Key: ctx.Key, User: ctx.User, PasswordFile: ctx.PasswordFile}
	return s.Parse(c)
}

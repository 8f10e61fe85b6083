package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// enrollFlags turn on the enrollment of a Kubernetes agent pod
// (etcdauth.Enroll, docs/kubernetes.md). They are made anew for each app:
// urfave/cli keeps a value read from the environment in the flag itself.
func enrollFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "etcd-enroll", EnvVars: []string{"HYPERPOD_ETCD_ENROLL"}, Usage: "file holding this pod's projected ServiceAccount token (audience " + etcdauth.EnrollAudience +
			"): connect as --etcd-user " + etcdauth.EnrollUser + ", enroll as this node's own etcd user hyperpod-node-<node> and run as it (the Kubernetes DaemonSet; docs/kubernetes.md)"},
		&cli.DurationFlag{Name: "etcd-enroll-timeout", Value: 2 * time.Minute, Usage: "how long to wait for the enrollment's answer before giving up (and saying why it may have been refused)"},
	}
}

// enrollAsNode returns a client of node's own etcd user, enrolled with
// the token in --etcd-enroll through cli (the shared enrollment user's);
// without --etcd-enroll it returns cli. The caller closes both.
func enrollAsNode(ctx context.Context, c *cli.Context, cli *clientv3.Client, conn etcdconn.Options, prefix, node string, log *slog.Logger) (*clientv3.Client, error) {
	path := c.String("etcd-enroll")
	if path == "" {
		return cli, nil
	}
	if conn.User == "" || c.Bool("embedded-etcd") {
		return nil, usagef("--etcd-enroll needs --etcd-user %s and its password (and no --embedded-etcd)", etcdauth.EnrollUser)
	}
	if d := c.Duration("etcd-enroll-timeout"); d < time.Second {
		return nil, usagef("--etcd-enroll-timeout %s: want at least 1s", d)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--etcd-enroll: %v", err)
	}
	ectx, cancel := context.WithTimeout(ctx, c.Duration("etcd-enroll-timeout"))
	defer cancel()
	log.Info("enrolling: asking for this node's own etcd user", "node", node, "as", conn.User)
	got, err := etcdauth.Enroll(ectx, cli, fleet.NewKeys(prefix), node, strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("enroll as node %s's etcd user: %w", node, err)
	}
	conn.User, conn.Password = got.User, got.Password
	ncli, err := etcdconn.Connect(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("connect to etcd as the enrolled user %s: %w", got.User, err)
	}
	log.Info("enrolled: connected to etcd as this node's own user", "node", node, "user", got.User)
	return ncli, nil
}

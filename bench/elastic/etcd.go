package main

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// setTarget sets a job's target size (its desired record, no placement).
func setTarget(ep, job string, n int) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return fleet.New(cli, "").SetTarget(ctx, job, n)
}

package elastic

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/hyperpodrun/hyperpodrun/internal/etcdconn"
)

// leaseWill is the elastic agent's will, kept by its workers' watchdog
// (launcher.Watchdog.SetWill): if hyperpodrun dies (SIGKILL, OOM kill, a
// crash) the watchdog kills the workers, waits until none of their
// processes is left, and then revokes the agent's rendezvous lease with it.
// The node's running/<node> marker and its membership go with the lease at
// once, so the other nodes form the next round without waiting for the
// lease to expire, and fencing still holds: the workers are provably gone
// before the lease is. A whole machine that dies takes its watchdog with
// it; then the lease expires as before.
type leaseWill struct {
	Endpoints []string `json:"endpoints"`
	CACert    string   `json:"cacert,omitempty"`
	Cert      string   `json:"cert,omitempty"`
	Key       string   `json:"key,omitempty"`
	User      string   `json:"user,omitempty"`
	Password  string   `json:"password,omitempty"`
	Protocol  string   `json:"protocol,omitempty"`
	Lease     int64    `json:"lease"`
}

// encodeWill is the will revoking lease, reached with o.
func encodeWill(o etcdconn.Options, lease clientv3.LeaseID) []byte {
	b, _ := json.Marshal(leaseWill{Endpoints: o.Endpoints, CACert: o.CACert, Cert: o.Cert, Key: o.Key,
		User: o.User, Password: o.Password, Protocol: o.Protocol, Lease: int64(lease)}) // cannot fail: plain fields
	return b
}

// RevokeOrphanedLease carries out the will of a dead agent (see leaseWill).
// It is hyperpodrun's launcher.OnAgentDeath hook and runs in the watchdog
// process; it gives up after a few seconds (the lease then expires).
func RevokeOrphanedLease(will []byte) {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := revokeOrphanedLease(will); err != nil {
		log.Warn("hyperpodrun watchdog: cannot revoke the dead agent's lease; it expires after its TTL", "err", err)
		return
	}
	log.Info("hyperpodrun watchdog: the agent died and its workers are gone: revoked its rendezvous lease")
}

func revokeOrphanedLease(will []byte) error {
	var w leaseWill
	if err := json.Unmarshal(will, &w); err != nil {
		return fmt.Errorf("malformed will: %w", err)
	}
	if w.Lease == 0 || len(w.Endpoints) == 0 {
		return fmt.Errorf("malformed will: no lease or no endpoints")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cli, err := etcdconn.Connect(ctx, etcdconn.Options{Endpoints: w.Endpoints, CACert: w.CACert, Cert: w.Cert, Key: w.Key,
		User: w.User, Password: w.Password, Protocol: w.Protocol, DialTimeout: 2 * time.Second, Flags: etcdconn.RdzvFlags})
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(w.Lease)); err != nil {
		return fmt.Errorf("revoke lease %x: %w", w.Lease, err)
	}
	return nil
}

package coordinator

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
)

// credsTimeout bounds minting or revoking one job's credentials.
const credsTimeout = 15 * time.Second

// mintFor mints credentials for the jobs of allocs that hold none yet,
// before their desired records are written: no node agent starts a job's
// hyperpodrun before it has its own etcd user (Config.JobCredentials).
func (c *Coordinator) mintFor(ctx context.Context, allocs []api.Allocation) error {
	if !c.cfg.JobCredentials {
		return nil
	}
	if err := c.loadMinted(ctx); err != nil {
		return err
	}
	for _, a := range allocs {
		if c.minted[a.Job] {
			continue
		}
		mctx, cancel := context.WithTimeout(ctx, credsTimeout)
		_, err := etcdauth.Mint(mctx, c.cli, c.store.Keys, a.Job)
		cancel()
		if err != nil {
			return fmt.Errorf("mint job %s's etcd credentials (the coordinator's etcd user needs the root role: docs/security.md): %w", a.Job, err)
		}
		c.minted[a.Job] = true
		c.log.Info("minted the job's etcd credentials", "job", a.Job, "user", etcdauth.JobRole(a.Job))
	}
	return nil
}

// revokeEnded revokes the credentials of every job that holds no
// allocation and has no node left in its rendezvous: its hyperpodruns are
// gone (a stopped job's last checkpoint commit still needs them).
func (c *Coordinator) revokeEnded(ctx context.Context, running map[string]bool) {
	if !c.cfg.JobCredentials || c.minted == nil {
		return
	}
	jobs := make([]string, 0, len(c.minted))
	for j := range c.minted {
		if !running[j] {
			jobs = append(jobs, j)
		}
	}
	sort.Strings(jobs)
	for _, job := range jobs {
		rctx, cancel := context.WithTimeout(ctx, credsTimeout)
		n, err := c.store.Members(rctx, job)
		if err == nil && n == 0 {
			err = etcdauth.Revoke(rctx, c.cli, c.store.Keys, job)
			if err == nil {
				delete(c.minted, job)
				c.log.Info("revoked the job's etcd credentials: it holds no nodes", "job", job)
			}
		}
		cancel()
		if err != nil {
			c.log.Warn("cannot revoke the job's etcd credentials yet", "job", job, "err", err)
		}
	}
}

// loadMinted learns which jobs hold credentials (once per leadership).
func (c *Coordinator) loadMinted(ctx context.Context) error {
	if c.minted != nil {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, credsTimeout)
	defer cancel()
	jobs, err := etcdauth.MintedJobs(lctx, c.cli)
	if err != nil {
		return fmt.Errorf("list minted job credentials (the coordinator's etcd user needs the root role: docs/security.md): %w", err)
	}
	c.minted = make(map[string]bool, len(jobs))
	for _, j := range jobs {
		c.minted[j] = true
	}
	return nil
}

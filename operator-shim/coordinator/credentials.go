package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/hyperpodrun/hyperpodrun/api"
	"github.com/hyperpodrun/hyperpodrun/internal/etcdauth"
	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// credsTimeout bounds minting or revoking one job's credentials.
const credsTimeout = 15 * time.Second

// errNotInTerm: the leader's lease may have ended, so another coordinator
// may lead.
var errNotInTerm = errors.New("this coordinator's leader lease may have ended: another may lead")

// termMargin is how long before its lease may end a leader's term ends: a
// change sent just before the term's end is applied by etcd well before
// another coordinator can lead (which also takes an election, a read of
// the fleet and a cycle). A sixth of the lease's TTL, at most a second:
// the lease is renewed every third, so a renewal that fails is tried
// again within the term (twice from a TTL of 4 s, the default being 5;
// once at shorter TTLs).
func termMargin(ttlSeconds int) time.Duration {
	return min(time.Second, time.Duration(ttlSeconds)*time.Second/6)
}

// leaderTerm is a leader's term: ctx ends a margin before the leader's
// lease may end (quietlease.Lease.Context), so that no other coordinator
// leads within it; end reads that time now from the lease, since the
// term's timer may not have run yet after a long pause (nil: only ctx
// counts).
type leaderTerm struct {
	ctx context.Context
	end func() time.Time
}

// over reports whether the term has ended, by its context or its clock.
func (t *leaderTerm) over() bool {
	return t.ctx.Err() != nil || t.end != nil && !time.Now().Before(t.end())
}

// termCtx bounds ctx by credsTimeout and by the leader's term. etcd's
// users and roles cannot be changed in a transaction, so no leadership
// compare guards them: a leader deposed without knowing yet (a long pause,
// a partition) would revoke what the new leader has just minted for a job
// it admitted, or mint what the new leader does not know of. So the
// leader changes them only within its term (while its lease provably
// lasts, less termMargin), and a change still waited for at its end is
// cut off. It returns errNotInTerm once the term has ended. Outside a term
// (tests that call a step directly) only credsTimeout bounds it.
func (c *Coordinator) termCtx(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if c.term != nil && c.term.over() {
		return ctx, func() {}, errNotInTerm
	}
	tctx, cancel := context.WithTimeout(ctx, credsTimeout)
	if c.term == nil {
		return tctx, cancel, nil
	}
	stop := context.AfterFunc(c.term.ctx, cancel)
	return tctx, func() { stop(); cancel() }, nil
}

// withinTerm runs f with termCtx's context. It returns errNotInTerm when
// the term had ended before f, f's error wrapped with errNotInTerm when
// the term ended while f ran (a call cut off by it is not etcd's failure),
// else f's error.
func (c *Coordinator) withinTerm(ctx context.Context, f func(context.Context) error) error {
	tctx, cancel, err := c.termCtx(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	if err := f(tctx); err != nil {
		if c.term != nil && c.term.ctx.Err() != nil {
			return fmt.Errorf("%w: %w", errNotInTerm, err)
		}
		return err
	}
	return nil
}

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
	if c.creds == nil {
		c.creds = map[string]*fleet.JobCreds{}
	}
	for _, a := range allocs {
		if c.creds[a.Job] != nil {
			continue
		}
		var cr *fleet.JobCreds
		err := c.withinTerm(ctx, func(mctx context.Context) (err error) {
			if !c.minted[a.Job] {
				// Another leader may have minted it since this term
				// listed the users: this one may be deposed without
				// knowing yet. Minting again would reset the password
				// its hyperpodruns hold, so reuse the record when the
				// user exists.
				if c.minted[a.Job], err = etcdauth.HasJobUser(mctx, c.cli, a.Job); err != nil {
					return err
				}
			}
			if c.minted[a.Job] {
				// Minted by an earlier leader: its record has the
				// password the assignments carry.
				if cr, err = c.store.Creds(mctx, a.Job); err != nil || cr != nil {
					return err
				}
			}
			if cr, err = etcdauth.Mint(mctx, c.cli, c.store.Keys, a.Job); err == nil {
				c.log.Info("minted the job's etcd credentials", "job", a.Job, "user", etcdauth.JobRole(a.Job))
			}
			return err
		})
		if errors.Is(err, errNotInTerm) {
			return fmt.Errorf("mint job %s's etcd credentials: %w", a.Job, err)
		}
		if err != nil {
			return fmt.Errorf("mint job %s's etcd credentials (the coordinator's etcd user needs the root role: docs/security.md): %w", a.Job, err)
		}
		c.minted[a.Job] = true
		c.creds[a.Job] = cr
	}
	return nil
}

// revokeDeleted revokes at once the credentials of the jobs whose spec was
// just deleted (the view's gone list), not at the next cycle: a deleted
// job's hyperpodruns lose etcd within one watch event. Their records are
// cleaned up afterwards as before (forgetDeleted).
func (c *Coordinator) revokeDeleted(ctx context.Context) {
	v := c.view
	if v == nil || len(v.gone) == 0 {
		return
	}
	gone := v.gone
	v.gone = nil
	if !c.cfg.JobCredentials {
		return
	}
	for _, job := range gone {
		if _, owned := v.owned[job]; owned {
			continue // submitted again meanwhile
		}
		if c.minted != nil && !c.minted[job] {
			continue
		}
		err := c.withinTerm(ctx, func(rctx context.Context) error {
			return etcdauth.Revoke(rctx, c.cli, c.store.Keys, job)
		})
		if errors.Is(err, errNotInTerm) {
			return // the next leader revokes them (revokeEnded)
		}
		if err != nil {
			// revokeEnded tries again once the job holds no nodes.
			c.log.Warn("cannot revoke a deleted job's etcd credentials yet", "job", clipMsg(job), "err", err)
			continue
		}
		delete(c.minted, job)
		delete(c.creds, job)
		c.log.Info("revoked the deleted job's etcd credentials", "job", clipMsg(job))
	}
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
		err := c.withinTerm(ctx, func(rctx context.Context) error {
			n, err := c.store.Members(rctx, job)
			if err != nil || n > 0 {
				return err
			}
			if err := etcdauth.Revoke(rctx, c.cli, c.store.Keys, job); err != nil {
				return err
			}
			delete(c.minted, job)
			delete(c.creds, job)
			c.log.Info("revoked the job's etcd credentials: it holds no nodes", "job", job)
			return nil
		})
		if errors.Is(err, errNotInTerm) {
			return
		}
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

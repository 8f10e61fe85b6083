package elastic

import (
	"log/slog"
	"sync"
	"time"

	"github.com/hyperpodrun/hyperpodrun/launcher"
	"github.com/hyperpodrun/hyperpodrun/rendezvous"
)

// leaseGuard keeps fencing true when the agent's own loop cannot act (a
// SIGSTOPped or wedged hyperpodrun): it feeds every proof that the
// rendezvous lease is alive to a watchdog process (launcher.Watchdog),
// which SIGKILLs the workers' process groups once the lease could no longer
// be proven alive: halfway between the node's own fence time (expiry minus
// the fence margin) and the earliest expiry, so the agent fences first when
// it can, and the watchdog strictly before etcd may expire the lease and
// give the workers' ranks to another node. It also tells the control
// channel's handler whether the lease is still provably alive.
type leaseGuard struct {
	log *slog.Logger

	mu       sync.Mutex
	gen      uint64    // the current rendezvous node's generation
	fenceAt  time.Time // the current node's fence time; zero: none yet
	deadline time.Time // the watchdog's deadline for the current node
	wd       *launcher.Watchdog
	warned   bool
	// will is handed to every watchdog (launcher.Watchdog.SetWill): what
	// it does if this agent dies (leaseWill).
	will []byte
}

// setWill makes will the watchdog's, now and for any watchdog started
// later.
func (l *leaseGuard) setWill(will []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.will = will
	if l.wd != nil {
		if err := l.wd.SetWill(will); err != nil {
			l.log.Debug("give the watchdog the agent's will", "err", err)
		}
	}
}

func newLeaseGuard(log *slog.Logger) *leaseGuard { return &leaseGuard{log: log} }

// forNode returns the OnRenew callback of a new rendezvous node: from now
// on only that node's renewals count.
func (l *leaseGuard) forNode() func(rendezvous.Renewal) {
	l.mu.Lock()
	l.gen++
	gen := l.gen
	l.fenceAt, l.deadline = time.Time{}, time.Time{}
	l.mu.Unlock()
	return func(r rendezvous.Renewal) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if gen != l.gen {
			return
		}
		l.fenceAt = r.FenceAt
		l.deadline = r.FenceAt.Add(r.Expiry.Sub(r.FenceAt) / 2)
		if l.wd != nil {
			l.wd.Renew(l.deadline)
		}
	}
}

// leaseAlive reports whether the current node's lease is provably alive.
func (l *leaseGuard) leaseAlive() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.fenceAt.IsZero() && time.Now().Before(l.fenceAt)
}

// watchdog returns the watchdog for the next workers, starting one when
// there is none or the last one died; nil when the program cannot run one
// (an embedder that did not call launcher.WatchdogMain).
func (l *leaseGuard) watchdog() *launcher.Watchdog {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.wd != nil && l.wd.Alive() {
		return l.wd
	}
	if l.wd != nil {
		l.log.Warn("the workers' watchdog is gone; starting another")
		go l.wd.Close()
		l.wd = nil
	}
	if !launcher.WatchdogAvailable() {
		if !l.warned {
			l.warned = true
			l.log.Warn("no watchdog for the workers: this program did not call launcher.WatchdogMain; a stopped agent cannot fence its workers")
		}
		return nil
	}
	wd, err := launcher.StartWatchdog()
	if err != nil {
		l.log.Warn("cannot start the workers' watchdog; a stopped agent cannot fence its workers", "err", err)
		return nil
	}
	l.log.Debug("workers' watchdog started", "pid", wd.PID())
	if !l.deadline.IsZero() {
		wd.Renew(l.deadline)
	}
	if l.will != nil {
		wd.SetWill(l.will)
	}
	l.wd = wd
	return wd
}

// expired reports whether the watchdog may have killed the workers started
// since its last Reset (launcher.Start resets it): their end is fencing
// then, not a failure of theirs.
func (l *leaseGuard) expired() bool {
	l.mu.Lock()
	wd := l.wd
	l.mu.Unlock()
	return wd != nil && wd.Expired()
}

// close stops the watchdog (the agent's workers are gone by then).
func (l *leaseGuard) close() {
	l.mu.Lock()
	wd := l.wd
	l.wd = nil
	l.mu.Unlock()
	if wd != nil {
		if err := wd.Close(); err != nil {
			l.log.Debug("close the workers' watchdog", "err", err)
		}
	}
}

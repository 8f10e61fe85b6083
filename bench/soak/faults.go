package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/internal/fleet"
)

// Fault kinds, in the order the figures are printed.
const (
	faultWorkerKill       = "worker_kill"
	faultHyperpodrunKill  = "hyperpodrun_kill"
	faultHyperpodrunStop  = "hyperpodrun_stop"
	faultAgentKill        = "agent_kill"
	faultCoordinatorKill  = "coordinator_kill"
	faultEtcdKill         = "etcd_kill"
	faultEtcdWipe         = "etcd_wipe"
	faultCorruptTeam      = "corrupt_team"
	faultCorruptCkpt      = "corrupt_checkpoint"
	faultCorruptRestarts  = "corrupt_restarts"
	faultCorruptNode      = "corrupt_node"
	corruptValue          = "soak-corrupt{\"step\":"
	stopFor               = 10 * time.Second
	restartDelayMax       = 3 // seconds, for agents and coordinators
	faultTargetRetryLimit = 10 * time.Second
)

var faultKinds = []string{faultWorkerKill, faultHyperpodrunKill, faultHyperpodrunStop, faultAgentKill,
	faultCoordinatorKill, faultEtcdKill, faultEtcdWipe, faultCorruptTeam, faultCorruptCkpt, faultCorruptRestarts, faultCorruptNode}

// plannedFault is one entry of the seeded schedule: everything random about
// a fault is drawn when the plan is made, so a seed names one schedule.
type plannedFault struct {
	n    int
	gap  time.Duration // after the previous fault ended
	kind string
	pick uint64        // chooses the target among the sorted candidates
	down time.Duration // how long a killed daemon stays down
}

func (f plannedFault) String() string {
	s := fmt.Sprintf("#%d +%.1fs %s", f.n, f.gap.Seconds(), f.kind)
	if f.down > 0 {
		s += fmt.Sprintf(" (down %.1fs)", f.down.Seconds())
	}
	return s
}

// plan draws the schedule for a fault phase of length total: gaps uniform in
// [gapMin, gapMax]; kinds dealt from a deck holding every kind once,
// reshuffled when empty, so each kind comes up about equally often.
func plan(seed uint64, total, gapMin, gapMax, etcdDownMax time.Duration, extraKinds ...string) []plannedFault {
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	var out []plannedFault
	var deck []string
	var at time.Duration
	for n := 1; ; n++ {
		gap := gapMin + time.Duration(r.Int64N(int64(gapMax-gapMin)+1))
		if len(deck) == 0 {
			deck = append(append([]string(nil), faultKinds...), extraKinds...)
			r.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		f := plannedFault{n: n, gap: gap, kind: deck[0], pick: r.Uint64()}
		deck = deck[1:]
		switch f.kind {
		case faultEtcdKill:
			f.down = time.Second + time.Duration(r.Int64N(int64(etcdDownMax-time.Second)+1))
		case faultAgentKill, faultCoordinatorKill:
			f.down = time.Second + time.Duration(r.Int64N(int64(restartDelayMax-1)*int64(time.Second)+1))
		case faultLeaderKill, faultMemberDown, faultMemberDisk, faultQuorumLoss:
			f.down = drawMemberDown(r, f.kind)
		}
		at += gap
		if at > total {
			return out
		}
		out = append(out, f)
	}
}

// injected is a fault as it happened.
type injected struct {
	plannedFault
	at, end time.Time
	target  string
	skipped string // why no fault was injected
}

func (f *injected) String() string {
	if f.skipped != "" {
		return fmt.Sprintf("fault #%d %s skipped: %s", f.n, f.kind, f.skipped)
	}
	return fmt.Sprintf("fault #%d %s on %s", f.n, f.kind, f.target)
}

var errNoTarget = errors.New("no target")

// inject carries out one fault. It returns errNoTarget (wrapped) when there
// is nothing to inject it on right now.
func (s *soak) inject(ctx context.Context, f *injected) error {
	pick := func(n int) int { return int(f.pick % uint64(n)) }
	if handled, err := s.inject24(ctx, f); handled {
		return err
	}
	if handled, err := s.injectMember(ctx, f); handled {
		return err
	}
	switch f.kind {
	case faultWorkerKill, faultHyperpodrunKill, faultHyperpodrunStop:
		var cands []proc
		for _, p := range s.scan.scan() {
			if f.kind == faultWorkerKill && p.worker || f.kind != faultWorkerKill && p.hyperpodrun {
				if p.state != 'T' && s.jobs.running(p.job) {
					cands = append(cands, p)
				}
			}
		}
		if len(cands) == 0 {
			return fmt.Errorf("%w: no live %s", errNoTarget, strings.SplitN(f.kind, "_", 2)[0])
		}
		sort.Slice(cands, func(i, j int) bool {
			a, b := cands[i], cands[j]
			if a.job != b.job {
				return a.job < b.job
			}
			if a.rank != b.rank {
				return a.rank < b.rank
			}
			if a.node != b.node {
				return a.node < b.node
			}
			return a.pid < b.pid
		})
		p := cands[pick(len(cands))]
		f.target = p.String()
		if f.kind != faultHyperpodrunStop {
			return syscall.Kill(p.pid, syscall.SIGKILL)
		}
		if err := syscall.Kill(p.pid, syscall.SIGSTOP); err != nil {
			return err
		}
		s.stopped.Store(int64(p.pid))
		defer func() {
			syscall.Kill(p.pid, syscall.SIGCONT)
			s.stopped.Store(0)
		}()
		return sleep(ctx, stopFor)
	case faultAgentKill:
		i := pick(len(s.agents))
		a := s.agents[i]
		f.target = fmt.Sprintf("node agent %s (pid %d)", a.name, a.pid())
		syscall.Kill(a.pid(), syscall.SIGKILL)
		if err := waitFor(ctx, 10*time.Second, a); err != nil {
			return err
		}
		if err := sleep(ctx, f.down); err != nil {
			return err
		}
		return s.startAgent(i)
	case faultCoordinatorKill:
		i, err := s.leader(ctx)
		if err != nil {
			return fmt.Errorf("%w: no leader: %v", errNoTarget, err)
		}
		c := s.coords[i]
		f.target = fmt.Sprintf("leading coordinator %s (pid %d)", c.name, c.pid())
		syscall.Kill(c.pid(), syscall.SIGKILL)
		if err := waitFor(ctx, 10*time.Second, c); err != nil {
			return err
		}
		if err := sleep(ctx, f.down); err != nil {
			return err
		}
		return s.startCoordinator(i)
	case faultEtcdKill:
		f.target = fmt.Sprintf("etcd (pid %d), restarted on the same data dir", s.etcd.pid())
		syscall.Kill(s.etcd.pid(), syscall.SIGKILL)
		if err := waitFor(ctx, 10*time.Second, s.etcd); err != nil {
			return err
		}
		if err := sleep(ctx, f.down); err != nil {
			return err
		}
		return s.startEtcd(ctx)
	case faultEtcdWipe:
		return s.wipeEtcd(ctx, f)
	case faultCorruptTeam, faultCorruptCkpt, faultCorruptRestarts, faultCorruptNode:
		var key string
		switch f.kind {
		case faultCorruptTeam:
			key = s.keys.Team(teamName)
		case faultCorruptNode:
			key = s.keys.Node("x")
		default:
			jobs := s.jobs.runningNames()
			if len(jobs) == 0 {
				return fmt.Errorf("%w: no running job", errNoTarget)
			}
			j := jobs[pick(len(jobs))]
			if f.kind == faultCorruptCkpt {
				key = s.keys.Checkpoint(j)
			} else {
				key = s.keys.Restarts(j)
			}
		}
		f.target = key
		return s.corrupt(ctx, key)
	}
	return fmt.Errorf("unknown fault kind %q", f.kind)
}

// corrupt writes a malformed value under key, holds it for corruptHold, then
// puts the previous value back (or deletes the key if it had none) unless
// something wrote the key meanwhile: a transient bad write.
func (s *soak) corrupt(ctx context.Context, key string) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	prev, err := s.etcdCli.Get(cctx, key)
	if err == nil {
		var put *clientv3.PutResponse
		put, err = s.etcdCli.Put(cctx, key, corruptValue)
		if err == nil {
			cancel()
			if err := sleep(ctx, s.cfg.corruptHold); err != nil {
				return err
			}
			cctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
			restore := clientv3.OpDelete(key)
			if len(prev.Kvs) > 0 {
				restore = clientv3.OpPut(key, string(prev.Kvs[0].Value))
			}
			_, err = s.etcdCli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", put.Header.Revision)).Then(restore).Commit()
		}
	}
	cancel()
	if err != nil {
		return fmt.Errorf("corrupt %s: %w", key, err)
	}
	return nil
}

// leader returns the index of the leading coordinator, read from the
// election's first key.
func (s *soak) leader(ctx context.Context) (int, error) {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resp, err := s.etcdCli.Get(cctx, s.keys.Leader()+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) == 0 {
		return 0, errors.New("no election key")
	}
	id := string(resp.Kvs[0].Value)
	for i, c := range s.coords {
		if c.name == id && !c.exited() {
			return i, nil
		}
	}
	return 0, fmt.Errorf("leader %q is not a live coordinator of the soak", id)
}

func waitFor(ctx context.Context, d time.Duration, c *child) error {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return c.wait(wctx)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// keysFor is the one place the soak names etcd keys: package fleet's.
func keysFor() fleet.Keys { return fleet.NewKeys("") }

func nopZap() *zap.Logger { return zap.NewNop() }

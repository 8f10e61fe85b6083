package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// wipeStopWithin bounds how long the node agents may take to stop the
// jobs of a wiped etcd: the jobs' graceful timeout (20 s), the agents'
// drain margin (30 s) and their lease (5 s), with room.
const wipeStopWithin = 90 * time.Second

// wipeEtcd is the etcd_wipe fault (issue 24): etcd SIGKILLed, its data
// directory removed, and started again on the same ports, empty. The
// jobs it held are gone from the control plane: the invariant is that
// the node agents stop every process of them (nothing trains unseen, no
// node is booked twice) within wipeStopWithin. Then the soak does what
// the operator does (docs/disaster-recovery.md): the team again, and the
// jobs resubmitted (new generations: their checkpoint records went with
// the data). With etcd auth on, the users and roles went too, and every
// daemon would need new passwords: the fault is not injected then.
func (s *soak) wipeEtcd(ctx context.Context, f *injected) error {
	if s.cfg.auth {
		// Not errNoTarget: skipped at once, not retried.
		return errors.New("etcd_wipe needs -auth=false (after a wipe, auth must be bootstrapped again and every daemon restarted with new passwords)")
	}
	wiped := s.jobs.runningNames()
	if len(wiped) == 0 {
		return fmt.Errorf("%w: no running job", errNoTarget)
	}
	kinds := map[string]string{}
	for _, j := range s.jobs.snapshot() {
		if slices.Contains(wiped, j.name) {
			kinds[j.name] = j.kind
		}
	}
	f.target = fmt.Sprintf("etcd (pid %d): data directory wiped under %v", s.etcd.pid(), wiped)
	syscall.Kill(s.etcd.pid(), syscall.SIGKILL)
	if err := waitFor(ctx, 10*time.Second, s.etcd); err != nil {
		return err
	}
	s.jobs.wipe(wiped)
	data := filepath.Join(s.work, "etcd")
	if err := os.RemoveAll(data); err != nil {
		return fmt.Errorf("wipe etcd's data: %w", err)
	}
	if err := os.Mkdir(data, 0o700); err != nil {
		return fmt.Errorf("wipe etcd's data: %w", err)
	}
	if err := s.startEtcd(ctx); err != nil {
		return err
	}
	left := func() []proc {
		var ps []proc
		for _, p := range s.scan.scan() {
			if (p.worker || p.hyperpodrun) && slices.Contains(wiped, p.job) {
				ps = append(ps, p)
			}
		}
		return ps
	}
	if err := s.until(ctx, wipeStopWithin, func() bool { return len(left()) == 0 }); err != nil && ctx.Err() == nil {
		s.violate("the jobs of a wiped etcd are stopped", fmt.Sprintf("%d process(es) of %v still run %s after etcd was wiped: %v",
			len(left()), wiped, wipeStopWithin, left()))
	}
	if err := s.until(ctx, 30*time.Second, func() bool { return s.applyTeam(ctx) == nil }); err != nil {
		return fmt.Errorf("apply the team to the wiped etcd: %w", err)
	}
	for _, n := range wiped {
		go func() {
			if err := s.submit(ctx, kinds[n]); err != nil && ctx.Err() == nil {
				s.log.Error("resubmit after the wipe", "kind", kinds[n], "err", err)
			}
		}()
	}
	return nil
}

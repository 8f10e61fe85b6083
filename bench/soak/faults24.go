package main

// Issue 24's faults beyond etcd_wipe: a full checkpoint disk, a hung
// worker and a long freeze of a node's hyperpodrun, each with the
// invariant a user would check.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"syscall"
	"time"
)

const (
	// faultDiskFull makes a running job's checkpoint directory read-only
	// (a read-only bind mount: EROFS for every writer, root included) for
	// diskFullFor: its saves fail. Root only.
	faultDiskFull = "checkpoint_disk_full"
	// faultWorkerHang SIGSTOPs one worker of a DDP job: the others wait in
	// their collective; hyperpodrun's hang detection (the soak's DDP jobs
	// run with --hang-timeout and --hang-startup-timeout soakHangTimeout:
	// a worker stopped right after a restart, before its first heartbeat
	// of the round, is found by the latter) must find it.
	faultWorkerHang = "worker_hang"
	// faultLongFreeze SIGSTOPs a node's hyperpodrun for longFreezeFor,
	// longer than its rendezvous lease: fenced, it must rejoin its job.
	faultLongFreeze = "hyperpodrun_long_freeze"

	diskFullFor     = 20 * time.Second
	soakHangTimeout = 20 * time.Second
	longFreezeFor   = 30 * time.Second
	// diskBackWithin bounds how long a job whose disk came back may take to
	// commit a checkpoint past its last one (or end visibly).
	diskBackWithin = 2 * time.Minute
	// hangFoundWithin bounds how long a hung worker may live: the hang
	// timeout, a heartbeat interval, the stack dumps, the shutdown timeout
	// (stopped before its first heartbeat of a round: the start-up timeout,
	// as long, from the round's start, which came before).
	hangFoundWithin = soakHangTimeout + 45*time.Second
	// hangTargetWithin bounds the wait for a DDP worker to hang.
	hangTargetWithin = 90 * time.Second
	// rejoinWithin bounds how long a frozen node may take to run its job's
	// workers again after SIGCONT.
	rejoinWithin = time.Minute
)

// faults24Kinds are the kinds faults24.go adds to the deck.
var faults24Kinds = []string{faultDiskFull, faultWorkerHang, faultLongFreeze}

func init() { faultKinds = append(faultKinds, faults24Kinds...) }

// hangTimeoutEnv is the job-spec environment that gives the soak's jobs a
// short --hang-timeout and --hang-startup-timeout (hyperpodrun reads
// PET_HANG_TIMEOUT and PET_HANG_STARTUP_TIMEOUT, as torchrun reads PET_*
// for its flags).
func hangTimeoutEnv(env map[string]string) {
	env["PET_HANG_TIMEOUT"] = fmt.Sprintf("%.0f", soakHangTimeout.Seconds())
	env["PET_HANG_STARTUP_TIMEOUT"] = fmt.Sprintf("%.0f", soakHangTimeout.Seconds())
}

// inject24 carries out one of faults24Kinds; handled is false for the
// other kinds.
func (s *soak) inject24(ctx context.Context, f *injected) (handled bool, err error) {
	switch f.kind {
	case faultDiskFull:
		return true, s.ckptDiskFull(ctx, f)
	case faultWorkerHang:
		return true, s.workerHang(ctx, f)
	case faultLongFreeze:
		return true, s.longFreeze(ctx, f)
	}
	return false, nil
}

// pickProc picks, with f's draw, a live process of a running job that
// match accepts.
func (s *soak) pickProc(f *injected, what string, match func(proc) bool) (proc, error) {
	var cands []proc
	for _, p := range s.scan.scan() {
		if p.state != 'T' && s.jobs.running(p.job) && match(p) {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		return proc{}, fmt.Errorf("%w: no live %s", errNoTarget, what)
	}
	sort.Slice(cands, func(i, j int) bool {
		if cands[i].job != cands[j].job {
			return cands[i].job < cands[j].job
		}
		return cands[i].pid < cands[j].pid
	})
	return cands[int(f.pick%uint64(len(cands)))], nil
}

// committed is the highest committed step the soak saw of job, whether it
// ended, and whether etcd lost it.
func (s *soak) committed(job string) (step int64, ended bool) {
	for _, j := range s.jobs.snapshot() {
		if j.name == job {
			return j.committed, j.finished || j.wiped
		}
	}
	return 0, true
}

// ckptDiskFull is faultDiskFull.
func (s *soak) ckptDiskFull(ctx context.Context, f *injected) error {
	if os.Geteuid() != 0 {
		return errors.New("checkpoint_disk_full needs root (a read-only bind mount)")
	}
	jobs := s.jobs.runningNames()
	if len(jobs) == 0 {
		return fmt.Errorf("%w: no running job", errNoTarget)
	}
	job := jobs[int(f.pick%uint64(len(jobs)))]
	dir := filepath.Join(s.work, "ckpt", job)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("%w: job %s has no checkpoint directory yet", errNoTarget, job)
	}
	before, _ := s.committed(job)
	f.target = fmt.Sprintf("checkpoint directory of %s (%s) read-only for %s", job, dir, diskFullFor)
	if out, err := exec.Command("mount", "--bind", dir, dir).CombinedOutput(); err != nil {
		return fmt.Errorf("bind-mount %s: %v: %s", dir, err, out)
	}
	unmount := func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			s.log.Error("unmount the read-only checkpoint directory", "dir", dir, "err", err, "out", string(out))
		}
	}
	if out, err := exec.Command("mount", "-o", "remount,bind,ro", dir).CombinedOutput(); err != nil {
		unmount()
		return fmt.Errorf("remount %s read-only: %v: %s", dir, err, out)
	}
	err := sleep(ctx, diskFullFor)
	unmount()
	if err != nil {
		return err
	}
	back := func() bool {
		step, ended := s.committed(job)
		return ended || step > before
	}
	if err := s.until(ctx, diskBackWithin, back); err != nil && ctx.Err() == nil {
		step, _ := s.committed(job)
		s.violate("a job whose checkpoint disk was full commits again once it is back",
			fmt.Sprintf("job %s committed step %d before its disk was full and no later step within %s of the disk coming back (now %d)", job, before, diskBackWithin, step))
	}
	return nil
}

// workerHang is faultWorkerHang.
func (s *soak) workerHang(ctx context.Context, f *injected) error {
	// A DDP job is between two runs (admitted, or starting its workers)
	// for a good part of the soak: wait a while for a worker of one that
	// trained (its loop calls the helper, so it is watched), rather than
	// skip the fault (two 20-minute runs skipped every worker_hang).
	var p proc
	err := s.until(ctx, hangTargetWithin, func() bool {
		var perr error
		p, perr = s.pickProc(f, "DDP worker of a job that trained", func(p proc) bool {
			return p.worker && s.jobKind(p.job) == kindDDP && s.jobTrained(p.job)
		})
		return perr == nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: no live DDP worker of a job that trained within %s", errNoTarget, hangTargetWithin)
	}
	f.target = p.String() + " SIGSTOPped (hung)"
	if err := syscall.Kill(p.pid, syscall.SIGSTOP); err != nil {
		return err
	}
	s.stopped.Store(int64(p.pid))
	defer s.stopped.Store(0)
	gone := func() bool { return !s.alive(p) }
	if err := s.until(ctx, hangFoundWithin, gone); err != nil && ctx.Err() == nil {
		s.violate("a hung worker is found and stopped within the hang timeout",
			fmt.Sprintf("%s still alive %s after it hung (--hang-timeout %s); resumed", p, hangFoundWithin, soakHangTimeout))
		syscall.Kill(p.pid, syscall.SIGCONT)
	}
	return nil
}

// longFreeze is faultLongFreeze.
func (s *soak) longFreeze(ctx context.Context, f *injected) error {
	p, err := s.pickProc(f, "hyperpodrun", func(p proc) bool { return p.hyperpodrun })
	if err != nil {
		return err
	}
	old := map[int]bool{}
	for _, w := range s.scan.scan() {
		if w.worker && w.job == p.job && w.node == p.node {
			old[w.pid] = true
		}
	}
	f.target = fmt.Sprintf("%s SIGSTOPped for %s", p, longFreezeFor)
	if err := syscall.Kill(p.pid, syscall.SIGSTOP); err != nil {
		return err
	}
	s.stopped.Store(int64(p.pid))
	err = sleep(ctx, longFreezeFor)
	syscall.Kill(p.pid, syscall.SIGCONT)
	s.stopped.Store(0)
	if err != nil {
		return err
	}
	back := func() bool {
		if _, ended := s.committed(p.job); ended || !s.alive(p) {
			return true // the job ended, or this hyperpodrun did (its agent restarts it)
		}
		for _, w := range s.scan.scan() {
			if w.worker && w.job == p.job && w.node == p.node && !old[w.pid] && w.state != 'T' {
				return true
			}
		}
		return false
	}
	if err := s.until(ctx, rejoinWithin, back); err != nil && ctx.Err() == nil {
		s.violate("a node frozen past its lease rejoins its job",
			fmt.Sprintf("%s runs no worker of its job %s after it was frozen %s", p, rejoinWithin, longFreezeFor))
	}
	return nil
}

// alive reports whether p is still the live process it was.
func (s *soak) alive(p proc) bool {
	for _, q := range s.scan.scan() {
		if q.pid == p.pid && q.start == p.start {
			return q.state != 'Z'
		}
	}
	return false
}

// jobKind is the kind of job name ("" if unknown).
// jobTrained says whether job name's rank 0 reported a step.
func (s *soak) jobTrained(name string) bool {
	for _, j := range s.jobs.snapshot() {
		if j.name == name {
			return j.maxStep > 0
		}
	}
	return false
}

func (s *soak) jobKind(name string) string {
	for _, j := range s.jobs.snapshot() {
		if j.name == name {
			return j.kind
		}
	}
	return ""
}

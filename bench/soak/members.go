package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A 3-member etcd (issue 27, -etcd-members 3 or $SOAK_ETCD_MEMBERS=3): the
// fleet runs on a cluster of Debian etcd members on loopback, every daemon
// and job given every member's endpoint, and the fault deck gains the
// member faults below. Member m3's data directory is a small tmpfs of its
// own (as root), so the disk_full fault really fills the disk under it.

// Member fault kinds.
const (
	faultLeaderKill   = "etcd_leader_kill" // the leader SIGKILLed, restarted after down
	faultMemberDown   = "etcd_member_down" // a member stopped for minutes, the faults go on
	faultMemberDisk   = "etcd_disk_full"   // m3's disk filled for down, then freed
	faultQuorumLoss   = "etcd_quorum_loss" // two members SIGKILLed for quorumLossFor
	quorumLossFor     = 30 * time.Second   // issue 27: quorum lost for 30 s, then restored
	memberDiskSize    = 256 << 20          // m3's tmpfs: 4 WAL segments and the backend
	memberReadyWithin = 60 * time.Second   // a restarted member answers Status
	memberDownMin     = 2 * time.Minute    // etcd_member_down's length, uniform in
	memberDownMax     = 4 * time.Minute    // [memberDownMin, memberDownMax]
	diskFullMin       = 20 * time.Second   // etcd_disk_full's length, uniform in
	diskFullMax       = 60 * time.Second   // [diskFullMin, diskFullMax]
	leaderDownMax     = 5 * time.Second    // the killed leader's restart delay, 1 s to this
	memberTmpfsName   = "m3"               // the member whose data directory is a tmpfs
	memberFaultsSkip  = "a member is down" // why a member fault waits
)

// memberFaultKinds are dealt into the deck with 3 members or more (the
// leader kill twice: the routine one).
var memberFaultKinds = []string{faultLeaderKill, faultLeaderKill, faultMemberDown, faultMemberDisk, faultQuorumLoss}

// drawMemberDown draws how long a member fault keeps its member(s) down.
func drawMemberDown(r *rand.Rand, kind string) time.Duration {
	span := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(r.Int64N(int64(hi-lo)+1)) }
	switch kind {
	case faultLeaderKill:
		return span(time.Second, leaderDownMax)
	case faultMemberDown:
		return span(memberDownMin, memberDownMax)
	case faultMemberDisk:
		return span(diskFullMin, diskFullMax)
	case faultQuorumLoss:
		return quorumLossFor
	}
	return 0
}

// member is one etcd process of the soak's cluster.
type member struct {
	name, client, peer, dir string
	tmpfs                   bool // dir is a tmpfs mounted by the soak
	c                       *child
}

// cluster is the soak's multi-member etcd.
type cluster struct {
	mu      sync.Mutex
	members []*member
	busy    string // a member fault in progress (its member(s) down): others wait
}

// startCluster starts cfg.etcdMembers members and waits until each
// answers Status. s.endpoint becomes every member's client URL.
func (s *soak) startCluster(ctx context.Context) error {
	ports, err := freePorts(2 * s.cfg.etcdMembers)
	if err != nil {
		return err
	}
	s.cluster = &cluster{}
	var initial, clients []string
	for i := 0; i < s.cfg.etcdMembers; i++ {
		m := &member{name: fmt.Sprintf("m%d", i+1), dir: filepath.Join(s.work, "etcd", fmt.Sprintf("m%d", i+1)),
			client: fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]), peer: fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1])}
		if err := os.MkdirAll(m.dir, 0o700); err != nil {
			return fmt.Errorf("etcd member %s: %w", m.name, err)
		}
		if m.name == memberTmpfsName && os.Geteuid() == 0 {
			out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", memberDiskSize), "soak-"+m.name, m.dir).CombinedOutput()
			if err != nil {
				return fmt.Errorf("mount a tmpfs for etcd member %s: %v: %s", m.name, err, out)
			}
			m.tmpfs = true
		}
		s.cluster.members = append(s.cluster.members, m)
		initial = append(initial, m.name+"="+m.peer)
		clients = append(clients, m.client)
	}
	s.endpoint = strings.Join(clients, ",")
	for _, m := range s.cluster.members {
		if err := s.startMember(m, strings.Join(initial, ",")); err != nil {
			return err
		}
	}
	for _, m := range s.cluster.members {
		if err := s.memberReady(ctx, m); err != nil {
			return err
		}
	}
	s.etcd = s.cluster.members[0].c
	s.log.Info("etcd cluster up", "members", len(s.cluster.members), "endpoints", s.endpoint, "tmpfs_member", memberTmpfsName)
	return nil
}

// startMember starts m's process; a member with data rejoins its cluster
// from it (etcd ignores --initial-cluster then).
func (s *soak) startMember(m *member, initial string) error {
	if initial == "" {
		var ps []string
		for _, o := range s.cluster.members {
			ps = append(ps, o.name+"="+o.peer)
		}
		initial = strings.Join(ps, ",")
	}
	args := []string{"--name", m.name, "--data-dir", filepath.Join(m.dir, "data"),
		"--listen-client-urls", m.client, "--advertise-client-urls", m.client,
		"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
		"--initial-cluster", initial, "--initial-cluster-state", "new", "--log-level", "warn"}
	if s.cfg.auth {
		flag, err := jwtKeys(filepath.Join(s.work, "etcd-jwt"))
		if err != nil {
			return err
		}
		args = append(args, "--auth-token", flag, "--bcrypt-cost", "4")
	}
	c, err := s.sup.start("etcd-"+m.name, s.cfg.etcdBin, args...)
	if err != nil {
		return err
	}
	m.c = c
	return nil
}

// memberStatus asks m alone for its status (no user needed).
func memberStatus(ctx context.Context, m *member) (*clientv3.StatusResponse, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.client}, DialTimeout: time.Second, Logger: nopZap()})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return cli.Status(sctx, m.client)
}

// memberReady waits until m answers Status (or exits).
func (s *soak) memberReady(ctx context.Context, m *member) error {
	var last error
	err := s.until(ctx, memberReadyWithin, func() bool {
		if m.c.exited() {
			last = errors.New("it exited")
			return true
		}
		_, last = memberStatus(ctx, m)
		return last == nil
	})
	if err == nil && m.c.exited() {
		err = errors.New("exited")
	}
	if err != nil {
		return fmt.Errorf("etcd member %s never answered at %s (log %s): %w (last: %v)", m.name, m.client,
			filepath.Join(s.work, "logs", "etcd-"+m.name+".log"), err, last)
	}
	return nil
}

// leaderMember is the member the running members agree leads.
func (s *soak) leaderMember(ctx context.Context) (*member, error) {
	var leader uint64
	var lm *member
	for _, m := range s.cluster.members {
		if m.c.exited() {
			continue
		}
		st, err := memberStatus(ctx, m)
		if err != nil {
			return nil, fmt.Errorf("status of %s: %w", m.name, err)
		}
		if st.Leader == 0 || (leader != 0 && st.Leader != leader) {
			return nil, fmt.Errorf("no agreed leader (%s sees %x)", m.name, st.Leader)
		}
		leader = st.Leader
		if st.Header.MemberId == st.Leader {
			lm = m
		}
	}
	if lm == nil {
		return nil, errors.New("the leader is not a running member")
	}
	return lm, nil
}

// killMember SIGKILLs m and waits for it to exit.
func (s *soak) killMember(ctx context.Context, m *member) error {
	syscall.Kill(m.c.pid(), syscall.SIGKILL)
	return waitFor(ctx, 10*time.Second, m.c)
}

// restartMember starts m again and waits until it answers.
func (s *soak) restartMember(ctx context.Context, m *member) error {
	if !m.c.exited() {
		return nil
	}
	if err := s.startMember(m, ""); err != nil {
		return err
	}
	return s.memberReady(ctx, m)
}

// claim marks a member fault in progress; it fails (errNoTarget: retried,
// then skipped) while another holds its member(s) down.
func (c *cluster) claim(kind string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy != "" {
		return fmt.Errorf("%w: %s (%s)", errNoTarget, memberFaultsSkip, c.busy)
	}
	c.busy = kind
	return nil
}

func (c *cluster) release() {
	c.mu.Lock()
	c.busy = ""
	c.mu.Unlock()
}

// injectMember carries out a member fault; handled is false for other
// kinds. Every fault leaves every member running when it is over, except
// etcd_member_down, which returns at once and restarts its member after
// f.down on its own (other faults go on meanwhile; member faults wait).
func (s *soak) injectMember(ctx context.Context, f *injected) (handled bool, err error) {
	if s.cluster == nil {
		switch f.kind {
		case faultLeaderKill, faultMemberDown, faultMemberDisk, faultQuorumLoss:
			return true, errors.New("a member fault needs -etcd-members 3")
		}
		return false, nil
	}
	switch f.kind {
	case faultLeaderKill, faultMemberDown, faultMemberDisk, faultQuorumLoss, faultEtcdKill:
	case faultEtcdWipe:
		return true, errors.New("etcd_wipe is injected on a single-member etcd only")
	default:
		return false, nil
	}
	if err := s.cluster.claim(f.kind); err != nil {
		return true, err
	}
	if f.kind == faultMemberDown {
		return true, s.memberDown(ctx, f)
	}
	defer s.cluster.release()
	switch f.kind {
	case faultLeaderKill:
		l, err := s.leaderMember(ctx)
		if err != nil {
			return true, fmt.Errorf("%w: %v", errNoTarget, err)
		}
		f.target = fmt.Sprintf("etcd leader %s (pid %d), restarted after %s", l.name, l.c.pid(), f.down.Round(100*time.Millisecond))
		if err := s.killMember(ctx, l); err != nil {
			return true, err
		}
		if err := sleep(ctx, f.down); err != nil {
			return true, err
		}
		return true, s.restartMember(ctx, l)
	case faultQuorumLoss:
		l, err := s.leaderMember(ctx)
		if err != nil {
			return true, fmt.Errorf("%w: %v", errNoTarget, err)
		}
		var down []*member
		for _, m := range s.cluster.members {
			if m != l && len(down) < 2 {
				down = append(down, m)
			}
		}
		f.target = fmt.Sprintf("etcd members %s and %s SIGKILLed for %s (no quorum)", down[0].name, down[1].name, f.down)
		for _, m := range down {
			if err := s.killMember(ctx, m); err != nil {
				return true, err
			}
		}
		if err := sleep(ctx, f.down); err != nil {
			return true, err
		}
		for _, m := range down {
			if err := s.restartMember(ctx, m); err != nil {
				return true, err
			}
		}
		return true, nil
	case faultEtcdKill:
		f.target = fmt.Sprintf("every etcd member SIGKILLed for %s", f.down.Round(100*time.Millisecond))
		for _, m := range s.cluster.members {
			if err := s.killMember(ctx, m); err != nil {
				return true, err
			}
		}
		if err := sleep(ctx, f.down); err != nil {
			return true, err
		}
		for _, m := range s.cluster.members {
			if err := s.startMember(m, ""); err != nil {
				return true, err
			}
		}
		for _, m := range s.cluster.members {
			if err := s.memberReady(ctx, m); err != nil {
				return true, err
			}
		}
		return true, nil
	case faultMemberDisk:
		return true, s.diskFull(ctx, f)
	}
	return true, nil
}

// memberDown stops a follower (SIGTERM) and restarts it after f.down, in
// the background; the cluster stays claimed until it is back.
func (s *soak) memberDown(ctx context.Context, f *injected) error {
	l, err := s.leaderMember(ctx)
	if err != nil {
		s.cluster.release()
		return fmt.Errorf("%w: %v", errNoTarget, err)
	}
	var fs []*member
	for _, m := range s.cluster.members {
		if m != l {
			fs = append(fs, m)
		}
	}
	m := fs[int(f.pick%uint64(len(fs)))]
	f.target = fmt.Sprintf("etcd member %s (pid %d) stopped for %s", m.name, m.c.pid(), f.down.Round(time.Second))
	s.sup.stop(m.c, 10*time.Second)
	go func() {
		defer s.cluster.release()
		if sleep(ctx, f.down) != nil {
			return
		}
		if err := s.restartMember(ctx, m); err != nil {
			s.violate("a stopped etcd member rejoins", err.Error())
			return
		}
		s.log.Info("etcd member back", "member", m.name, "after", f.down.Round(time.Second))
	}()
	return nil
}

// diskFull fills the tmpfs under member m3's data directory, holds it full
// for f.down, frees it, and restarts the member if the full disk ended it.
func (s *soak) diskFull(ctx context.Context, f *injected) error {
	var m *member
	for _, o := range s.cluster.members {
		if o.tmpfs {
			m = o
		}
	}
	if m == nil {
		return errors.New("etcd_disk_full needs root (the member's data directory is a tmpfs the soak mounts)")
	}
	filler := filepath.Join(m.dir, "filler")
	n, err := fill(filler)
	if err != nil {
		os.Remove(filler)
		return fmt.Errorf("fill %s's disk: %w", m.name, err)
	}
	f.target = fmt.Sprintf("etcd member %s's disk filled (%d MiB) for %s", m.name, n>>20, f.down.Round(time.Second))
	serr := sleep(ctx, f.down)
	died := m.c.exited()
	if err := os.Remove(filler); err != nil {
		return fmt.Errorf("free %s's disk: %w", m.name, err)
	}
	if serr != nil {
		return serr
	}
	if died {
		f.target += "; it exited on the full disk and was restarted"
	}
	return s.restartMember(ctx, m)
}

// fill writes zeros to path until the file system is full (ENOSPC) and
// returns how many bytes it wrote.
func fill(path string) (int64, error) {
	fh, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer fh.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		w, err := fh.Write(buf)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// unmountMembers unmounts the members' tmpfs (after every member exited).
func (s *soak) unmountMembers() {
	if s.cluster == nil {
		return
	}
	for _, m := range s.cluster.members {
		if m.tmpfs {
			if out, err := exec.Command("umount", m.dir).CombinedOutput(); err != nil {
				s.log.Error("unmount an etcd member's tmpfs", "dir", m.dir, "err", err, "out", strings.TrimSpace(string(out)))
			}
		}
	}
}

// memberKinds are the fault kinds the cluster adds to the deck: the
// member faults with 3 members or more.
func (c config) memberKinds() []string {
	if c.etcdMembers >= 3 {
		return memberFaultKinds
	}
	return nil
}

// envInt is $name as an integer, def when unset or not one.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}

// reportKinds are the kinds the report counts: every kind, the member
// faults once each with 3 members or more.
func (c config) reportKinds() []string {
	out := append([]string(nil), faultKinds...)
	for _, k := range c.memberKinds() {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

package etcdtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// Cluster is a multi-member etcd cluster of real etcd processes on
// loopback (Debian's etcd binary), one data directory per member under the
// test's temp dir. A test can find the leader, SIGKILL, stop and restart
// members, and move the leadership. Every process is stopped when the
// test ends.
type Cluster struct {
	t       testing.TB
	bin     string
	args    []string // every member's extra flags
	Members []*Member
}

// Member is one etcd process of a Cluster.
type Member struct {
	Name   string
	URL    string // client URL
	peer   string
	dir    string
	c      *Cluster
	mu     sync.Mutex
	cmd    *exec.Cmd
	waited chan struct{}
	logf   *os.File
}

// StartCluster starts an n-member cluster on Debian's etcd (DebianEtcd;
// the test is skipped when it is not installed) and waits until every
// member answers and a leader is elected.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return StartClusterArgs(t, n)
}

// StartClusterArgs is StartCluster with extra flags for every member,
// e.g. "--heartbeat-interval", "50", "--election-timeout", "500".
func StartClusterArgs(t testing.TB, n int, args ...string) *Cluster {
	t.Helper()
	bin, ok := DebianEtcd()
	if !ok {
		t.Skipf("no etcd binary at %s (apt-get install etcd-server, or set HYPERPODRUN_ETCD_BINARY)", bin)
	}
	if n < 1 {
		t.Fatalf("StartCluster: %d members", n)
	}
	c := &Cluster{t: t, bin: bin, args: args}
	t.Cleanup(func() {
		for _, m := range c.Members {
			m.Stop()
		}
	})
	// A port found free can be taken (an outgoing connection's ephemeral
	// port) before etcd binds it: a member that exits while the cluster
	// forms is tried again, all members on fresh ports.
	const tries = 3
	for try := 1; ; try++ {
		err := c.form(n)
		if err == nil {
			break
		}
		if try == tries {
			t.Fatalf("start a %d-member etcd cluster (%d tries): %v", n, tries, err)
		}
		t.Logf("etcd cluster did not form, trying again on fresh ports: %v", err)
		for _, m := range c.Members {
			m.Stop()
		}
	}
	c.Leader()
	return c
}

// form starts n fresh members on newly found ports and waits until every
// one answers; it fails early when a member exits.
func (c *Cluster) form(n int) error {
	c.Members = nil
	var initial []string
	for i := 1; i <= n; i++ {
		m := &Member{Name: fmt.Sprintf("m%d", i), c: c, dir: c.t.TempDir(),
			URL:  fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(c.t)),
			peer: fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(c.t))}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.peer)
	}
	for _, m := range c.Members {
		if err := m.spawn(strings.Join(initial, ",")); err != nil {
			return err
		}
	}
	for _, m := range c.Members {
		if err := m.ready(30 * time.Second); err != nil {
			return err
		}
	}
	return nil
}

// Endpoints are every member's client URL.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.URL)
	}
	return eps
}

// Client is a client on every member's endpoint, closed when the test
// ends.
func (c *Cluster) Client() *clientv3.Client {
	c.t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cli.Close() })
	return cli
}

// status asks one member for its status, with a 1 s deadline.
func (m *Member) status() (*clientv3.StatusResponse, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.URL}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", m.Name, err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := cli.Status(ctx, m.URL)
	if err != nil {
		return nil, fmt.Errorf("status of %s: %w", m.Name, err)
	}
	return st, nil
}

// Leader waits (up to 30 s) until the running members agree on a leader
// that is one of them, and returns it.
func (c *Cluster) Leader() *Member {
	c.t.Helper()
	var leader *Member
	testutil.Eventually(c.t, 30*time.Second, "an etcd leader", func() (bool, string) {
		var seen string
		leader, seen = c.leaderNow()
		return leader != nil, seen
	})
	return leader
}

// leaderNow is the leader the running members agree on, nil when they do
// not (yet), and what each answered.
func (c *Cluster) leaderNow() (*Member, string) {
	var leader *Member
	var seen []string
	var id uint64
	for _, m := range c.Members {
		if !m.Running() {
			continue
		}
		st, err := m.status()
		if err != nil {
			return nil, strings.Join(append(seen, err.Error()), "; ")
		}
		seen = append(seen, fmt.Sprintf("%s: leader %x", m.Name, st.Leader))
		if st.Leader == 0 || (id != 0 && st.Leader != id) {
			return nil, strings.Join(seen, "; ")
		}
		id = st.Leader
		if st.Header.MemberId == st.Leader {
			leader = m
		}
	}
	return leader, strings.Join(seen, "; ")
}

// Settled waits (up to 30 s) until the running members agree on a leader
// and every one of them has applied the leader's log as it was when the
// wait began: a restarted member has caught up, so the next leader
// change is a routine one (a member that lags cannot win the election,
// which then takes several rounds). It returns the leader.
func (c *Cluster) Settled() *Member {
	c.t.Helper()
	l := c.Leader()
	st, err := l.status()
	for err != nil {
		l = c.Leader()
		st, err = l.status()
	}
	target := st.Header.Revision
	testutil.Eventually(c.t, 30*time.Second, "every etcd member caught up with the leader", func() (bool, string) {
		var lag []string
		for _, m := range c.Members {
			if !m.Running() {
				continue
			}
			ms, err := m.status()
			if err != nil {
				lag = append(lag, err.Error())
				continue
			}
			if ms.Header.Revision < target || ms.RaftAppliedIndex < ms.RaftIndex {
				lag = append(lag, fmt.Sprintf("%s: revision %d of %d, applied %d of %d", m.Name, ms.Header.Revision, target, ms.RaftAppliedIndex, ms.RaftIndex))
			}
		}
		return len(lag) == 0, strings.Join(lag, "; ")
	})
	return c.Leader()
}

// Followers are the running members other than the leader.
func (c *Cluster) Followers() []*Member {
	c.t.Helper()
	l := c.Leader()
	var fs []*Member
	for _, m := range c.Members {
		if m != l && m.Running() {
			fs = append(fs, m)
		}
	}
	return fs
}

// MoveLeader transfers the leadership to member to (etcdctl move-leader)
// and waits until every running member sees it as the leader.
func (c *Cluster) MoveLeader(to *Member) {
	c.t.Helper()
	from := c.Leader()
	if from == to {
		return
	}
	st, err := to.status()
	if err != nil {
		c.t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{from.URL}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.MoveLeader(ctx, st.Header.MemberId); err != nil {
		c.t.Fatalf("move the etcd leadership from %s to %s: %v", from.Name, to.Name, err)
	}
	testutil.Eventually(c.t, 30*time.Second, "the leadership on "+to.Name, func() (bool, string) {
		l, seen := c.leaderNow()
		return l == to, seen
	})
}

// spawn starts the member's process (initial is the --initial-cluster
// value; a restarted member finds its cluster in its data directory).
func (m *Member) spawn(initial string) error {
	cmd := exec.Command(m.c.bin, append([]string{
		"--name", m.Name, "--data-dir", filepath.Join(m.dir, "data"),
		"--listen-client-urls", m.URL, "--advertise-client-urls", m.URL,
		"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
		"--initial-cluster", initial, "--initial-cluster-state", "new",
		"--logger", "zap", "--log-level", "error",
	}, m.c.args...)...)
	logf, err := os.OpenFile(m.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("etcd member %s's log: %w", m.Name, err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start etcd member %s: %w", m.Name, err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(waited) }()
	m.mu.Lock()
	m.cmd, m.waited, m.logf = cmd, waited, logf
	m.mu.Unlock()
	return nil
}

// waitReady waits (up to 30 s) until the member answers Status.
func (m *Member) waitReady() {
	m.c.t.Helper()
	if err := m.ready(30 * time.Second); err != nil {
		m.c.t.Fatal(err)
	}
}

// ready waits until the member answers Status; it fails when the process
// exits first or within passes, naming the member's last log lines.
func (m *Member) ready(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		_, err := m.status()
		if err == nil {
			return nil
		}
		if m.exited() {
			return fmt.Errorf("etcd member %s exited before it answered at %s; its log ends: %s", m.Name, m.URL, m.logTail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd member %s did not answer at %s within %s (%v); its log ends: %s", m.Name, m.URL, within, err, m.logTail())
		}
		time.Sleep(testutil.Poll)
	}
}

// exited reports whether the member's last process has exited.
func (m *Member) exited() bool {
	m.mu.Lock()
	waited := m.waited
	m.mu.Unlock()
	if waited == nil {
		return false
	}
	select {
	case <-waited:
		return true
	default:
		return false
	}
}

// logTail is the last 1 KiB of the member's log.
func (m *Member) logTail() string {
	b, err := os.ReadFile(m.LogPath())
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	if len(b) > 1024 {
		b = b[len(b)-1024:]
	}
	return strings.TrimSpace(string(b))
}

// ID is the member's id in hex, as etcdctl move-leader takes it.
func (m *Member) ID() string {
	m.c.t.Helper()
	st, err := m.status()
	if err != nil {
		m.c.t.Fatal(err)
	}
	return fmt.Sprintf("%x", st.Header.MemberId)
}

// LogPath is the member's log file.
func (m *Member) LogPath() string { return filepath.Join(m.dir, "etcd.log") }

// Running reports whether the member's process is running.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd != nil
}

// Pid is the member's process id, 0 when it is not running.
func (m *Member) Pid() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

// Kill SIGKILLs the member and waits for it to exit (no-op when it is
// not running).
func (m *Member) Kill() { m.signal(syscall.SIGKILL) }

// Stop SIGTERMs the member, SIGKILLs it after 10 s, and waits for it to
// exit (no-op when it is not running).
func (m *Member) Stop() { m.signal(syscall.SIGTERM) }

func (m *Member) signal(sig syscall.Signal) {
	m.mu.Lock()
	cmd, waited := m.cmd, m.waited
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a paused member could not act on sig
	_ = cmd.Process.Signal(sig)
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-waited
	}
}

// Pause SIGSTOPs the member: its connections stay open and nothing
// answers on them, as with a frozen host or a silent partition. Resume
// undoes it; the test's end does too.
func (m *Member) Pause() {
	m.c.t.Helper()
	if pid := m.Pid(); pid != 0 {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			m.c.t.Fatalf("pause etcd member %s: %v", m.Name, err)
		}
	}
}

// Resume SIGCONTs a paused member.
func (m *Member) Resume() {
	if pid := m.Pid(); pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}

// Restart starts a stopped or killed member again on the same ports and
// data directory and waits until it answers (it rejoins its cluster; its
// answer waits for a quorum).
func (m *Member) Restart() {
	m.c.t.Helper()
	if m.Running() {
		m.c.t.Fatalf("restart etcd member %s: it is running", m.Name)
	}
	var initial []string
	for _, o := range m.c.Members {
		initial = append(initial, o.Name+"="+o.peer)
	}
	if err := m.spawn(strings.Join(initial, ",")); err != nil {
		m.c.t.Fatal(err)
	}
	m.waitReady()
}

package launcher

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

func TestMain(m *testing.M) {
	// The will names a file: the watchdog writes into it the number of
	// processes its agent's groups still had when the hook ran.
	OnAgentDeath(func(will []byte) {
		path, pgids, _ := strings.Cut(string(will), "\n")
		left := 0
		for _, f := range strings.Fields(pgids) {
			pg, _ := strconv.Atoi(f)
			left += len(groupMembers(pg))
		}
		os.WriteFile(path, []byte(strconv.Itoa(left)), 0o644)
	})
	WatchdogMain()
	if os.Getenv("LAUNCHER_TEST_FAKE_AGENT") != "" {
		os.Exit(fakeAgent())
	}
	os.Exit(m.Run())
}

// fakeAgent is an agent in a process of its own, for the tests that stop
// or kill the agent: it starts a watchdog and a group ("sh -c 'sleep &
// wait'": a leader and a member), guards it, prints "<group pid>
// <watchdog pid>" and renews the deadline (now + LAUNCHER_TEST_DEADLINE)
// every 50ms until killed.
func fakeAgent() int {
	ahead, err := time.ParseDuration(os.Getenv("LAUNCHER_TEST_DEADLINE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	wd, err := StartWatchdog()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cmd := exec.Command("/bin/sh", "-c", "sleep 600 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	wd.Renew(time.Now().Add(ahead))
	if err := wd.Guard(cmd.Process.Pid); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if will := os.Getenv("LAUNCHER_TEST_WILL"); will != "" {
		if err := wd.SetWill([]byte(will + "\n" + strconv.Itoa(cmd.Process.Pid))); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	fmt.Printf("%d %d\n", cmd.Process.Pid, wd.PID())
	for {
		time.Sleep(50 * time.Millisecond)
		wd.Renew(time.Now().Add(ahead))
	}
}

// alive reports whether pid is a live (non-zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

// groupMembers lists the live processes of process group pgid.
func groupMembers(pgid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid && alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// startGroup starts "sh -c 'sleep 600 & wait'" in a process group of its
// own and waits until both processes are in it.
func startGroup(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "sleep 600 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-exited })
	testutil.Eventually(t, 5*time.Second, "the group's two processes", testutil.True(func() bool { return len(groupMembers(cmd.Process.Pid)) == 2 }))
	return cmd
}

func startWatchdog(t *testing.T) *Watchdog {
	t.Helper()
	wd, err := StartWatchdog()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wd.Close() })
	return wd
}

func TestWatchdogKillsGuardedGroupsWhenTheDeadlinePasses(t *testing.T) {
	wd := startWatchdog(t)
	g1, g2 := startGroup(t), startGroup(t)
	deadline := time.Now().Add(300 * time.Millisecond)
	wd.Renew(deadline)
	for _, c := range []*exec.Cmd{g1, g2} {
		if err := wd.Guard(c.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	if wd.Expired() {
		t.Fatal("Expired before the deadline")
	}
	for _, c := range []*exec.Cmd{g1, g2} {
		testutil.Eventually(t, 5*time.Second, "the guarded group killed", testutil.True(func() bool { return len(groupMembers(c.Process.Pid)) == 0 }))
	}
	if early := time.Until(deadline); early > 0 {
		t.Errorf("groups killed %s before the deadline", early)
	}
	if !wd.Expired() {
		t.Error("Expired is false after the watchdog fired")
	}
	if !wd.Alive() {
		t.Error("the watchdog exited after firing; it must keep serving the agent")
	}
}

func TestWatchdogKeepsGroupsWhileRenewed(t *testing.T) {
	wd := startWatchdog(t)
	g := startGroup(t)
	wd.Renew(time.Now().Add(200 * time.Millisecond))
	if err := wd.Guard(g.Process.Pid); err != nil {
		t.Fatal(err)
	}
	released := startGroup(t)
	if err := wd.Guard(released.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := wd.Release(released.Process.Pid); err != nil {
		t.Fatal(err)
	}
	// Renew for 1.5s (more than seven deadlines' worth).
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		wd.Renew(time.Now().Add(200 * time.Millisecond))
		time.Sleep(40 * time.Millisecond)
		if n := len(groupMembers(g.Process.Pid)); n != 2 {
			t.Fatalf("renewed group has %d live processes, want 2", n)
		}
	}
	if wd.Expired() {
		t.Error("Expired while renewed")
	}
	// Unrenewed, it is killed; the released group is not.
	testutil.Eventually(t, 5*time.Second, "the group killed once renewals stop", testutil.True(func() bool { return len(groupMembers(g.Process.Pid)) == 0 }))
	if n := len(groupMembers(released.Process.Pid)); n != 2 {
		t.Errorf("released group has %d live processes, want 2 (the watchdog must not kill it)", n)
	}
}

func TestWatchdogKillsAGroupGuardedAfterTheDeadline(t *testing.T) {
	wd := startWatchdog(t)
	wd.Renew(time.Now().Add(-time.Second))
	g := startGroup(t)
	if err := wd.Guard(g.Process.Pid); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "a group guarded after the deadline killed", testutil.True(func() bool { return len(groupMembers(g.Process.Pid)) == 0 }))
}

// startFakeAgent runs fakeAgent in a process of its own and returns it with
// its guarded group's pid and its watchdog's pid.
func startFakeAgent(t *testing.T, deadline time.Duration, env ...string) (agent *exec.Cmd, group, watchdog int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LAUNCHER_TEST_FAKE_AGENT=1", "LAUNCHER_TEST_DEADLINE="+deadline.String())
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("fake agent: %v", err)
	}
	if _, err := fmt.Sscan(line, &group, &watchdog); err != nil {
		t.Fatalf("fake agent said %q: %v", line, err)
	}
	t.Cleanup(func() {
		syscall.Kill(-group, syscall.SIGKILL)
		syscall.Kill(watchdog, syscall.SIGKILL)
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	testutil.Eventually(t, 5*time.Second, "the fake agent's group", testutil.True(func() bool { return len(groupMembers(group)) == 2 }))
	return cmd, group, watchdog
}

func TestWatchdogKillsGroupsOfAStoppedAgent(t *testing.T) {
	agent, group, watchdog := startFakeAgent(t, 500*time.Millisecond)
	// Renewed every 50ms: the group lives while the agent runs.
	time.Sleep(time.Second)
	if n := len(groupMembers(group)); n != 2 {
		t.Fatalf("group of a running agent has %d live processes, want 2", n)
	}
	stopped := time.Now()
	if err := agent.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	took := testutil.Eventually(t, 5*time.Second, "the stopped agent's group killed", testutil.True(func() bool { return len(groupMembers(group)) == 0 }))
	t.Logf("group killed %s after the agent was stopped (deadline 500ms ahead)", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("group killed %s after the stop, want about 500ms", took)
	}
	if !alive(watchdog) {
		t.Error("the watchdog exited while the agent is only stopped")
	}
	_ = stopped
}

func TestWatchdogKillsGroupsWhenTheAgentDies(t *testing.T) {
	// The deadline is an hour ahead: only the agent's death can fire it.
	agent, group, watchdog := startFakeAgent(t, time.Hour)
	if err := agent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	took := testutil.Eventually(t, 5*time.Second, "the dead agent's group killed", testutil.True(func() bool { return len(groupMembers(group)) == 0 }))
	t.Logf("group killed %s after the agent was SIGKILLed", took.Round(time.Millisecond))
	testutil.Eventually(t, 5*time.Second, "the watchdog exits with its agent", testutil.True(func() bool { return !alive(watchdog) }))
}

func TestStartGuardedByWatchdog(t *testing.T) {
	wd := startWatchdog(t)
	wd.Renew(time.Now().Add(time.Hour))
	spec := Spec{Entrypoint: "/bin/sh", Args: []string{"-c", "sleep 600 & wait"}, NoPython: true, NProcPerNode: 2, Stdout: os.Stderr, Stderr: os.Stderr}
	g, err := Start(spec, Assignment{WorldSize: 2, GroupWorldSize: 1}, GuardedBy(wd))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop(syscall.SIGKILL, 0)
	for _, w := range g.workers {
		testutil.Eventually(t, 5*time.Second, "worker group", testutil.True(func() bool { return len(groupMembers(w.pid)) == 2 }))
	}
	if wd.Expired() {
		t.Fatal("Expired an hour before the deadline")
	}
	wd.Renew(time.Now())
	select {
	case <-g.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("guarded workers still run after the deadline passed")
	}
	if !wd.Expired() {
		t.Error("Expired is false after the watchdog killed the workers")
	}
	res := g.Result()
	if len(res.Failures) != 2 || res.Failures[0].Signal != syscall.SIGKILL {
		t.Errorf("failures %+v, want both workers SIGKILLed", res.Failures)
	}
}

// The agent's will (issue 14: the elastic agent's is "revoke my lease") is
// carried out when the agent dies, and only once every process of its
// guarded groups is gone; never when the agent closes the watchdog itself.
func TestWatchdogCarriesOutTheWillOfADeadAgentOnly(t *testing.T) {
	path := t.TempDir() + "/will"
	agent, _, watchdog := startFakeAgent(t, time.Hour, "LAUNCHER_TEST_WILL="+path)
	if err := agent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the will carried out", testutil.True(func() bool { _, err := os.Stat(path); return err == nil }))
	testutil.Eventually(t, 5*time.Second, "the watchdog exits", testutil.True(func() bool { return !alive(watchdog) }))
	if b, _ := os.ReadFile(path); string(b) != "0" {
		t.Errorf("the will ran while %s process(es) of the agent's group were left", b)
	}

	// A clean Close withdraws the will.
	wd := startWatchdog(t)
	clean := t.TempDir() + "/will"
	if err := wd.SetWill([]byte(clean + "\n")); err != nil {
		t.Fatal(err)
	}
	wd.Close()
	if _, err := os.Stat(clean); err == nil {
		t.Error("the will ran although the agent closed its watchdog")
	}
}

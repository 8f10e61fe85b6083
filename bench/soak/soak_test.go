package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// A seed names one schedule; another seed another one; every kind comes up
// once per deck.
func TestPlanIsAFunctionOfTheSeed(t *testing.T) {
	a := plan(7, 20*time.Minute, 15*time.Second, 40*time.Second, 30*time.Second)
	b := plan(7, 20*time.Minute, 15*time.Second, 40*time.Second, 30*time.Second)
	c := plan(8, 20*time.Minute, 15*time.Second, 40*time.Second, 30*time.Second)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two schedules")
	}
	if reflect.DeepEqual(a, c) {
		t.Fatal("seeds 7 and 8 gave one schedule")
	}
	seen := map[string]bool{}
	for _, f := range a[:len(faultKinds)] {
		seen[f.kind] = true
		if f.gap < 15*time.Second || f.gap > 40*time.Second {
			t.Errorf("%v: gap out of range", f)
		}
		if f.kind == faultEtcdKill && (f.down < time.Second || f.down > 30*time.Second) {
			t.Errorf("%v: etcd outage out of 1-30 s", f)
		}
	}
	if len(seen) != len(faultKinds) {
		t.Errorf("the first deck holds %d kinds, want %d", len(seen), len(faultKinds))
	}
}

// Two live workers of one job with one RANK are a duplicate; a worker's
// own child (it inherits RANK) and workers of another job are not.
func TestDuplicates(t *testing.T) {
	ps := []proc{
		{pid: 10, ppid: 1, worker: true, job: "a", rank: "0"},
		{pid: 11, ppid: 10, worker: true, job: "a", rank: "0"}, // child of 10
		{pid: 12, ppid: 2, worker: true, job: "a", rank: "1"},
		{pid: 13, ppid: 3, worker: true, job: "b", rank: "0"},
	}
	if d := duplicates(ps); len(d) != 0 {
		t.Fatalf("false duplicates: %v", d)
	}
	ps = append(ps, proc{pid: 14, ppid: 4, worker: true, job: "a", rank: "1"})
	d := duplicates(ps)
	if len(d) != 1 || len(d[dupKey{"a", "1"}]) != 2 {
		t.Fatalf("duplicates: %v", d)
	}
}

// An orphan counts once it has lived grace reparented; the soak's own
// children do not count.
func TestOrphanWatch(t *testing.T) {
	o := newOrphanWatch(time.Second)
	self := 100
	isChild := func(pid int) bool { return pid == 5 }
	ps := []proc{{pid: 5, ppid: self}, {pid: 6, ppid: self}, {pid: 7, ppid: 1}, {pid: 8, ppid: 50}}
	t0 := time.Now()
	if got := o.observe(ps, t0, self, isChild); len(got) != 0 {
		t.Fatalf("orphans at once: %v", got)
	}
	got := o.observe(ps, t0.Add(1500*time.Millisecond), self, isChild)
	if len(got) != 2 || got[0].pid != 6 || got[1].pid != 7 {
		t.Fatalf("orphans: %v", got)
	}
	if got := o.observe(ps, t0.Add(3*time.Second), self, isChild); len(got) != 0 {
		t.Fatalf("counted twice: %v", got)
	}
}

// Rank 0 starting over before the latest committed step is a loss; resuming
// from it is not.
func TestRestartJudgedAgainstTheCommittedStep(t *testing.T) {
	tb := newJobTable()
	tb.add(&jobState{name: "j", steps: 100})
	for i := 1; i <= 25; i++ {
		if ev := tb.line("node-0/j [default0]:step=" + itoa(i) + " world_size=3 loss=0.1"); ev != nil {
			t.Fatalf("step %d: %+v", i, ev)
		}
	}
	if lost, _ := tb.record("j", 20); lost != 0 {
		t.Fatal("a first record lost steps")
	}
	ev := tb.line("node-1/j step=21 world_size=2 loss=0.1") // unprefixed, as torchrun prints it
	if ev == nil || !ev.restart || ev.lost != 0 {
		t.Fatalf("resume after the commit: %+v", ev)
	}
	ev = tb.line("node-1/j [default0]:step=11 world_size=2 loss=0.1")
	if ev == nil || ev.lost != 10 {
		t.Fatalf("resume before the commit: %+v", ev)
	}
	if lost, prev := tb.record("j", 10); lost != 10 || prev != 20 {
		t.Fatalf("record backwards: lost %d prev %d", lost, prev)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// A worker of round 1 alive beside round 2's workers is stale, whatever
// its RANK.
func TestStaleRounds(t *testing.T) {
	ps := []proc{
		{pid: 1, worker: true, job: "a", rank: "2", round: "1"},
		{pid: 2, worker: true, job: "a", rank: "0", round: "2"},
		{pid: 3, worker: true, job: "a", rank: "1", round: "2"},
		{pid: 4, worker: true, job: "b", rank: "0", round: "1"},
	}
	st := staleRounds(ps)
	if len(st) != 1 || len(st["a"]) != 1 || st["a"][0].pid != 1 {
		t.Fatalf("stale: %v", st)
	}
}

// uidProblems, rule by rule (its doc): a job as root, a job on two uids,
// two jobs on one uid; jobs on their own uids, a worker's child and the
// agents' own processes are fine.
func TestUIDProblems(t *testing.T) {
	w := func(pid int, job string, uid uint32) proc {
		return proc{pid: pid, worker: true, job: job, rank: "0", uid: uid, uidKnown: true}
	}
	h := func(pid int, job string, uid uint32) proc {
		return proc{pid: pid, hyperpodrun: true, job: job, uid: uid, uidKnown: true}
	}
	agent := proc{pid: 1, uid: 0, uidKnown: true, cmd: "hyperpod-agent run"}
	for _, c := range []struct {
		rule string
		ps   []proc
		keys []string
	}{
		{rule: "own-uids", ps: []proc{agent, h(2, "a", 200000), w(3, "a", 200000), w(4, "a", 200000), h(5, "b", 200001), w(6, "b", 200001)}},
		{rule: "uid-unknown", ps: []proc{{pid: 2, worker: true, job: "a"}, {pid: 3, worker: true, job: "b"}}},
		{rule: "root", ps: []proc{agent, h(2, "a", 0), w(3, "a", 0)}, keys: []string{"root/a"}},
		{rule: "two-uids", ps: []proc{h(2, "a", 200000), w(3, "a", 200002)}, keys: []string{"two-uids/a"}},
		{rule: "shared", ps: []proc{w(2, "a", 200000), w(3, "b", 200000)}, keys: []string{"shared/200000/a,b"}},
	} {
		t.Run(c.rule, func(t *testing.T) {
			var keys []string
			for _, p := range uidProblems(c.ps) {
				keys = append(keys, p.key)
				if p.detail == "" {
					t.Errorf("%s: no detail", p.key)
				}
			}
			if !reflect.DeepEqual(keys, c.keys) {
				t.Errorf("problems %v, want %v", keys, c.keys)
			}
		})
	}
}

// With per-job uids the jobs traverse the work directory, read bin, write
// their own checkpoint directories under a sticky ckpt, and reach nothing
// else; without, the old modes.
func TestMakeDirs(t *testing.T) {
	for _, perJob := range []bool{true, false} {
		s := &soak{work: t.TempDir(), perJobUIDs: perJob}
		if err := s.makeDirs(); err != nil {
			t.Fatal(err)
		}
		want := map[string]os.FileMode{".": 0o711 | os.ModeDir, "bin": 0o755 | os.ModeDir, "ckpt": 0o777 | os.ModeSticky | os.ModeDir,
			"logs": 0o700 | os.ModeDir, "etcd": 0o700 | os.ModeDir, "specs": 0o700 | os.ModeDir, "joblogs": 0o755 | os.ModeDir}
		if !perJob {
			want = map[string]os.FileMode{"bin": 0o755 | os.ModeDir, "ckpt": 0o755 | os.ModeDir, "logs": 0o755 | os.ModeDir}
		}
		for d, m := range want {
			st, err := os.Stat(filepath.Join(s.work, d))
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode() != m {
				t.Errorf("per-job uids %v: %s is %v, want %v", perJob, d, st.Mode(), m)
			}
		}
	}
}

// A job lost with etcd's data (etcd_wipe) is ended without a verdict: its
// rank 0 starting over is not a lost committed step, elasticctl's view of
// it is not read, and it is not running any more.
func TestWipedJobIsNotJudged(t *testing.T) {
	jt := newJobTable()
	jt.add(&jobState{name: "soak-worker-1", kind: kindWorker})
	jt.line("node-0/soak-worker-1 step=30 world_size=1 x")
	if _, lost := jt.record("soak-worker-1", 20); lost != 0 {
		t.Fatal("a first record lost steps")
	}
	jt.wipe([]string{"soak-worker-1"})
	if ev := jt.line("node-0/soak-worker-1 step=1 world_size=1 x"); ev != nil {
		t.Errorf("a wiped job's restart from step 1 judged: %+v", ev)
	}
	if _, ended := jt.status("soak-worker-1", "Failed", "x"); ended {
		t.Error("a wiped job's status judged")
	}
	if jt.running("soak-worker-1") || len(jt.runningNames()) != 0 {
		t.Error("a wiped job still counts as running")
	}
	// Without the wipe, the same restart is a loss of 19 committed steps.
	jt.add(&jobState{name: "soak-worker-2", kind: kindWorker})
	jt.line("node-0/soak-worker-2 step=30 world_size=1 x")
	jt.record("soak-worker-2", 20)
	if ev := jt.line("node-0/soak-worker-2 step=1 world_size=1 x"); ev == nil || ev.lost != 20 {
		t.Errorf("an unwiped job's restart from step 1: %+v, want 20 committed steps lost", ev)
	}
}

func TestReplaceEnded(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		rule     string
		phaseEnd int64
		want     bool
	}{
		{"a job that ends during the warm-up is replaced", 0, true},
		{"a job that ends with more than a quarter of the faults left is replaced", now.Add(10 * time.Minute).UnixNano(), true},
		{"a job that ends in the faults' last quarter is not", now.Add(4 * time.Minute).UnixNano(), false},
		{"nor one that ends after the faults", now.Add(-time.Minute).UnixNano(), false},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			if got := replaceEnded(tc.phaseEnd, now, 20*time.Minute); got != tc.want {
				t.Errorf("replaceEnded = %v, want %v", got, tc.want)
			}
		})
	}
}

package jobrunner

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Per-job identities. With --job-uid-range the coordinator gives each job
// a uid unique in the fleet (fleet.Assignment.UID) and the agent runs the
// job as uid = gid = that uid, with no supplementary groups: one job's
// processes cannot read another's files (password file, TMPDIR, logs) or
// /proc/<pid>/environ, and the kernel refuses their signals and ptrace
// across jobs. Without a range, --job-user runs every job as one user (as
// before); with neither, jobs run as the agent, which an agent running as
// root refuses unless --allow-root-jobs.

// Identity is who one job's processes run as on this node.
type Identity struct {
	UID, GID uint32
	// Home is the job's HOME ("" : its run directory for a per-job uid,
	// unset otherwise).
	Home string
	// Set is false when the job runs as the agent itself.
	Set bool
}

// UIDRange is the agent's --job-uid-range: the uids jobs may run as.
type UIDRange struct{ First, Last uint32 }

// Set reports whether a range was configured.
func (r UIDRange) Set() bool { return r.Last != 0 }

// Contains reports whether uid is in the range.
func (r UIDRange) Contains(uid uint32) bool { return r.Set() && uid >= r.First && uid <= r.Last }

func (r UIDRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// ParseUIDRange reads --job-uid-range FIRST-LAST ("" : none). Neither end
// may be 0 (root).
func ParseUIDRange(s string) (UIDRange, error) {
	if s == "" {
		return UIDRange{}, nil
	}
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 32)
	last, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 32)
	switch {
	case !ok || err1 != nil || err2 != nil:
		return UIDRange{}, fmt.Errorf("--job-uid-range %q: want FIRST-LAST, e.g. 200000-299999", s)
	case first == 0:
		return UIDRange{}, fmt.Errorf("--job-uid-range %q includes uid 0 (root): start it at an unused uid, e.g. 200000-299999", s)
	case last < first:
		return UIDRange{}, fmt.Errorf("--job-uid-range %q: the last uid is below the first", s)
	case last == 1<<32-1:
		return UIDRange{}, fmt.Errorf("--job-uid-range %q: uid 4294967295 is (uid_t)-1, not a user", s)
	}
	return UIDRange{First: uint32(first), Last: uint32(last)}, nil
}

// IdentityPolicy is the agent's configuration that decides who a job runs
// as (see identityFor).
type IdentityPolicy struct {
	AgentUID  int
	Range     UIDRange
	User      JobUser
	AllowRoot bool
}

// identityFor decides who a job runs as, given the uid the coordinator
// gave it (0: none) and whether it runs in a container; refusal says why it
// may not run on this node and how to fix it ("" when it may). Rules:
//
//   - range: with --job-uid-range the job runs as its own uid (uid = gid,
//     no supplementary groups), which must be in the range;
//   - range-no-uid: ... and a job without one is refused;
//   - job-user: else --job-user runs every job as that user;
//   - container: else a container runs as its image's user;
//   - root-refused: else an agent running as root refuses, unless
//     --allow-root-jobs;
//   - as-agent: else the job runs as the agent.
func identityFor(p IdentityPolicy, job string, uid uint32, container bool) (Identity, string) {
	switch {
	case p.Range.Set() && uid == 0:
		return Identity{}, fmt.Sprintf("job %s has no uid of its own, and this node (hyperpod-agent --job-uid-range %s) runs each job as its own uid: start the coordinator with --job-uid-range (the same range), or drop --job-uid-range on this node", job, p.Range)
	case p.Range.Set() && !p.Range.Contains(uid):
		return Identity{}, fmt.Sprintf("job %s's uid %d is outside this node's --job-uid-range %s: give the coordinator and every node agent the same range", job, uid, p.Range)
	case p.Range.Set():
		return Identity{UID: uid, GID: uid, Set: true}, ""
	case p.User.Set:
		return Identity{UID: p.User.UID, GID: p.User.GID, Home: p.User.Home, Set: true}, ""
	case container:
		return Identity{}, ""
	}
	if why := refuseRoot(p.AgentUID, p.User, p.AllowRoot); why != "" {
		return Identity{}, why
	}
	return Identity{}, ""
}

// uidClaims guards against two jobs holding one uid on one host (several
// agents may share a host and its run-dir base): <base>/uids/<uid> is
// created with O_EXCL and holds "<job>\n<node>\n". A claim by the same job
// (from any agent) is kept; a claim of another job is stale, and retaken,
// only when the agent of the same node wrote it and that job no longer
// runs there (an agent restarted; its containers, adopted, claim again).
// Any other claim is a conflict: the job waits, with a problem record.
// The agent that wrote a claim removes it when the job leaves its node.
type uidClaims struct {
	dir  string // <base>/uids
	node string
}

// claimContent is what a claim file holds.
func claimContent(job, node string) []byte { return []byte(job + "\n" + node + "\n") }

// claimVerdict decides what an existing claim (holding job heldBy, written
// by node by) means for job on node, given whether heldBy runs on this
// agent. Rules: same-job: keep; stale-own: retake; other: refuse.
func claimVerdict(job, node, heldBy, by string, heldRunsHere bool) (retake bool, refusal string) {
	switch {
	case heldBy == job:
		return false, ""
	case by == node && !heldRunsHere:
		return true, ""
	}
	return false, fmt.Sprintf("its uid is held on this host by job %s (node %s's agent)", heldBy, by)
}

// claim takes uid for job. runsHere reports whether a job runs on this
// agent.
func (c uidClaims) claim(uid uint32, job string, runsHere func(string) bool) error {
	if err := os.Mkdir(c.dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("make %s: %w", c.dir, err)
	}
	d, err := openTrusted(c.dir, os.Geteuid(), true)
	if err != nil {
		return err
	}
	defer d.Close()
	name := strconv.FormatUint(uint64(uid), 10)
	for range 3 {
		fd, err := unix.Openat(int(d.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == nil {
			_, werr := unix.Write(fd, claimContent(job, c.node))
			unix.Close(fd)
			return werr
		}
		if !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("claim uid %d: %w", uid, err)
		}
		heldBy, by, err := readClaim(d, name)
		if err != nil {
			return err
		}
		retake, refusal := claimVerdict(job, c.node, heldBy, by, heldBy != "" && runsHere(heldBy))
		if refusal != "" {
			return errors.New(refusal)
		}
		if !retake {
			return nil
		}
		if err := unix.Unlinkat(int(d.Fd()), name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("retake the stale claim of uid %d: %w", uid, err)
		}
	}
	return fmt.Errorf("claim uid %d: another agent keeps taking it", uid)
}

// readClaim reads the job and node of a claim file.
func readClaim(d *os.File, name string) (job, node string, err error) {
	fd, err := unix.Openat(int(d.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", "", fmt.Errorf("read the claim of uid %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.Name(), name))
	defer f.Close()
	b := make([]byte, 4096)
	n, _ := f.Read(b)
	parts := bytes.SplitN(b[:n], []byte("\n"), 3)
	if len(parts) < 2 {
		return string(bytes.TrimSpace(b[:n])), "", nil
	}
	return string(parts[0]), string(parts[1]), nil
}

// release drops this node's claim of uid for job (another job's or
// another node's claim is left alone).
func (c uidClaims) release(uid uint32, job string) error {
	d, err := os.Open(c.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer d.Close()
	name := strconv.FormatUint(uint64(uid), 10)
	heldBy, by, err := readClaim(d, name)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if heldBy != job || by != c.node {
		return nil
	}
	if err := unix.Unlinkat(int(d.Fd()), name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("release uid %d: %w", uid, err)
	}
	return nil
}

// claimUID claims uid on this host for job (see uidClaims).
func (r *Runner) claimUID(job string, uid uint32) error {
	r.mu.Lock()
	if held, ok := r.claims[job]; ok && held == uid {
		r.mu.Unlock()
		return nil
	}
	r.mu.Unlock()
	c := uidClaims{dir: filepath.Join(r.tmp, "uids"), node: r.node.Name}
	runsHere := func(other string) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		_, running := r.jobs[other]
		_, claimed := r.claims[other]
		return running || claimed
	}
	if err := c.claim(uid, job, runsHere); err != nil {
		return err
	}
	r.mu.Lock()
	r.claims[job] = uid
	r.mu.Unlock()
	return nil
}

// leave is a job's leaving this node (no longer placed, no run here): its
// problem record goes, its uid claim is released, and its log directory is
// taken back (root's, 0700), so a later job given the same uid cannot read
// it.
func (r *Runner) leave(job string) {
	r.mu.Lock()
	uid, claimed := r.claims[job]
	delete(r.claims, job)
	r.mu.Unlock()
	r.clearProblemOf(job)
	if !claimed {
		return
	}
	if err := ReleaseJobLogDir(r.logBase(), r.node.Name, job); err != nil {
		r.log.Warn("cannot take the job's log directory back", "job", job, "err", err)
	}
	c := uidClaims{dir: filepath.Join(r.tmp, "uids"), node: r.node.Name}
	if err := c.release(uid, job); err != nil {
		r.log.Warn("cannot release the job's uid", "job", job, "uid", uid, "err", err)
		return
	}
	r.log.Info("job left this node: its uid is released", "job", job, "uid", uid)
}

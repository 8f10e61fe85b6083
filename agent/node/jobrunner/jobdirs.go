package jobrunner

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// A job's directories are made by the agent, for that job, without ever
// following a symlink and without ever changing the owner of anything but
// the one directory it just opened (through its descriptor, never by
// path): a job may fill its own directories with anything, symlinks to
// root's files included, and the agent's next start or release of the job
// touches none of it.
//
//	<job-log-dir>/               root (or the agent) 0711
//	<job-log-dir>/<node>/        root (or the agent) 0711
//	<job-log-dir>/<node>/<job>/  the job's uid:gid 0700  (hyperpodrun --log-dir)
//	<job-run-dir>/               root (or the agent) 0711
//	<job-run-dir>/<unique>/      the job's uid:gid 0700  (one per run: TMPDIR, HOME, etcd.password)
//	<job-run-dir>/uids/<uid>     root 0600               (which job holds a uid on this host)

// dirFlags open a directory without following a final symlink.
const dirFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

// trustedOwner says why a directory owned by uid may not hold a job's
// directories when the agent runs as euid ("" when it may): root's or the
// agent's own only.
func trustedOwner(uid uint32, euid int) string {
	if uid == 0 || int(uid) == euid {
		return ""
	}
	return fmt.Sprintf("is owned by uid %d, not by root or the agent (uid %d)", uid, euid)
}

// openTrusted opens an existing directory path (the final component not a
// symlink) and checks that it is owned by root or the agent and, when
// strictMode, not writable by group or others.
func openTrusted(path string, euid int, strictMode bool) (*os.File, error) {
	fd, err := unix.Open(path, dirFlags, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("%s is not a real directory (a symlink or a file): remove it and let the agent create it", path)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if why := trustedOwner(st.Uid, euid); why != "" {
		f.Close()
		return nil, fmt.Errorf("%s %s: jobs could replace what the agent makes there; chown root:root %s && chmod 0711 %s, or pick another directory", path, why, path, path)
	}
	if strictMode && st.Mode&0o022 != 0 {
		f.Close()
		return nil, fmt.Errorf("%s is writable by group or others (mode %04o): anyone could replace what the agent makes there; chmod 0711 %s, or pick another directory", path, st.Mode&0o7777, path)
	}
	return f, nil
}

// EnsureBaseDir makes path (its missing parents 0755) a directory for the
// agent's job directories: created root-owned (the agent's own when it
// does not run as root) with mode 0711, so a job reaches its own directory
// below it but cannot list or add to it. An existing one is accepted only
// if it is a real directory owned by root or the agent and not writable by
// group or others; its mode then becomes 0711. The error says what is
// wrong and how to fix it.
func EnsureBaseDir(path string) (*os.File, error) {
	if path == "" {
		return nil, errors.New("no directory given")
	}
	path = filepath.Clean(path)
	euid := os.Geteuid()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("make %s: %w", filepath.Dir(path), err)
	}
	if err := unix.Mkdir(path, 0o711); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, &os.PathError{Op: "mkdir", Path: path, Err: err}
	}
	f, err := openTrusted(path, euid, true)
	if err != nil {
		return nil, err
	}
	if err := tighten(f, euid); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// tighten makes the directory open as f mode 0711 when the agent owns it
// (root's own directory, seen by an agent not running as root, is left as
// it is: openTrusted checked that no one else may write it).
func tighten(f *os.File, euid int) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return &os.PathError{Op: "fstat", Path: f.Name(), Err: err}
	}
	if int(st.Uid) != euid || st.Mode&0o7777 == 0o711 {
		return nil
	}
	if err := unix.Fchmod(int(f.Fd()), 0o711); err != nil {
		return &os.PathError{Op: "chmod", Path: f.Name(), Err: err}
	}
	return nil
}

// validName says why name cannot be one path component ("" when it can).
func validName(what, name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("%s name %q cannot be a directory name", what, name)
	}
	return nil
}

// subdir makes (if missing) and opens the directory name in parent
// without following a symlink; it must be a real directory.
func subdir(parent *os.File, name string, mode uint32) (*os.File, error) {
	p := filepath.Join(parent.Name(), name)
	if err := unix.Mkdirat(int(parent.Fd()), name, mode); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, &os.PathError{Op: "mkdir", Path: p, Err: err}
	}
	fd, err := unix.Openat(int(parent.Fd()), name, dirFlags, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("%s is not a real directory (a symlink or a file): the agent does not follow it; remove it", p)
		}
		return nil, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// own gives the directory (or file) open as f to uid:gid with mode,
// through its descriptor: top level only, nothing below it is touched.
func own(f *os.File, uid, gid uint32, mode uint32) error {
	if err := unix.Fchown(int(f.Fd()), int(uid), int(gid)); err != nil {
		return &os.PathError{Op: "chown", Path: f.Name(), Err: err}
	}
	if err := unix.Fchmod(int(f.Fd()), mode); err != nil {
		return &os.PathError{Op: "chmod", Path: f.Name(), Err: err}
	}
	return nil
}

// owner is the uid:gid a job's directories get for id: the job's, or the
// agent's own when the job runs as the agent.
func owner(id Identity) (uint32, uint32) {
	if id.Set {
		return id.UID, id.GID
	}
	return uint32(os.Geteuid()), uint32(os.Getegid())
}

// nodeLogDir opens <base>/<node>, made root-owned 0711 if missing and
// refused if an existing one is not a real directory owned by root or the
// agent.
func nodeLogDir(base, node string) (*os.File, error) {
	if err := validName("node", node); err != nil {
		return nil, err
	}
	b, err := EnsureBaseDir(base)
	if err != nil {
		return nil, fmt.Errorf("the jobs' log directory: %w", err)
	}
	defer b.Close()
	n, err := subdir(b, node, 0o711)
	if err != nil {
		return nil, fmt.Errorf("the node's log directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(n.Fd()), &st); err != nil {
		n.Close()
		return nil, &os.PathError{Op: "fstat", Path: n.Name(), Err: err}
	}
	if why := trustedOwner(st.Uid, os.Geteuid()); why != "" {
		n.Close()
		return nil, fmt.Errorf("the node's log directory %s %s (an earlier agent gave it to its job user): chown root:root %s && chmod 0711 %s", n.Name(), why, n.Name(), n.Name())
	}
	if err := tighten(n, os.Geteuid()); err != nil {
		n.Close()
		return nil, err
	}
	if err := unix.Fstat(int(n.Fd()), &st); err == nil && st.Mode&0o022 != 0 {
		n.Close()
		return nil, fmt.Errorf("the node's log directory %s is writable by group or others (mode %04o): chmod 0711 %s", n.Name(), st.Mode&0o7777, n.Name())
	}
	return n, nil
}

// JobLogDir makes <base>/<node>/<job>/, the job's log directory on this
// node (hyperpodrun's --log-dir), owned by the job's identity with mode
// 0700, and returns its path. The parents are root-owned 0711 (made if
// missing; an existing one that is a symlink or someone else's is
// refused). An existing job directory (a restart) is reused only if it is
// a real directory; only it is given to the job again, not its contents.
func JobLogDir(base, node, job string, id Identity) (string, error) {
	if err := validName("job", job); err != nil {
		return "", err
	}
	n, err := nodeLogDir(base, node)
	if err != nil {
		return "", err
	}
	defer n.Close()
	j, err := subdir(n, job, 0o700)
	if err != nil {
		return "", fmt.Errorf("the job's log directory: %w", err)
	}
	defer j.Close()
	uid, gid := owner(id)
	if err := own(j, uid, gid, 0o700); err != nil {
		return "", fmt.Errorf("give the job's log directory to uid %d: %w", uid, err)
	}
	return j.Name(), nil
}

// JobConsoleLog makes <base>/<node>/<job>.log, the file a container's
// console goes to (written by containerd's shim as root), root-owned 0600
// in the node's root-owned directory: a job cannot swap it for a symlink.
// An existing one is kept (appended to) if it is a regular file.
func JobConsoleLog(base, node, job string) (string, error) {
	if err := validName("job", job); err != nil {
		return "", err
	}
	n, err := nodeLogDir(base, node)
	if err != nil {
		return "", err
	}
	defer n.Close()
	name := job + ".log"
	fd, err := unix.Openat(int(n.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	p := filepath.Join(n.Name(), name)
	if err != nil {
		return "", &os.PathError{Op: "create", Path: p, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "", fmt.Errorf("%s is not a regular file: remove it", p)
	}
	return p, nil
}

// ReleaseJobLogDir takes <base>/<node>/<job>/ back from the job when it
// leaves the node: root (or the agent) owns it again, mode 0700, so a later
// job given the same uid cannot read it. Top level only, through its
// descriptor; a missing directory is no error.
func ReleaseJobLogDir(base, node, job string) error {
	if validName("job", job) != nil || validName("node", node) != nil {
		return nil
	}
	p := filepath.Join(base, node, job)
	fd, err := unix.Open(p, dirFlags, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	return own(f, uint32(os.Geteuid()), uint32(os.Getegid()), 0o700)
}

// RunDir makes a run's own directory, <base>/<unique>/, owned by the
// job's identity with mode 0700: its TMPDIR (hyperpodrun's control
// sockets), its HOME when its uid is the job's own, its etcd password
// file. base must be a directory EnsureBaseDir accepted: no one else can
// add to it. prefix starts its name (see processRunPrefix), so that an
// agent finds the runs an earlier agent of its node left behind.
func RunDir(base, prefix string, id Identity) (string, error) {
	d, err := os.MkdirTemp(base, prefix)
	if err != nil {
		return "", fmt.Errorf("make the run's directory: %w", err)
	}
	fd, err := unix.Open(d, dirFlags, 0)
	if err != nil {
		os.Remove(d)
		return "", fmt.Errorf("open the run's directory: %w", &os.PathError{Op: "open", Path: d, Err: err})
	}
	f := os.NewFile(uintptr(fd), d)
	defer f.Close()
	uid, gid := owner(id)
	if err := own(f, uid, gid, 0o700); err != nil {
		os.Remove(d)
		return "", fmt.Errorf("give the run's directory to uid %d: %w", uid, err)
	}
	return d, nil
}

// WriteJobFile writes a new file name in dir (a run's directory) with mode
// 0600, owned by the job's identity: created with O_EXCL and O_NOFOLLOW,
// so nothing already there (a symlink included) is followed or reused.
func WriteJobFile(dir, name string, data []byte, id Identity) error {
	if err := validName("file", name); err != nil {
		return err
	}
	dfd, err := unix.Open(dir, dirFlags, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	p := filepath.Join(dir, name)
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	uid, gid := owner(id)
	if err := own(f, uid, gid, 0o600); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return f.Close()
}

// unsearchable names the first directory on path (path included) that
// users other than its owner and group cannot search (no o+x), "" if
// none: a job running as its own uid could not reach its directories
// below it.
func unsearchable(path string) string {
	p := filepath.Clean(path)
	var dirs []string
	for {
		dirs = append(dirs, p)
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		var st unix.Stat_t
		if err := unix.Stat(dirs[i], &st); err == nil && st.Mode&0o001 == 0 {
			return dirs[i]
		}
	}
	return ""
}

// processRunPrefix starts the name of every host-process run's directory
// of node: such a run never outlives the agent that started it (its
// processes die with the agent), so whatever an agent finds under this
// prefix when it starts was left by a killed predecessor.
func processRunPrefix(node string) string { return node + ".p." }

// containerRunPrefix starts the name of every container run's directory
// of node (a container outlives its agent; the next one adopts it).
func containerRunPrefix(node string) string { return node + ".c." }

// removeStaleRuns removes the run directories of node's host processes
// that an earlier agent left in base (killed before it could: SIGKILL,
// a crash). They may hold a job's password file. os.RemoveAll unlinks a
// symbolic link a job left there instead of following it.
func removeStaleRuns(base, node string) (int, error) {
	ents, err := os.ReadDir(base)
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", base, err)
	}
	n := 0
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), processRunPrefix(node)) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(base, e.Name())); err != nil {
			return n, fmt.Errorf("remove a stale run directory: %w", err)
		}
		n++
	}
	return n, nil
}

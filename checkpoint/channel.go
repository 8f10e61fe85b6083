package checkpoint

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Environment variables shared with workers. Our own additions to torchrun's
// worker environment are all prefixed HYPERPODRUN_.
const (
	// EnvControlDir is the control directory the agent owns.
	EnvControlDir = "HYPERPODRUN_CONTROL_DIR"
	// EnvControlSocket is the unix socket workers send reports to.
	EnvControlSocket = "HYPERPODRUN_CONTROL_SOCKET"
	// EnvEventFile is the file holding the announced event, if any.
	EnvEventFile = "HYPERPODRUN_EVENT_FILE"
	// EnvControlToken is the secret a worker's reports carry: a fresh
	// random value for every round's workers, in their environment only.
	EnvControlToken = "HYPERPODRUN_CONTROL_TOKEN"
	// EnvElasticSignal names the elastic signal ("SIGUSR1", "USR1" or a
	// number); workers install their handler for it. Unset means SIGUSR1.
	EnvElasticSignal = "HYPERPODRUN_ELASTIC_SIGNAL"
	// EnvRound is the rendezvous round the worker was started in. Workers
	// ignore an event file left from an earlier round.
	EnvRound = "HYPERPODRUN_ROUND"
	// EnvCheckpoint is the location of the latest committed checkpoint.
	EnvCheckpoint = "HYPERPODRUN_CHECKPOINT"
	// EnvResumeStep is the step of the latest committed checkpoint.
	EnvResumeStep = "HYPERPODRUN_RESUME_STEP"
	// EnvCheckpointWorldSize is the world size that wrote that checkpoint.
	EnvCheckpointWorldSize = "HYPERPODRUN_CHECKPOINT_WORLD_SIZE"
	// EnvCheckpointRound is the rendezvous round that committed it.
	EnvCheckpointRound = "HYPERPODRUN_CHECKPOINT_ROUND"
)

// File names inside the control directory.
const (
	SocketName    = "control.sock"
	EventFileName = "event.json"
)

// maxMessage bounds one worker message (one line).
const maxMessage = 1 << 20

// ErrClosed is returned by a Channel that has been closed.
var ErrClosed = errors.New("checkpoint: control channel closed")

// ErrStaleRound is wrapped by the refusal of a report that does not come
// from a worker of the current round (see Channel.SetRound).
var ErrStaleRound = errors.New("not from a worker of the current round")

// admitWait is how long a report from a process not (yet) admitted waits
// for its admission: a worker may connect before the agent has admitted
// its process group, which it does right after spawning it.
const admitWait = time.Second

// EventKind says why the agent is asking workers to stop.
type EventKind string

// Event kinds. Workers treat every kind the same way (checkpoint and exit 0);
// the kind is for logs and for training code that wants to act differently.
const (
	ScaleUp    EventKind = "scale_up"
	ScaleDown  EventKind = "scale_down"
	Resize     EventKind = "resize"
	Preemption EventKind = "preemption"
	Drain      EventKind = "drain"
	Shutdown   EventKind = "shutdown"
	// MemberLost is announced only to in-process workers (Event.InProcess):
	// a member of the round died or failed; the survivors leave the broken
	// process group and reconfigure.
	MemberLost EventKind = "member_lost"
)

// Event is a planned change announced to the workers.
type Event struct {
	Kind EventKind
	// NewWorldSize is the world size workers will be restarted at (0 when
	// the job is not restarted, e.g. preemption to zero).
	NewWorldSize int
	// Deadline is when the agent escalates (SIGTERM, then SIGKILL). Zero
	// means none announced.
	Deadline time.Time
	// Round is the rendezvous round being ended.
	Round int64
	// TraceParent is the W3C traceparent of the scaling event's trace.
	TraceParent string
	// Reason is a human explanation when one is known, e.g. the
	// coordinator's "preempted: team a reclaimed its nominal quota ...".
	Reason string
	// InProcess says the agent offers in-process reconfiguration for this
	// change (--inprocess-resize): the workers leave their process group
	// and send a ReportReconfigure instead of exiting, and the agent
	// answers with their next assignment (or tells them to leave).
	InProcess bool
	// Seq numbers the announcements of one Channel (1, 2, ...); set by
	// Announce.
	Seq uint64
	// AnnouncedAt is set by Announce.
	AnnouncedAt time.Time
}

// eventFile is the JSON layout of event.json. Times are given both as
// RFC 3339 and as float Unix seconds (easier to use from Python).
type eventFile struct {
	Kind            EventKind `json:"kind"`
	NewWorldSize    int       `json:"new_world_size"`
	Deadline        time.Time `json:"deadline,omitzero"`
	DeadlineUnix    float64   `json:"deadline_unix,omitempty"`
	Round           int64     `json:"round"`
	TraceParent     string    `json:"traceparent,omitempty"`
	Reason          string    `json:"reason,omitempty"`
	InProcess       bool      `json:"inprocess,omitempty"`
	Seq             uint64    `json:"seq"`
	AnnouncedAt     time.Time `json:"announced_at"`
	AnnouncedAtUnix float64   `json:"announced_at_unix"`
}

func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

// Report types sent by workers.
const (
	// ReportCheckpoint means a checkpoint is complete on every rank
	// (committed) at Step, stored at Path.
	ReportCheckpoint = "checkpoint"
	// ReportStopping means a rank saw the event and is exiting after Step.
	ReportStopping = "stopping"
	// ReportCheckpointUpdate is one rank's part of a checkpoint (HyperPod's
	// CheckpointDiscoverySocketClient.update): the step is committed once
	// every expected writer of every kind has reported it.
	ReportCheckpointUpdate = "checkpoint_update"
	// ReportReconfigure means the worker left its process group (in-process
	// resize) and waits on this connection for its next assignment; the
	// agent's answer carries it (Channel.Release). It is not given to the
	// handler.
	ReportReconfigure = "reconfigure"
)

// Report is one message from a worker.
type Report struct {
	Type      string `json:"type"`
	Step      int64  `json:"step"`
	Path      string `json:"path,omitempty"`
	Rank      int    `json:"rank"`
	WorldSize int    `json:"world_size,omitempty"`
	PID       int    `json:"pid,omitempty"`
	// Detected marks the stopping report the Python helper sends as soon
	// as the ranks agree on an event, before the step's checkpoint; its
	// Step is unknown (0). A rank may send a stopping report with the step
	// afterwards.
	Detected bool `json:"detected,omitempty"`
	// CheckpointType, NumModel, NumData and Nodes come with a
	// ReportCheckpointUpdate (HyperPod's CheckpointDiscoverySocketClient):
	// "model" or "data", the writers per node of each kind, and the number
	// of nodes.
	CheckpointType string `json:"checkpoint_type,omitempty"`
	NumModel       int    `json:"num_model_checkpoints,omitempty"`
	NumData        int    `json:"num_data_checkpoints,omitempty"`
	Nodes          int    `json:"nodes,omitempty"`
	// Round is the rendezvous round of the sender. A worker may name it
	// (HYPERPODRUN_ROUND); a Channel with rounds refuses a report naming
	// another round than the current one, and sets it on the reports it
	// accepts.
	Round int64 `json:"round,omitempty"`
	// Token is the sender's HYPERPODRUN_CONTROL_TOKEN; a Channel with
	// rounds refuses a report without the current round's.
	Token string `json:"token,omitempty"`
	// rankSet: the message named a rank.
	rankSet bool
	// Received is when the agent read the message.
	Received time.Time `json:"-"`
	// PeerPID is the process that sent the report, as the kernel says
	// (SO_PEERCRED); 0 when unknown.
	PeerPID int `json:"-"`
	// Raw is the message as sent, for fields this package does not know.
	Raw json.RawMessage `json:"-"`
}

// MaxStep is the largest step a report may name (2^53: exact in every
// JSON reader, and beyond any real training run).
const MaxStep = 1 << 53

// ErrForged is wrapped by the refusal of a report that does not carry the
// current round's control token, or names another rank than its sender's.
var ErrForged = errors.New("not from this job's workers")

// parseReport decodes and validates one message line.
func parseReport(line []byte) (Report, error) {
	var r Report
	if err := json.Unmarshal(line, &r); err != nil {
		return Report{}, fmt.Errorf("malformed message: %w", err)
	}
	if r.Type == "" {
		return Report{}, errors.New(`malformed message: missing "type"`)
	}
	if r.Step < 0 {
		return Report{}, fmt.Errorf("malformed %s message: negative step %d", r.Type, r.Step)
	}
	if r.Step > MaxStep {
		return Report{}, fmt.Errorf("implausible %s message: step %d is beyond %d", r.Type, r.Step, int64(MaxStep))
	}
	var named struct {
		Rank *int `json:"rank"`
	}
	if json.Unmarshal(line, &named) == nil && named.Rank != nil {
		r.rankSet = true
	}
	if r.Rank < 0 || r.WorldSize < 0 || r.Round < 0 {
		return Report{}, fmt.Errorf("malformed %s message: negative rank, world_size or round", r.Type)
	}
	if (r.Type == ReportCheckpoint || r.Type == ReportCheckpointUpdate) && r.Path == "" {
		return Report{}, fmt.Errorf(`malformed %s message: missing "path"`, r.Type)
	}
	if r.Type == ReportCheckpointUpdate {
		if r.CheckpointType != "model" && r.CheckpointType != "data" {
			return Report{}, fmt.Errorf(`malformed checkpoint_update message: checkpoint_type %q (want "model" or "data")`, r.CheckpointType)
		}
		if r.NumModel < 0 || r.NumData < 0 || r.Nodes < 0 {
			return Report{}, errors.New("malformed checkpoint_update message: negative writer or node count")
		}
	}
	r.Raw = append(json.RawMessage(nil), line...)
	return r, nil
}

// Handler handles one worker report. Its error is sent back to the worker.
// Calls are serialised, in arrival order. ctx is cancelled when the Channel
// is closed; a handler must return soon after.
type Handler func(ctx context.Context, r Report) error

// Option configures a Channel.
type Option func(*Channel)

// WithHandler makes the Channel call h for every report and acknowledge the
// worker after h returns. Reports() then delivers nothing.
func WithHandler(h Handler) Option { return func(c *Channel) { c.handler = h } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *Channel) { c.log = l } }

// Channel is the agent's side of the control channel of one worker group.
type Channel struct {
	dir, sock, eventPath string

	ln      *net.UnixListener
	handler Handler
	log     *slog.Logger
	reports chan Report

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup

	handleMu sync.Mutex // serialises handler calls

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	seq    uint64
	// rounds: SetRound was called; round is the current round (0: none)
	// and admitted its workers' process groups; admitted is closed and
	// replaced when either changes.
	rounds  bool
	round   int64
	workers map[int]int // admitted process groups -> their global rank
	token   string      // the current round's control token
	// announced is the step after which the round's workers said they
	// stop (0: none said so yet).
	announced int64
	admitted  chan struct{}
	// parked: workers waiting for their next assignment (a
	// ReportReconfigure), by process group; parkedCh is closed and
	// replaced when the set changes.
	parked   map[int]*parkedWorker
	parkedCh chan struct{}
	// prewarm: process groups started ahead of their round (AdmitPrewarmed),
	// believed only for a ReportReconfigure carrying prewarmToken, until
	// Admit gives them a rank or ForgetPrewarmed forgets them.
	prewarm      map[int]struct{}
	prewarmToken string

	closeOnce sync.Once
	closeErr  error
}

// NewChannel creates dir (mode 0700) and serves the control socket
// dir/control.sock. Without WithHandler, reports are delivered on Reports()
// and acknowledged once queued there.
func NewChannel(dir string, opts ...Option) (*Channel, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: control dir %q: %w", dir, err)
	}
	c := &Channel{
		dir:       abs,
		sock:      filepath.Join(abs, SocketName),
		eventPath: filepath.Join(abs, EventFileName),
		log:       slog.Default(),
		reports:   make(chan Report, 256),
		done:      make(chan struct{}),
		conns:     make(map[net.Conn]struct{}),
		workers:   make(map[int]int),
		token:     newToken(),
		admitted:  make(chan struct{}),
		parked:    make(map[int]*parkedWorker),
		parkedCh:  make(chan struct{}),
		prewarm:   make(map[int]struct{}),
	}
	for _, o := range opts {
		o(c)
	}
	if c.handler == nil {
		c.handler = c.enqueue
	}
	// sun_path is 108 bytes on Linux, including the terminating NUL.
	if len(c.sock) > 107 {
		return nil, fmt.Errorf("checkpoint: control socket path %q is %d bytes, longer than a unix socket allows (107)", c.sock, len(c.sock))
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint: create control dir: %w", err)
	}
	if fi, err := os.Lstat(c.sock); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("checkpoint: %s exists and is not a socket", c.sock)
		}
		// A socket left by an agent that died: nobody can be serving it
		// since we own the directory.
		if err := os.Remove(c.sock); err != nil {
			return nil, fmt.Errorf("checkpoint: remove stale socket: %w", err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: c.sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: listen on control socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(c.sock, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("checkpoint: chmod control socket: %w", err)
	}
	c.ln = ln
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.acceptLoop()
	return c, nil
}

// Dir returns the control directory (absolute).
func (c *Channel) Dir() string { return c.dir }

// SocketPath returns the path of control.sock.
func (c *Channel) SocketPath() string { return c.sock }

// EventPath returns the path of event.json.
func (c *Channel) EventPath() string { return c.eventPath }

// Env returns the variables that tell a worker where the channel is.
func (c *Channel) Env() map[string]string {
	c.mu.Lock()
	token := c.token
	c.mu.Unlock()
	return map[string]string{
		EnvControlToken:  token,
		EnvControlDir:    c.dir,
		EnvControlSocket: c.sock,
		EnvEventFile:     c.eventPath,
	}
}

// SetRound makes round the current round, with no worker admitted yet
// (Admit admits them). From the first call on, the channel believes only
// the workers of the current round: a report is refused, with an error
// wrapping ErrStaleRound, unless the process that sent it (the kernel says
// which: SO_PEERCRED) is in a process group admitted for the current round,
// and unless it names no round or the current one. An accepted report's
// Round is set to the current round. SetRound(0) makes no round current:
// every report is refused (between rounds, or once this node was fenced).
// A channel on which SetRound is never called accepts every report (the
// standalone agent's, which has no rounds).
func (c *Channel) SetRound(round int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rounds = true
	c.round = round
	if round != 0 {
		c.token = newToken()
	}
	c.announced = 0
	clear(c.workers)
	close(c.admitted)
	c.admitted = make(chan struct{})
}

// Admit believes the processes of process group pgid (a worker and the
// children it did not move to another group) as the worker of global rank
// rank of round, if round is the current round; otherwise it does nothing.
func (c *Channel) Admit(round int64, pgid, rank int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.rounds || round == 0 || round != c.round || pgid <= 1 {
		return
	}
	c.workers[pgid] = rank
	delete(c.prewarm, pgid)
	close(c.admitted)
	c.admitted = make(chan struct{})
}

// PrewarmEnv returns the variables that tell a worker started ahead of its
// round where the channel is; its token (a fresh one per call, replacing
// the previous) is good only for asking for a first assignment.
func (c *Channel) PrewarmEnv() map[string]string {
	env := c.Env()
	c.mu.Lock()
	c.prewarmToken = newToken()
	env[EnvControlToken] = c.prewarmToken
	c.mu.Unlock()
	return env
}

// AdmitPrewarmed believes process group pgid as a worker started ahead of
// its round (in-process resize: a joining node starts its workers before
// it registers). It holds no rank: the only report believed from it is a
// ReportReconfigure with PrewarmEnv's token, parked like a kept worker's
// (its rank in Parked is -1) until Release answers it. Admit, for a round,
// makes it an ordinary worker of that round.
func (c *Channel) AdmitPrewarmed(pgid int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pgid <= 1 {
		return
	}
	c.prewarm[pgid] = struct{}{}
	close(c.admitted)
	c.admitted = make(chan struct{})
}

// ForgetPrewarmed stops believing every process group admitted by
// AdmitPrewarmed and not admitted for a round since.
func (c *Channel) ForgetPrewarmed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.prewarm)
	c.prewarmToken = ""
}

// believePrewarmed checks a report from a prewarmed process group: only a
// request for its first assignment, with the prewarm token.
func believePrewarmed(r *Report, token string) error {
	if r.Type != ReportReconfigure {
		return fmt.Errorf("%w: process %d was started ahead of its round and holds no rank yet; only a %s request is accepted from it", ErrStaleRound, r.PeerPID, ReportReconfigure)
	}
	if token == "" || subtle.ConstantTimeCompare([]byte(r.Token), []byte(token)) != 1 {
		return fmt.Errorf("%w: the request carries no or a wrong control token (%s of the workers started ahead of their round)", ErrForged, EnvControlToken)
	}
	if r.Round != 0 {
		return fmt.Errorf("%w: a worker started ahead of its round names round %d", ErrStaleRound, r.Round)
	}
	r.Rank, r.rankSet = -1, false
	return nil
}

// believe checks that r comes from a worker of the current round and sets
// its Round. A sender not admitted yet gets admitWait to be.
func (c *Channel) believe(r *Report) error {
	deadline := time.Now().Add(admitWait)
	for {
		c.mu.Lock()
		rounds, round, changed := c.rounds, c.round, c.admitted
		pgid, err := -1, error(nil)
		if r.PeerPID > 0 {
			pgid, err = syscall.Getpgid(r.PeerPID)
		}
		rank, ok := c.workers[pgid]
		ok = ok && err == nil && pgid > 1
		_, prewarmed := c.prewarm[pgid]
		prewarmed = prewarmed && !ok && err == nil && pgid > 1
		token, ptoken := c.token, c.prewarmToken
		c.mu.Unlock()
		if prewarmed {
			return believePrewarmed(r, ptoken)
		}
		if !rounds {
			return nil
		}

		if round == 0 {
			return fmt.Errorf("%w: no round is current on this node (it is between rounds or was fenced)", ErrStaleRound)
		}
		if r.Round != 0 && r.Round != round {
			return fmt.Errorf("%w: the report is of round %d, the current round is %d", ErrStaleRound, r.Round, round)
		}
		if ok {
			if subtle.ConstantTimeCompare([]byte(r.Token), []byte(token)) != 1 {
				return fmt.Errorf("%w: the report carries no or a wrong control token (%s of the current round's workers)", ErrForged, EnvControlToken)
			}
			if r.rankSet && r.Rank != rank {
				return fmt.Errorf("%w: process %d is the worker of rank %d, and its report names rank %d", ErrForged, r.PeerPID, rank, r.Rank)
			}
			if err := c.plausible(round, r); err != nil {
				return err
			}
			r.Round = round
			return nil
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return fmt.Errorf("%w: process %d (process group %d) is not a worker of round %d", ErrStaleRound, r.PeerPID, pgid, round)
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-t.C:
		case <-c.done:
			t.Stop()
			return ErrClosed
		}
		t.Stop()
	}
}

// peerPID returns the pid of the process at the other end of conn, or 0.
func peerPID(conn *net.UnixConn) int {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0
	}
	var cred *unix.Ucred
	if err := raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cred == nil {
		return 0
	}
	return int(cred.Pid)
}

// Reports delivers worker reports when no handler was given. It is closed by
// Close.
func (c *Channel) Reports() <-chan Report { return c.reports }

// Announce atomically replaces event.json with ev. The caller sends the
// elastic signal afterwards, so that a worker woken by it finds the event.
func (c *Channel) Announce(ev Event) error {
	if ev.Kind == "" {
		return errors.New("checkpoint: announce: event kind is empty")
	}
	if ev.NewWorldSize < 0 || ev.Round < 0 {
		return fmt.Errorf("checkpoint: announce: negative world size (%d) or round (%d)", ev.NewWorldSize, ev.Round)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.seq++
	seq := c.seq
	c.mu.Unlock()
	now := time.Now()
	data, err := json.Marshal(eventFile{
		Kind:            ev.Kind,
		NewWorldSize:    ev.NewWorldSize,
		Deadline:        ev.Deadline,
		DeadlineUnix:    unixSeconds(ev.Deadline),
		Round:           ev.Round,
		TraceParent:     ev.TraceParent,
		Reason:          ev.Reason,
		InProcess:       ev.InProcess,
		Seq:             seq,
		AnnouncedAt:     now,
		AnnouncedAtUnix: unixSeconds(now),
	})
	if err != nil {
		return fmt.Errorf("checkpoint: announce: encode event: %w", err)
	}
	if err := writeFileAtomic(c.eventPath, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("checkpoint: announce: %w", err)
	}
	c.log.Debug("elastic event announced", "kind", ev.Kind, "new_world_size", ev.NewWorldSize, "round", ev.Round, "seq", seq)
	return nil
}

// ClearEvent removes event.json. Call it before starting the next workers.
func (c *Channel) ClearEvent() error {
	if err := os.Remove(c.eventPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checkpoint: clear event: %w", err)
	}
	if err := syncDir(c.dir); err != nil {
		return fmt.Errorf("checkpoint: clear event: %w", err)
	}
	return nil
}

// ReadEvent reads an event file as written by Announce. It returns nil and
// no error when the file does not exist.
func ReadEvent(path string) (*Event, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read event: %w", err)
	}
	var f eventFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("checkpoint: event file %s: malformed: %w", path, err)
	}
	if f.Kind == "" {
		return nil, fmt.Errorf("checkpoint: event file %s: malformed: missing kind", path)
	}
	return &Event{
		Kind:         f.Kind,
		NewWorldSize: f.NewWorldSize,
		Deadline:     f.Deadline,
		Round:        f.Round,
		TraceParent:  f.TraceParent,
		Reason:       f.Reason,
		InProcess:    f.InProcess,
		Seq:          f.Seq,
		AnnouncedAt:  f.AnnouncedAt,
	}, nil
}

// Close stops serving, closes worker connections, removes the socket and
// waits for its goroutines (including a running handler) to return. The
// control directory and event.json are left in place.
func (c *Channel) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		conns := make([]net.Conn, 0, len(c.conns))
		for conn := range c.conns {
			conns = append(conns, conn)
		}
		c.mu.Unlock()
		close(c.done)
		c.cancel()
		if err := c.ln.Close(); err != nil {
			c.closeErr = fmt.Errorf("checkpoint: close control socket: %w", err)
		}
		for _, conn := range conns {
			conn.Close()
		}
		c.wg.Wait()
		close(c.reports)
	})
	return c.closeErr
}

func (c *Channel) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *Channel) acceptLoop() {
	defer c.wg.Done()
	for {
		conn, err := c.ln.AcceptUnix()
		if err != nil {
			if c.isClosed() {
				return
			}
			// Out of file descriptors and the like: back off briefly.
			c.log.Warn("control socket accept failed", "err", err)
			select {
			case <-c.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			conn.Close()
			return
		}
		c.conns[conn] = struct{}{}
		c.wg.Add(1)
		c.mu.Unlock()
		go c.serve(conn)
	}
}

type ack struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Assignment answers a ReportReconfigure.
	Assignment *Assignment `json:"assignment,omitempty"`
}

func (c *Channel) serve(conn *net.UnixConn) {
	defer c.wg.Done()
	defer func() {
		c.mu.Lock()
		delete(c.conns, conn)
		c.mu.Unlock()
		conn.Close()
	}()
	peer := peerPID(conn)
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 0, 4096), maxMessage)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		r, err := parseReport(line)
		if err == nil {
			r.Received = time.Now()
			r.PeerPID = peer
			err = c.believe(&r)
		}
		if err == nil && r.Type == ReportReconfigure {
			// One request per connection: the connection is watched for
			// the worker's death while it waits, then closed.
			c.park(conn, r)
			return
		}
		if err == nil {
			err = c.handle(r)
		}
		a := ack{OK: err == nil}
		if err != nil {
			a.Error = err.Error()
			c.log.Warn("worker report refused", "err", err)
		}
		if !c.reply(conn, a) {
			return
		}
	}
	if err := sc.Err(); err != nil && !c.isClosed() {
		if errors.Is(err, bufio.ErrTooLong) {
			c.reply(conn, ack{Error: fmt.Sprintf("message longer than %d bytes", maxMessage)})
		}
		c.log.Debug("control connection ended", "err", err)
	}
}

func (c *Channel) reply(conn net.Conn, a ack) bool {
	data, _ := json.Marshal(a) // cannot fail: two plain fields
	if err := conn.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return false
	}
	_, err := conn.Write(append(data, '\n'))
	return err == nil
}

func (c *Channel) handle(r Report) error {
	c.handleMu.Lock()
	defer c.handleMu.Unlock()
	if c.isClosed() {
		return ErrClosed
	}
	return c.handler(c.ctx, r)
}

// enqueue is the default handler: queue on Reports().
func (c *Channel) enqueue(ctx context.Context, r Report) error {
	select {
	case c.reports <- r:
		return nil
	case <-ctx.Done():
		return ErrClosed
	}
}

// SendReport sends one report to the control socket and waits for the
// agent's acknowledgement. It is the Go workers' client; an agent refusal
// is returned as an error.
func SendReport(ctx context.Context, socketPath string, r Report) error {
	_, err := exchange(ctx, socketPath, r)
	return err
}

// RequestAssignment sends a ReportReconfigure (the worker has left its
// process group) and waits, until ctx ends, for the agent's answer: the
// worker's next assignment, or Leave. It is the Go workers' reconfigure().
func RequestAssignment(ctx context.Context, socketPath string, r Report) (*Assignment, error) {
	r.Type = ReportReconfigure
	a, err := exchange(ctx, socketPath, r)
	if err != nil {
		return nil, err
	}
	if a.Assignment == nil {
		return nil, errors.New("checkpoint: the agent acknowledged the reconfigure request without an assignment")
	}
	return a.Assignment, nil
}

func exchange(ctx context.Context, socketPath string, r Report) (ack, error) {
	if r.PID == 0 {
		r.PID = os.Getpid()
	}
	if r.Token == "" {
		r.Token = os.Getenv(EnvControlToken)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return ack{}, fmt.Errorf("checkpoint: encode report: %w", err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return ack{}, fmt.Errorf("checkpoint: connect to control socket: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			return ack{}, fmt.Errorf("checkpoint: send report: %w", err)
		}
	}
	// Unblock the read below if ctx is cancelled without a deadline.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := conn.Write(append(data, '\n')); err != nil {
		return ack{}, fmt.Errorf("checkpoint: send report: %w", err)
	}
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return ack{}, fmt.Errorf("checkpoint: wait for acknowledgement: %w", ctx.Err())
		}
		return ack{}, fmt.Errorf("checkpoint: wait for acknowledgement: %w", err)
	}
	var a ack
	if err := json.Unmarshal(line, &a); err != nil {
		return ack{}, fmt.Errorf("checkpoint: malformed acknowledgement %q: %w", bytes.TrimSpace(line), err)
	}
	if !a.OK {
		return ack{}, fmt.Errorf("checkpoint: agent refused %s report: %s", r.Type, a.Error)
	}
	return a, nil
}

// writeFileAtomic writes data to a temporary file beside path, fsyncs it,
// renames it over path and fsyncs the directory.
func writeFileAtomic(path string, data []byte, perm fs.FileMode) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename into %s: %w", path, err)
	}
	ok = true
	return syncDir(dir)
}

// syncDir fsyncs a directory so that entries created, renamed or removed in
// it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %s for fsync: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// plausible refuses a checkpoint beyond the step after which a worker of
// round said it stops (a stopping report with its step), and records that
// step from stopping reports.
func (c *Channel) plausible(round int64, r *Report) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.round != round {
		return nil // superseded meanwhile: the caller's next check refuses it
	}
	switch r.Type {
	case ReportStopping:
		if r.Step > 0 && (c.announced == 0 || r.Step < c.announced) {
			c.announced = r.Step
		}
	case ReportCheckpoint, ReportCheckpointUpdate:
		if c.announced > 0 && r.Step > c.announced {
			return fmt.Errorf("implausible %s report: step %d is beyond step %d, after which this round's workers said they stop", r.Type, r.Step, c.announced)
		}
	}
	return nil
}

// newToken returns a random control token (crypto/rand.Text: 128 bits).
func newToken() string { return rand.Text() }

// Token is the control token the current round's workers carry (Env).
func (c *Channel) Token() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.token
}

// Assignment is what a worker parked by a ReportReconfigure is told: the
// environment of its next round (RANK, WORLD_SIZE, MASTER_ADDR/PORT, the
// round, the new control token...), or to leave (checkpointed already, it
// exits 0).
type Assignment struct {
	Leave bool              `json:"leave,omitempty"`
	Round int64             `json:"round,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	// Reason says why a worker is told to leave.
	Reason string `json:"reason,omitempty"`
}

type parkedWorker struct {
	rank  int
	step  int64
	reply chan Assignment // buffered (1)
}

// park holds a believed ReportReconfigure until Release answers it, the
// worker hangs up (it died) or the channel closes.
func (c *Channel) park(conn *net.UnixConn, r Report) {
	pgid, err := syscall.Getpgid(r.PeerPID)
	if err != nil || pgid <= 1 {
		c.reply(conn, ack{Error: fmt.Sprintf("%v: cannot tell the process group of process %d", ErrStaleRound, r.PeerPID)})
		return
	}
	p := &parkedWorker{rank: r.Rank, step: r.Step, reply: make(chan Assignment, 1)}
	c.mu.Lock()
	if w, ok := c.workers[pgid]; ok {
		p.rank = w
	} else if _, ok := c.prewarm[pgid]; ok {
		p.rank = -1
	}
	c.parked[pgid] = p
	c.parkedChangedLocked()
	c.mu.Unlock()
	c.log.Debug("worker waits for its next assignment", "pgid", pgid, "rank", p.rank, "step", r.Step)
	gone := make(chan struct{})
	go func() {
		// The worker sends nothing more: a read returns when it hangs up.
		var b [1]byte
		conn.Read(b[:])
		close(gone)
	}()
	var a Assignment
	answered := false
	select {
	case a = <-p.reply:
		answered = true
	case <-gone:
	case <-c.done:
	}
	c.mu.Lock()
	if c.parked[pgid] == p {
		delete(c.parked, pgid)
		c.parkedChangedLocked()
	}
	c.mu.Unlock()
	if answered {
		c.reply(conn, ack{OK: true, Assignment: &a})
	}
}

func (c *Channel) parkedChangedLocked() {
	close(c.parkedCh)
	c.parkedCh = make(chan struct{})
}

// Parked returns the process groups of the workers waiting for their next
// assignment, each with the rank it held when it asked (-1: started ahead
// of its round, AdmitPrewarmed), and a channel
// closed when that set changes.
func (c *Channel) Parked() (map[int]int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int]int, len(c.parked))
	for pgid, p := range c.parked {
		out[pgid] = p.rank
	}
	return out, c.parkedCh
}

// Release answers the parked workers named in by (process group ->
// assignment) and returns how many it answered; a worker not parked (any
// more) is skipped. Admit a worker for its new round (SetRound, Admit)
// before releasing it, so that its first report is believed.
func (c *Channel) Release(by map[int]Assignment) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for pgid, a := range by {
		p, ok := c.parked[pgid]
		if !ok {
			continue
		}
		delete(c.parked, pgid)
		p.reply <- a
		n++
	}
	if n > 0 {
		c.parkedChangedLocked()
	}
	return n
}

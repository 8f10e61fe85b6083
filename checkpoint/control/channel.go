package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
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
)

// File names inside the control directory.
const (
	SocketName    = "control.sock"
	EventFileName = "event.json"
)

// maxMessage bounds one worker message (one line).
const maxMessage = 1 << 20

// ErrClosed is returned by a Channel that has been closed.
var ErrClosed = errors.New("control: control channel closed")

// ErrStaleRound is wrapped by the refusal of a report that does not come
// from a worker of the current round (see Channel.SetRound).
var ErrStaleRound = errors.New("not from a worker of the current round")

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
	advisor Advisor
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
	// beats: the current round's heartbeats, by sender pid (heartbeat.go).
	beats map[int]*Heartbeat

	closeOnce sync.Once
	closeErr  error
}

// NewChannel creates dir (mode 0700) and serves the control socket
// dir/control.sock. Without WithHandler, reports are delivered on Reports()
// and acknowledged once queued there.
func NewChannel(dir string, opts ...Option) (*Channel, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("control: control dir %q: %w", dir, err)
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
		return nil, fmt.Errorf("control: control socket path %q is %d bytes, longer than a unix socket allows (107)", c.sock, len(c.sock))
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("control: create control dir: %w", err)
	}
	if fi, err := os.Lstat(c.sock); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("control: %s exists and is not a socket", c.sock)
		}
		// A socket left by an agent that died: nobody can be serving it
		// since we own the directory.
		if err := os.Remove(c.sock); err != nil {
			return nil, fmt.Errorf("control: remove stale socket: %w", err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: c.sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control: listen on control socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(c.sock, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control: chmod control socket: %w", err)
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

// Reports delivers worker reports when no handler was given. It is closed by
// Close.
func (c *Channel) Reports() <-chan Report { return c.reports }

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
			c.closeErr = fmt.Errorf("control: close control socket: %w", err)
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
	// Advice and RetryAfter (seconds) answer a ReportCheckpointFailed
	// (advice.go).
	Advice     string  `json:"advice,omitempty"`
	RetryAfter float64 `json:"retry_after_s,omitempty"`
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
		r, err := ParseReport(line)
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
		if err == nil && r.Type == ReportHeartbeat {
			// Progress only: recorded here, never queued behind a
			// checkpoint commit the handler may be waiting on.
			c.beat(r)
		} else if err == nil {
			err = c.handle(r)
		}
		a := ack{OK: err == nil}
		if err != nil {
			a.Error = err.Error()
			c.log.Warn("worker report refused", "err", err)
		} else {
			c.advise(r, &a)
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

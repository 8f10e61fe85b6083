package c10dstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// ErrClosed is returned by Serve and Wait once the server is closed.
var ErrClosed = errors.New("c10d store: server closed")

// Options configure a Server. The zero value is usable.
type Options struct {
	// Logger receives connection errors (Warn) and connection life (Debug).
	// Default: slog.Default().
	Logger *slog.Logger
	// Limits bound each query (see Limits; zero fields take DefaultLimits).
	Limits Limits
	// MaxStoreBytes bounds the keys, values and queued values held at once
	// (default 1 GiB). A write beyond it closes the writer's connection.
	MaxStoreBytes int64
	// MaxConns bounds the open connections; further ones are closed at once
	// (0: no bound). torch 1.13 opens two connections per client.
	MaxConns int
	// WriteTimeout bounds each write to a client (default 30s); a client
	// that does not read its replies for that long is disconnected.
	WriteTimeout time.Duration
	// MaxPendingBytes bounds the replies queued for a client that is not
	// reading them (wake-ups, watch notifications; default 64 MiB).
	MaxPendingBytes int
}

// Server serves torch's c10d TCPStore protocol (both dialects, chosen per
// connection) from one in-memory store. Its methods are safe for concurrent
// use.
type Server struct {
	opts Options
	log  *slog.Logger
	st   *store

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	first     net.Addr
	closed    bool
	done      chan struct{}
	wg        sync.WaitGroup
}

// New returns a server that serves nothing until Serve is called.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.Limits = opts.Limits.withDefaults()
	if opts.MaxStoreBytes <= 0 {
		opts.MaxStoreBytes = 1 << 30
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 30 * time.Second
	}
	if opts.MaxPendingBytes <= 0 {
		opts.MaxPendingBytes = 64 << 20
	}
	return &Server{
		opts:      opts,
		log:       opts.Logger.With("component", "c10dstore"),
		st:        newStore(opts.MaxStoreBytes),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]struct{}),
		done:      make(chan struct{}),
	}
}

// Listen listens on addr ("host:port"; port 0 picks a free one) and serves
// in the background until ctx is done or Close is called. The server is
// accepting connections when Listen returns.
func Listen(ctx context.Context, addr string, opts Options) (*Server, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("c10d store: listen on %s: %w", addr, err)
	}
	s := New(opts)
	if err := s.addListener(l); err != nil {
		_ = l.Close()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = s.Close() })
	go func() {
		defer stop()
		if err := s.serve(l); err != nil && !errors.Is(err, ErrClosed) {
			s.log.Error("c10d store stopped accepting", "addr", l.Addr().String(), "err", err)
		}
	}()
	return s, nil
}

// Serve accepts connections on l until ctx is done or Close is called, and
// then returns ErrClosed (after closing l). Serve may be called for several
// listeners at once; Close closes them all.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if err := s.addListener(l); err != nil {
		_ = l.Close()
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = s.Close() })
	defer stop()
	return s.serve(l)
}

func (s *Server) addListener(l net.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.listeners[l] = struct{}{}
	if s.first == nil {
		s.first = l.Addr()
	}
	return nil
}

func (s *Server) serve(l net.Listener) error {
	backoff := 5 * time.Millisecond
	for {
		nc, err := l.Accept()
		if err != nil {
			select {
			case <-s.done:
				return ErrClosed
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporaryAccept(err) {
				// Out of file descriptors and the like: retry after a pause
				// instead of spinning.
				s.log.Warn("c10d store accept failed; retrying", "err", err, "in", backoff)
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-s.done:
					t.Stop()
					return ErrClosed
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
			_ = s.Close()
			return fmt.Errorf("c10d store: accept on %s: %w", l.Addr(), err)
		}
		backoff = 5 * time.Millisecond
		s.startConn(nc)
	}
}

func isTemporaryAccept(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

func (s *Server) startConn(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	c := &conn{s: s, nc: nc, remote: nc.RemoteAddr().String()}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = nc.Close()
		return
	}
	if s.opts.MaxConns > 0 && len(s.conns) >= s.opts.MaxConns {
		s.mu.Unlock()
		s.log.Warn("c10d store: too many connections; closing the new one", "remote", c.remote, "max", s.opts.MaxConns)
		_ = nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go c.run()
}

// Addr returns the address of the first listener (nil before one is added).
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

// Port returns the TCP port of Addr (0 when unknown).
func (s *Server) Port() int {
	if a, ok := s.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// Done is closed when the server is closed.
func (s *Server) Done() <-chan struct{} { return s.done }

// Close stops accepting, closes every connection, releases in-process
// waiters, and waits until every connection's goroutines are gone. It is
// idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	close(s.done)
	ls := s.listeners
	cs := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for l := range ls {
		_ = l.Close()
	}
	for _, c := range cs {
		c.close()
	}
	s.wg.Wait()
	return nil
}

// Set stores value under key, as a client's SET would (waking waiters).
// Keys are the raw keys on the wire: torch's TCPStore prefixes the keys its
// users give with "/" (and PrefixStore adds its own prefixes).
func (s *Server) Set(key string, value []byte) error {
	v := append([]byte(nil), value...)
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return s.st.set(key, v)
}

// Get returns a copy of the value under key.
func (s *Server) Get(key string) ([]byte, bool) {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	v, ok := s.st.data[key]
	if !ok {
		return nil, false
	}
	return append([]byte(nil), v...), true
}

// Add adds delta to the decimal integer under key (0 when missing) and
// returns the sum, as a client's ADD would.
func (s *Server) Add(key string, delta int64) (int64, error) {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return s.st.add(key, delta)
}

// Delete removes key and reports whether it existed.
func (s *Server) Delete(key string) bool {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return s.st.deleteKey(key) == 1
}

// NumKeys returns the number of keys, as GETNUMKEYS does (queues excluded).
func (s *Server) NumKeys() int64 {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	return int64(len(s.st.data))
}

// Wait blocks until every key exists (or, for a queue, holds a value),
// ctx is done (ctx.Err()), or the server is closed (ErrClosed).
func (s *Server) Wait(ctx context.Context, keys ...string) error {
	fired := make(chan struct{})
	w := &waiter{fire: func() { close(fired) }}
	s.st.mu.Lock()
	pending := s.st.wait(keys, w)
	s.st.mu.Unlock()
	if !pending {
		return nil
	}
	var err error
	select {
	case <-fired:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-s.done:
		err = ErrClosed
	}
	s.st.mu.Lock()
	stillPending := s.st.cancel(w)
	s.st.mu.Unlock()
	if !stillPending {
		return nil // fired while we were giving up
	}
	return err
}

// conn is one client connection.
type conn struct {
	s      *Server
	nc     net.Conn
	remote string

	wmu     sync.Mutex // serialises writes to nc
	scratch []byte     // reply buffer of the reading goroutine

	// Replies produced outside the reading goroutine (wake-ups, watch
	// notifications, WAIT_CANCELED), written in order by one drainer.
	amu          sync.Mutex
	pending      [][]byte
	pendingBytes int
	draining     bool
	closed       bool

	// Guarded by s.st.mu.
	waiter  *waiter
	watched []string
}

func (c *conn) run() {
	defer c.s.wg.Done()
	defer c.cleanup()
	log := c.s.log.With("remote", c.remote)
	log.Debug("c10d store: client connected")
	dec := NewDecoder(c.nc, c.s.opts.Limits)
	for {
		q, err := dec.Next()
		if err != nil {
			switch {
			case c.isClosed():
			case errors.Is(err, io.EOF):
				log.Debug("c10d store: client disconnected", "dialect", dec.Dialect())
			case errors.Is(err, net.ErrClosed):
			default:
				log.Warn("c10d store: closing connection", "dialect", dec.Dialect(), "err", err)
			}
			return
		}
		if err := c.handle(q); err != nil {
			if !c.isClosed() {
				log.Warn("c10d store: closing connection", "dialect", dec.Dialect(), "op", q.Op.String(), "err", err)
			}
			return
		}
	}
}

func (c *conn) isClosed() bool {
	c.amu.Lock()
	defer c.amu.Unlock()
	return c.closed
}

// close marks the connection closed and closes the socket; the reading
// goroutine then ends and cleans up. Safe from any goroutine, including
// under s.st.mu.
func (c *conn) close() {
	c.amu.Lock()
	already := c.closed
	c.closed = true
	c.pending = nil
	c.amu.Unlock()
	if !already {
		_ = c.nc.Close()
	}
}

func (c *conn) cleanup() {
	c.close()
	st := c.s.st
	st.mu.Lock()
	st.cancel(c.waiter)
	c.waiter = nil
	for _, k := range c.watched {
		st.unwatch(k, c)
	}
	c.watched = nil
	st.mu.Unlock()
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
}

// write sends b now (from the reading goroutine).
func (c *conn) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.opts.WriteTimeout))
	_, err := c.nc.Write(b)
	return err
}

// enqueue queues msg for the drainer. It never blocks, so it may be called
// under s.st.mu; replies queued under that lock keep its order.
func (c *conn) enqueue(msg []byte) {
	c.amu.Lock()
	if c.closed {
		c.amu.Unlock()
		return
	}
	c.pendingBytes += len(msg)
	if c.pendingBytes > c.s.opts.MaxPendingBytes {
		c.amu.Unlock()
		c.s.log.Warn("c10d store: client does not read its replies; closing", "remote", c.remote, "pending_bytes", c.pendingBytes)
		c.close()
		return
	}
	c.pending = append(c.pending, msg)
	if !c.draining {
		c.draining = true
		// The reading goroutine is alive while c is not closed, so the
		// server's WaitGroup count is above zero here.
		c.s.wg.Add(1)
		go c.drain()
	}
	c.amu.Unlock()
}

func (c *conn) drain() {
	defer c.s.wg.Done()
	var buf []byte
	for {
		c.amu.Lock()
		if c.closed || len(c.pending) == 0 {
			c.draining = false
			c.amu.Unlock()
			return
		}
		buf = buf[:0]
		for _, m := range c.pending {
			buf = append(buf, m...)
		}
		c.pending = c.pending[:0]
		c.pendingBytes = 0
		c.amu.Unlock()
		if err := c.write(buf); err != nil {
			if !c.isClosed() {
				c.s.log.Warn("c10d store: write failed; closing", "remote", c.remote, "err", err)
			}
			c.close()
		}
	}
}

// notify implements watchSink.
func (c *conn) notify(msg []byte) { c.enqueue(msg) }

// handle executes one query and sends its reply.
func (c *conn) handle(q Query) error {
	st := c.s.st
	b := c.scratch[:0]
	defer func() {
		if cap(b) <= 64<<10 {
			c.scratch = b[:0]
		}
	}()
	var err error

	st.mu.Lock()
	switch q.Op {
	case OpValidate:
		// The handshake carries no reply.
	case OpPing:
		b = append(b, byte(q.Nonce), byte(q.Nonce>>8), byte(q.Nonce>>16), byte(q.Nonce>>24))
	case OpSet:
		err = st.set(q.Key, q.Value)
	case OpCompareSet:
		var v []byte
		if v, err = st.compareSet(q.Key, q.Expected, q.Desired); err == nil {
			b = appendBytes(b, v)
		}
	case OpGet:
		// torch 1.13's daemon drops the connection on a missing key, the
		// libuv store replies empty; clients always WAIT first anyway.
		b = appendBytes(b, st.data[q.Key])
	case OpAdd:
		var v int64
		if v, err = st.add(q.Key, q.Delta); err == nil {
			b = appendU64(b, uint64(v))
		}
	case OpCheck:
		ready := true
		for _, k := range q.Keys {
			if !st.ready(k) {
				ready = false
				break
			}
		}
		if ready {
			b = append(b, checkReady)
		} else {
			b = append(b, checkNotReady)
		}
	case OpWait:
		// A new WAIT replaces one left behind (torch 1.13 gives up on a
		// timed-out wait without CANCEL_WAIT).
		st.cancel(c.waiter)
		w := &waiter{}
		w.fire = func() {
			c.waiter = nil
			c.enqueue([]byte{waitStopWaiting})
		}
		if st.wait(q.Keys, w) {
			c.waiter = w
		} else {
			c.waiter = nil
			b = append(b, waitStopWaiting)
		}
	case OpCancelWait:
		st.cancel(c.waiter)
		c.waiter = nil
		// Queued behind a STOP_WAITING that may have been queued already:
		// the client expects that order.
		c.enqueue([]byte{waitCanceled})
	case OpGetNumKeys:
		b = appendU64(b, uint64(len(st.data)))
	case OpWatchKey:
		st.watch(q.Key, c)
		c.watched = append(c.watched, q.Key)
		c.enqueue([]byte{watchCallbackRegistered})
	case OpDeleteKey:
		b = appendU64(b, uint64(st.deleteKey(q.Key)))
	case OpAppend:
		err = st.appendTo(q.Key, q.Value)
	case OpMultiGet:
		for _, k := range q.Keys {
			b = appendBytes(b, st.data[k])
		}
	case OpMultiSet:
		for i, k := range q.Keys {
			if err = st.set(k, q.Values[i]); err != nil {
				break
			}
		}
	case OpQueuePush:
		err = st.queuePush(q.Key, q.Value)
	case OpQueuePop:
		n, v := st.queuePop(q.Key)
		b = appendU64(b, uint64(n))
		if n > 0 {
			b = appendBytes(b, v)
		}
	case OpQueueLen:
		b = appendU64(b, uint64(len(st.queues[q.Key])))
	default:
		err = fmt.Errorf("query %s not handled", q.Op)
	}
	st.mu.Unlock()

	if err != nil {
		return err
	}
	if len(b) > 0 {
		return c.write(b)
	}
	return nil
}

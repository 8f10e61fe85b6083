package c10dstore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/testutil"
)

// testLogger sends the server's logs to the test log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func startServer(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	s, err := Listen(context.Background(), "127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestV2ClientQueries(t *testing.T) {
	s := startServer(t, Options{})
	addr := s.Addr().String()
	a := newV2Client(t, addr)
	b := newV2Client(t, addr)

	if v, ok := s.Get("init/"); !ok || string(v) != "2" {
		t.Fatalf("init/ = %q %v, want 2 (each client ADDs 1 on connect)", v, ok)
	}
	a.set("k", "v1")
	if got := b.get("k"); got != "v1" {
		t.Fatalf("get k = %q", got)
	}
	if got := a.add("n", 5); got != 5 {
		t.Fatalf("add = %d", got)
	}
	if got := b.add("n", -7); got != -2 {
		t.Fatalf("add = %d", got)
	}
	if got := a.get("n"); got != "-2" {
		t.Fatalf("get n = %q", got)
	}
	// compare_set: missing key + empty expected creates; missing key +
	// non-empty expected answers expected; mismatch answers the current value.
	if got := a.compareSet("cs", "", "first"); got != "first" {
		t.Fatalf("compare_set create = %q", got)
	}
	if got := b.compareSet("cs", "wrong", "second"); got != "first" {
		t.Fatalf("compare_set mismatch = %q", got)
	}
	if got := b.compareSet("cs", "first", "second"); got != "second" {
		t.Fatalf("compare_set match = %q", got)
	}
	if got := a.compareSet("missing", "x", "y"); got != "x" {
		t.Fatalf("compare_set missing = %q", got)
	}
	if !a.check("k", "n") || a.check("k", "nope") {
		t.Fatal("check")
	}
	a.appendValue("log", "a")
	a.appendValue("log", "bc")
	// APPEND has no answer (torch's protocol): a's next request on the
	// same connection is served after both, b's on its own may not be.
	if got := a.get("log"); got != "abc" {
		t.Fatalf("append, read on the same connection = %q", got)
	}
	if got := b.get("log"); got != "abc" {
		t.Fatalf("append = %q", got)
	}
	b.multiSet([]string{"m1", "m2", "m3"}, []string{"x", "", "zz"})
	if got := a.multiGet("m1", "m2", "m3"); got[0] != "x" || got[1] != "" || got[2] != "zz" {
		t.Fatalf("multi_get = %q", got)
	}
	// init/, k, n, cs, log, m1..m3
	if got := a.numKeys(); got != 8 {
		t.Fatalf("num_keys = %d", got)
	}
	if !a.deleteKey("k") || a.deleteKey("k") {
		t.Fatal("delete_key")
	}
	if got := b.numKeys(); got != 7 {
		t.Fatalf("num_keys after delete = %d", got)
	}
	// A large value crosses the 1440-byte flush watermark: several writes.
	big := string(bytes.Repeat([]byte("0123456789"), 100_000))
	a.set("big", big)
	if got := b.get("big"); got != big {
		t.Fatalf("big value: %d bytes back", len(got))
	}
}

func TestV2WaitWakeAndCancel(t *testing.T) {
	s := startServer(t, Options{})
	addr := s.Addr().String()
	waiter := newV2Client(t, addr)
	setter := newV2Client(t, addr)

	// A wait on present keys returns at once.
	setter.set("here", "1")
	if err := waiter.wait(5*time.Second, "here"); err != nil {
		t.Fatal(err)
	}

	// A wait times out: the client cancels and gets WAIT_CANCELED; the
	// connection stays usable.
	if err := waiter.wait(50*time.Millisecond, "never"); !errors.Is(err, errSocketTimeout) {
		t.Fatalf("wait on a missing key: %v, want timeout", err)
	}
	if got := waiter.get("here"); got != "1" {
		t.Fatalf("after a canceled wait: get = %q", got)
	}

	// A wait on several keys is woken when the last one arrives.
	done := make(chan error, 1)
	go func() { done <- waiter.wait(20*time.Second, "a", "b") }()
	testutil.Eventually(t, 20*time.Second, "1 waiter(s) on /a and 1 waiter(s) on /b", testutil.True(func() bool { return waitersOn(s, "/a") == 1 && waitersOn(s, "/b") == 1 }))
	setter.set("a", "1")
	select {
	case err := <-done:
		t.Fatalf("woken with one of two keys: %v", err)
	default:
	}
	setter.add("b", 1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// STOP_WAITING crossing the client's CANCEL_WAIT: the server sends
	// STOP_WAITING then WAIT_CANCELED, in that order.
	b := waiter.buf(v2Wait)
	b.u64(1)
	b.str("/late")
	b.flush()
	testutil.Eventually(t, 20*time.Second, "1 waiter(s) on /late", testutil.True(func() bool { return waitersOn(s, "/late") == 1 }))
	setter.set("late", "x")
	setter.numKeys() // a round trip: the SET has been applied
	b = waiter.buf(v2CancelWait)
	b.flush()
	if r := waiter.recvU8(); r != 0 {
		t.Fatalf("first reply %d, want STOP_WAITING", r)
	}
	if r := waiter.recvU8(); r != 1 {
		t.Fatalf("second reply %d, want WAIT_CANCELED", r)
	}
	if got := waiter.numKeys(); got < 1 {
		t.Fatalf("connection unusable after cancel: num_keys %d", got)
	}

	// A waiter that disconnects leaves nothing behind.
	gone := newV2Client(t, addr)
	b = gone.buf(v2Wait)
	b.u64(1)
	b.str("/ghost")
	b.flush()
	testutil.Eventually(t, 20*time.Second, "1 waiter(s) on /ghost", testutil.True(func() bool { return waitersOn(s, "/ghost") == 1 }))
	_ = gone.nc.Close()
	testutil.Eventually(t, 20*time.Second, "0 waiter(s) on /ghost", testutil.True(func() bool { return waitersOn(s, "/ghost") == 0 }))
	setter.set("ghost", "boo") // no write to a dead connection
}

func TestV2Queues(t *testing.T) {
	s := startServer(t, Options{})
	addr := s.Addr().String()
	p := newV2Client(t, addr)
	q1 := newV2Client(t, addr)
	q2 := newV2Client(t, addr)

	if _, ok, err := q1.queuePop("jobs", false, 0); err != nil || ok {
		t.Fatalf("pop of an empty queue: ok=%v err=%v", ok, err)
	}
	p.queuePush("jobs", "a")
	p.queuePush("jobs", "b")
	if n := p.queueLen("jobs"); n != 2 {
		t.Fatalf("queue_len = %d", n)
	}
	if !p.check("jobs") {
		t.Fatal("check on a non-empty queue is false")
	}
	for _, want := range []string{"a", "b"} {
		v, ok, err := q1.queuePop("jobs", true, 5*time.Second)
		if err != nil || !ok || v != want {
			t.Fatalf("pop = %q %v %v, want %q", v, ok, err, want)
		}
	}
	// Two blocked poppers, one push: exactly one is woken.
	type res struct {
		v   string
		err error
	}
	results := make(chan res, 2)
	for _, c := range []*testClient{q1, q2} {
		go func() {
			v, _, err := c.queuePop("work", true, 20*time.Second)
			results <- res{v, err}
		}()
	}
	testutil.Eventually(t, 20*time.Second, "2 waiter(s) on /work", testutil.True(func() bool { return waitersOn(s, "/work") == 2 }))
	p.queuePush("work", "w1")
	r := <-results
	if r.err != nil || r.v != "w1" {
		t.Fatalf("first popper: %+v", r)
	}
	select {
	case r := <-results:
		t.Fatalf("second popper woken by one push: %+v", r)
	default:
	}
	p.queuePush("work", "w2")
	if r := <-results; r.err != nil || r.v != "w2" {
		t.Fatalf("second popper: %+v", r)
	}
	if n := p.queueLen("work"); n != 0 {
		t.Fatalf("queue_len = %d", n)
	}
	if n := p.numKeys(); n != 1 { // init/ only: queues are not keys
		t.Fatalf("num_keys = %d", n)
	}
}

// TestLegacyClient speaks torch 1.13's protocol (no handshake, SET = 0), and
// the 2.0/2.1 additions that share it.
func TestLegacyClient(t *testing.T) {
	s := startServer(t, Options{})
	addr := s.Addr().String()
	a := newLegacyClient(t, addr)
	b := newLegacyClient(t, addr)
	v2 := newV2Client(t, addr) // both dialects on one store

	a.set("k", "v")
	if got := b.get("k"); got != "v" {
		t.Fatalf("get = %q", got)
	}
	if got := v2.get("k"); got != "v" {
		t.Fatalf("v2 get of a legacy key = %q", got)
	}
	if got := b.add("n", 3); got != 3 {
		t.Fatalf("add = %d", got)
	}
	if got := a.compareSet("cs", "", "x"); got != "x" {
		t.Fatalf("compare_set = %q", got)
	}
	if !a.check("k", "n") || a.check("zz") {
		t.Fatal("check")
	}
	if n := a.numKeys(); n != 4 { // init/, k, n, cs
		t.Fatalf("num_keys = %d", n)
	}
	if !a.deleteKey("cs") || a.deleteKey("cs") {
		t.Fatal("delete_key")
	}
	if err := a.wait(50*time.Millisecond, "never"); !errors.Is(err, errSocketTimeout) {
		t.Fatalf("wait: %v", err)
	}
	a.appendValue("ap", "1")
	a.appendValue("ap", "2")
	b.multiSet([]string{"x", "y"}, []string{"1", "2"})
	if got := a.multiGet("ap", "x", "y"); got[0] != "12" || got[1] != "1" || got[2] != "2" {
		t.Fatalf("multi_get = %q", got)
	}

	// WATCH_KEY, as torch 1.13's callback connection sends it: registered,
	// then created / updated / deleted notifications with old and new values.
	w := &testClient{t: t, nc: dialTest(t, addr), prefix: "/"}
	w.r = bufio.NewReader(w.nc)
	bb := w.buf(l1WatchKey)
	bb.str("/watched")
	bb.flush()
	if r := w.recvU8(); r != 3 {
		t.Fatalf("watch reply %d, want KEY_CALLBACK_REGISTERED", r)
	}
	a.set("watched", "one")
	a.set("watched", "two")
	a.deleteKey("watched")
	for _, want := range []struct {
		kind     byte
		old, new string
	}{{1, "", "one"}, {0, "one", "two"}, {2, "two", ""}} {
		kind := w.recvU8()
		key := string(w.recvBits())
		old := string(w.recvBits())
		nv := string(w.recvBits())
		if kind != want.kind || key != "/watched" || old != want.old || nv != want.new {
			t.Fatalf("notification (%d %q %q %q), want %+v", kind, key, old, nv, want)
		}
	}
}

func TestHostileInput(t *testing.T) {
	s := startServer(t, Options{Limits: Limits{MaxKeyLen: 1024, MaxValueLen: 1 << 20, MaxKeysPerQuery: 100}})
	addr := s.Addr().String()
	u64 := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	validate := []byte{0, 0xCE, 0xF7, 0x85, 0x3C}
	cases := []struct {
		name     string
		in       []byte
		halfOpen bool // close our write side: the frame stays truncated
	}{
		{"unknown legacy query", []byte{200}, false},
		{"unknown v2 query", cat(validate, []byte{17}), false},
		{"v2 validate twice", cat(validate, validate), false},
		{"wrong magic", []byte{0, 0xEF, 0xBE, 0xAD, 0xDE, 0xFF, 0xFF, 0xFF, 0xFF}, false},
		{"huge key length", cat([]byte{l1Set}, u64(1<<62)), false},
		{"key over the limit", cat([]byte{l1Get}, u64(1025)), false},
		{"value over the limit", cat([]byte{l1Set}, u64(1), []byte("k"), u64(2<<20)), false},
		{"huge key count", cat([]byte{l1Wait}, u64(^uint64(0))), false},
		{"negative multi_set count", cat(validate, []byte{v2MultiSet}, u64(uint64(1<<63))), false},
		{"add to a non-number", cat([]byte{l1Set}, u64(1), []byte("k"), u64(3), []byte("abc"),
			[]byte{l1Add}, u64(1), []byte("k"), u64(1)), false},
		{"truncated header", cat(validate, []byte{v2Set, 5, 0, 0}), true},
		{"truncated key", cat([]byte{l1Set}, u64(10), []byte("abc")), true},
		{"truncated handshake", []byte{0, 0xCE, 0xF7}, true},
		{"announced value never sent", cat([]byte{l1Set}, u64(1), []byte("k"), u64(1<<20)), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nc := dialTest(t, addr)
			if _, err := nc.Write(tc.in); err != nil {
				t.Fatal(err)
			}
			if tc.halfOpen {
				_ = nc.(*net.TCPConn).CloseWrite()
			}
			expectClosed(t, nc)
		})
	}
	// The server still serves, and nothing half-written was stored.
	c := newV2Client(t, addr)
	c.set("ok", "fine")
	if got := c.get("ok"); got != "fine" {
		t.Fatalf("after hostile input: %q", got)
	}
	if _, ok := s.Get("k"); !ok {
		t.Fatal(`"k" from the ADD case is missing`)
	}
	testutil.Eventually(t, 20*time.Second, "one open connection", testutil.True(func() bool { return s.numConns() == 1 }))
}

func TestLimitsOnStoreAndConnections(t *testing.T) {
	s := startServer(t, Options{MaxStoreBytes: 1000, MaxConns: 2})
	addr := s.Addr().String()
	a := newV2Client(t, addr)
	a.set("k", string(make([]byte, 500)))
	b := newV2Client(t, addr)
	b.set("k", string(make([]byte, 900))) // replaces: fits
	b.appendValue("k", string(make([]byte, 200)))
	expectClosed(t, b.nc)
	if v, _ := s.Get("/k"); len(v) != 900 {
		t.Fatalf("value after the refused append: %d bytes", len(v))
	}
	if got := a.add("n", 1); got != 1 {
		t.Fatalf("add = %d", got)
	}
	testutil.Eventually(t, 20*time.Second, "one open connection", testutil.True(func() bool { return s.numConns() == 1 }))
	_ = newV2Client(t, addr)
	third := dialTest(t, addr)
	expectClosed(t, third)
}

func TestInProcessAPI(t *testing.T) {
	s := startServer(t, Options{})
	c := newV2Client(t, s.Addr().String())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Wait(ctx, "/a", "/b") }()
	c.set("a", "1")
	c.set("b", "2")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := s.Set("/fromagent", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if got := c.get("fromagent"); got != "hi" {
		t.Fatalf("client get of an in-process key = %q", got)
	}
	if n, err := s.Add("/a", 41); err != nil || n != 42 {
		t.Fatalf("Add = %d %v", n, err)
	}
	if v, ok := s.Get("/a"); !ok || string(v) != "42" {
		t.Fatalf("Get = %q %v", v, ok)
	}
	if n := s.NumKeys(); n != 4 { // init/, /a, /b, /fromagent
		t.Fatalf("NumKeys = %d", n)
	}
	if !s.Delete("/a") || s.Delete("/a") {
		t.Fatal("Delete")
	}
	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	if err := s.Wait(short, "/never"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v", err)
	}
	if waitersOn(s, "/never") != 0 {
		t.Fatal("a timed-out Wait left its waiter behind")
	}
}

func TestCloseClosesEverything(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{Logger: testLogger(t)})
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background(), l) }()
	addr := l.Addr().String()
	c := newV2Client(t, addr)
	legacy := newLegacyClient(t, addr)
	b := c.buf(v2Wait) // a connection blocked in WAIT
	b.u64(1)
	b.str("/never")
	b.flush()
	testutil.Eventually(t, 20*time.Second, "1 waiter(s) on /never", testutil.True(func() bool { return waitersOn(s, "/never") == 1 }))
	waitDone := make(chan error, 1)
	go func() { waitDone <- s.Wait(context.Background(), "/also-never") }()
	testutil.Eventually(t, 20*time.Second, "1 waiter(s) on /also-never", testutil.True(func() bool { return waitersOn(s, "/also-never") == 1 }))

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, c.nc)
	expectClosed(t, legacy.nc)
	if err := <-waitDone; !errors.Is(err, ErrClosed) {
		t.Fatalf("in-process Wait after Close: %v", err)
	}
	if err := <-served; !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve after Close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Fatal("still accepting after Close")
	}
	if s.numConns() != 0 {
		t.Fatalf("%d connections left", s.numConns())
	}
	_ = s.Close() // idempotent
}

func TestServeStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Listen(ctx, "127.0.0.1:0", Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	c := newV2Client(t, s.Addr().String())
	cancel()
	select {
	case <-s.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("server not closed after its context ended")
	}
	expectClosed(t, c.nc)
	if s.Port() == 0 {
		t.Fatal("Port() = 0")
	}
}

func TestManyClientsConcurrently(t *testing.T) {
	s := startServer(t, Options{})
	addr := s.Addr().String()
	const n = 16
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c *testClient
			if i%2 == 0 {
				c = newV2Client(t, addr)
			} else {
				c = newLegacyClient(t, addr)
			}
			c.set("rank"+strconv.Itoa(i), strconv.Itoa(i))
			c.add("arrived", 1)
			// barrier: everyone waits for everyone
			keys := make([]string, n)
			for j := range keys {
				keys[j] = "rank" + strconv.Itoa(j)
			}
			if err := c.wait(20*time.Second, keys...); err != nil {
				t.Error(err)
				return
			}
			got := c.multiGet(keys...)
			for j, v := range got {
				if v != strconv.Itoa(j) {
					t.Errorf("client %d: rank%d = %q", i, j, v)
				}
			}
		}()
	}
	wg.Wait()
	if v, _ := s.Get("/arrived"); string(v) != strconv.Itoa(n) {
		t.Fatalf("arrived = %q", v)
	}
}

// BenchmarkSetGet measures a torch client's set followed by get (SET, then
// WAIT + GET, one round trip each for WAIT and GET) over loopback.
func BenchmarkSetGet(b *testing.B) {
	s := startServer(b, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	c := newV2Client(b, s.Addr().String())
	for b.Loop() {
		c.set("key", "value")
		if c.get("key") != "value" {
			b.Fatal("bad value")
		}
	}
}

// BenchmarkAdd measures one ADD round trip.
func BenchmarkAdd(b *testing.B) {
	s := startServer(b, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	c := newV2Client(b, s.Addr().String())
	for b.Loop() {
		c.add("counter", 1)
	}
}

func waitersOn(s *Server, key string) int {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	n := 0
	for _, w := range s.st.waiters[key] {
		if !w.done {
			n++
		}
	}
	return n
}

func (s *Server) numConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// TestUnreadRepliesBounded: a legacy WATCH_KEY connection that never reads
// its notifications is dropped once MaxPendingBytes of them are queued; the
// writer is not held up.
func TestUnreadRepliesBounded(t *testing.T) {
	s := startServer(t, Options{MaxPendingBytes: 1 << 20, WriteTimeout: time.Minute})
	addr := s.Addr().String()
	w := dialTest(t, addr)
	watch := binary.LittleEndian.AppendUint64([]byte{l1WatchKey}, 2)
	if _, err := w.Write(append(watch, "/w"...)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the condition", testutil.True(func() bool {
		s.st.mu.Lock()
		defer s.st.mu.Unlock()
		return len(s.st.watchers["/w"]) == 1
	}))

	c := newLegacyClient(t, addr)
	value := string(make([]byte, 64<<10))
	for i := 0; s.numConns() == 2; i++ {
		if i == 2000 { // 128 MiB of notifications
			t.Fatal("the connection that does not read was not dropped")
		}
		c.set("w", value)
		c.numKeys() // round trip: the SET and its notification happened
	}
	// The socket is closed on the server side (what is still in the kernel's
	// buffers drains to the client at its pace); the writer goes on.
	if got := c.get("w"); len(got) != len(value) {
		t.Fatalf("get after the drop: %d bytes", len(got))
	}
}

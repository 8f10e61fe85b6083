package c10dstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// testClient speaks the client side of the protocol byte for byte as torch
// does (torch/csrc/distributed/c10d/TCPStore.cpp): every query is built in a
// SendBuffer (query byte, then uint64-length-prefixed strings and vectors and
// native little-endian values) that is flushed when it reaches 1440 bytes and
// at the end of the query; wire bytes are written by hand here, not with the
// package's tables, so that a mistake in those tables cannot hide itself.
type testClient struct {
	t      testing.TB
	nc     net.Conn
	r      *bufio.Reader
	v2     bool
	prefix string
}

// torch 2.2+ QueryType (TCPStoreBackend.hpp).
const (
	v2Validate   = 0
	v2Set        = 1
	v2CompareSet = 2
	v2Get        = 3
	v2Add        = 4
	v2Check      = 5
	v2Wait       = 6
	v2GetNumKeys = 7
	v2DeleteKey  = 8
	v2Append     = 9
	v2MultiGet   = 10
	v2MultiSet   = 11
	v2CancelWait = 12
	v2Ping       = 13
	v2QueuePush  = 14
	v2QueuePop   = 15
	v2QueueLen   = 16
)

// torch 1.13 QueryType (TCPStore.cpp), and the 2.0/2.1 additions.
const (
	l1Set        = 0
	l1CompareSet = 1
	l1Get        = 2
	l1Add        = 3
	l1Check      = 4
	l1Wait       = 5
	l1GetNumKeys = 6
	l1WatchKey   = 7
	l1DeleteKey  = 8
	l1Append     = 9
	l1MultiGet   = 10
	l1MultiSet   = 11
	l1CancelWait = 12
)

func dialTest(t testing.TB, addr string) net.Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return nc
}

// newV2Client connects like torch 2.x's TCPStore constructor: VALIDATE with
// the magic number, then PING with the pid as nonce, then (waitWorkers with
// a world size) ADD "init/" 1.
func newV2Client(t testing.TB, addr string) *testClient {
	t.Helper()
	c := &testClient{t: t, nc: dialTest(t, addr), v2: true, prefix: "/"}
	c.r = bufio.NewReader(c.nc)
	b := c.buf(v2Validate)
	b.u32(0x3C85F7CE)
	b.flush()
	nonce := uint32(os.Getpid())
	b = c.buf(v2Ping)
	b.u32(nonce)
	b.flush()
	if got := c.recvU32(); got != nonce {
		t.Fatalf("ping: nonce %d, want %d", got, nonce)
	}
	c.incrementValueBy("init/", 1)
	return c
}

// newLegacyClient connects like torch 1.13 (no handshake; ADD "init/" 1).
func newLegacyClient(t testing.TB, addr string) *testClient {
	t.Helper()
	c := &testClient{t: t, nc: dialTest(t, addr), prefix: "/"}
	c.r = bufio.NewReader(c.nc)
	c.incrementValueBy("init/", 1)
	return c
}

func (c *testClient) op(v2, legacy byte) byte {
	if c.v2 {
		return v2
	}
	return legacy
}

type sendBuffer struct {
	c   *testClient
	buf []byte
}

func (c *testClient) buf(cmd byte) *sendBuffer {
	return &sendBuffer{c: c, buf: []byte{cmd}}
}

func (b *sendBuffer) maybeFlush() {
	if len(b.buf) >= 1440 {
		b.flush()
	}
}

func (b *sendBuffer) u64(v uint64) {
	b.buf = binary.LittleEndian.AppendUint64(b.buf, v)
	b.maybeFlush()
}

func (b *sendBuffer) u32(v uint32) {
	b.buf = binary.LittleEndian.AppendUint32(b.buf, v)
	b.maybeFlush()
}

func (b *sendBuffer) str(s string) {
	b.buf = binary.LittleEndian.AppendUint64(b.buf, uint64(len(s)))
	b.buf = append(b.buf, s...)
	b.maybeFlush()
}

func (b *sendBuffer) flush() {
	if len(b.buf) == 0 {
		return
	}
	if _, err := b.c.nc.Write(b.buf); err != nil {
		b.c.t.Fatalf("write: %v", err)
	}
	b.buf = b.buf[:0]
}

func (c *testClient) deadline() {
	_ = c.nc.SetReadDeadline(time.Now().Add(20 * time.Second))
}

func (c *testClient) recvFull(n int) []byte {
	c.t.Helper()
	c.deadline()
	b := make([]byte, n)
	if _, err := io.ReadFull(c.r, b); err != nil {
		c.t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

func (c *testClient) recvU8() byte     { return c.recvFull(1)[0] }
func (c *testClient) recvU32() uint32  { return binary.LittleEndian.Uint32(c.recvFull(4)) }
func (c *testClient) recvI64() int64   { return int64(binary.LittleEndian.Uint64(c.recvFull(8))) }
func (c *testClient) recvBits() []byte { return c.recvFull(int(c.recvI64())) }

func (c *testClient) set(key, value string) {
	b := c.buf(c.op(v2Set, l1Set))
	b.str(c.prefix + key)
	b.str(value)
	b.flush()
}

func (c *testClient) compareSet(key, expected, desired string) string {
	b := c.buf(c.op(v2CompareSet, l1CompareSet))
	b.str(c.prefix + key)
	b.str(expected)
	b.str(desired)
	b.flush()
	return string(c.recvBits())
}

// get is TCPStore::get: doWait(key, timeout_) then GET.
func (c *testClient) get(key string) string {
	c.t.Helper()
	if err := c.doWait([]string{c.prefix + key}, 20*time.Second); err != nil {
		c.t.Fatalf("get %q: %v", key, err)
	}
	b := c.buf(c.op(v2Get, l1Get))
	b.str(c.prefix + key)
	b.flush()
	return string(c.recvBits())
}

func (c *testClient) add(key string, delta int64) int64 {
	return c.incrementValueBy(c.prefix+key, delta)
}

func (c *testClient) incrementValueBy(key string, delta int64) int64 {
	b := c.buf(c.op(v2Add, l1Add))
	b.str(key)
	b.u64(uint64(delta))
	b.flush()
	return c.recvI64()
}

func (c *testClient) deleteKey(key string) bool {
	b := c.buf(c.op(v2DeleteKey, l1DeleteKey))
	b.str(c.prefix + key)
	b.flush()
	return c.recvI64() == 1
}

func (c *testClient) numKeys() int64 {
	b := c.buf(c.op(v2GetNumKeys, l1GetNumKeys))
	b.flush()
	return c.recvI64()
}

func (c *testClient) check(keys ...string) bool {
	c.t.Helper()
	b := c.buf(c.op(v2Check, l1Check))
	b.u64(uint64(len(keys)))
	for _, k := range keys {
		b.str(c.prefix + k)
	}
	b.flush()
	switch r := c.recvU8(); r {
	case 0:
		return true
	case 1:
		return false
	default:
		c.t.Fatalf("check: response %d", r)
		return false
	}
}

//lint:ignore ST1005 torch's own message, which clients match
var errSocketTimeout = errors.New("Socket Timeout")

// doWait is torch 2.x's TCPStore::doWait: WAIT, then wait for input up to
// timeout; on timeout CANCEL_WAIT and expect WAIT_CANCELED, possibly after a
// STOP_WAITING that crossed the cancel.
func (c *testClient) doWait(keys []string, timeout time.Duration) error {
	c.t.Helper()
	b := c.buf(c.op(v2Wait, l1Wait))
	b.u64(uint64(len(keys)))
	for _, k := range keys {
		b.str(k)
	}
	b.flush()
	_ = c.nc.SetReadDeadline(time.Now().Add(timeout))
	one := make([]byte, 1)
	_, err := io.ReadFull(c.r, one)
	var ne net.Error
	switch {
	case err == nil:
		if one[0] != 0 {
			return fmt.Errorf("stop_waiting response is expected, got %d", one[0])
		}
		return nil
	case errors.As(err, &ne) && ne.Timeout():
	default:
		return err
	}
	b = c.buf(c.op(v2CancelWait, l1CancelWait))
	b.flush()
	r := c.recvU8()
	if r != 1 {
		if r != 0 {
			return fmt.Errorf("stop_waiting response is expected, got %d", r)
		}
		if r = c.recvU8(); r != 1 {
			return fmt.Errorf("wait_canceled response is expected, got %d", r)
		}
	}
	return errSocketTimeout
}

func (c *testClient) wait(timeout time.Duration, keys ...string) error {
	p := make([]string, len(keys))
	for i, k := range keys {
		p[i] = c.prefix + k
	}
	return c.doWait(p, timeout)
}

func (c *testClient) appendValue(key, value string) {
	b := c.buf(c.op(v2Append, l1Append))
	b.str(c.prefix + key)
	b.str(value)
	b.flush()
}

// multiGet is TCPStore::multiGet: doWait(keys) then MULTI_GET.
func (c *testClient) multiGet(keys ...string) []string {
	c.t.Helper()
	if err := c.wait(20*time.Second, keys...); err != nil {
		c.t.Fatalf("multiGet: %v", err)
	}
	b := c.buf(c.op(v2MultiGet, l1MultiGet))
	b.u64(uint64(len(keys)))
	for _, k := range keys {
		b.str(c.prefix + k)
	}
	b.flush()
	out := make([]string, len(keys))
	for i := range keys {
		out[i] = string(c.recvBits())
	}
	return out
}

func (c *testClient) multiSet(keys, values []string) {
	b := c.buf(c.op(v2MultiSet, l1MultiSet))
	b.u64(uint64(len(keys))) // int64 on the wire
	for i := range keys {
		b.str(c.prefix + keys[i])
		b.str(values[i])
	}
	b.flush()
}

func (c *testClient) queuePush(key, value string) {
	b := c.buf(v2QueuePush)
	b.str(c.prefix + key)
	b.str(value)
	b.flush()
}

// queuePop is TCPStore::queuePop: with block, doWait(key) first; the reply
// is the queue length, then the value when the length was not zero.
func (c *testClient) queuePop(key string, block bool, timeout time.Duration) (string, bool, error) {
	if block {
		if err := c.wait(timeout, key); err != nil {
			return "", false, err
		}
	}
	b := c.buf(v2QueuePop)
	b.str(c.prefix + key)
	b.flush()
	if n := c.recvI64(); n <= 0 {
		return "", false, nil
	}
	return string(c.recvBits()), true, nil
}

func (c *testClient) queueLen(key string) int64 {
	b := c.buf(v2QueueLen)
	b.str(c.prefix + key)
	b.flush()
	return c.recvI64()
}

// expectClosed reads until the server closes the connection.
func expectClosed(t testing.TB, nc net.Conn) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 256)
	for {
		_, err := nc.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("server did not close the connection")
		}
		return
	}
}

package c10dstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ValidationMagic is the number a torch 2.2+ client sends, little-endian,
// right after the VALIDATE query byte, as the first bytes of every connection.
const ValidationMagic uint32 = 0x3C85F7CE

// Dialect is the generation of the wire protocol a connection speaks. The
// server tells them apart by the first bytes of the connection.
type Dialect uint8

const (
	// DialectUnknown: nothing has been decoded yet.
	DialectUnknown Dialect = iota
	// DialectLegacy is the protocol of torch 1.x up to 2.1 (the classic
	// TCPStore daemon): no handshake, SET is query byte 0, WATCH_KEY exists.
	DialectLegacy
	// DialectV2 is the protocol of torch 2.2 and later (the libuv store and
	// the classic daemon of those versions): the connection opens with
	// VALIDATE (byte 0) and the magic number, every later query byte is
	// shifted by one, and PING and the queue queries exist.
	DialectV2
)

func (d Dialect) String() string {
	switch d {
	case DialectLegacy:
		return "legacy"
	case DialectV2:
		return "v2"
	}
	return "unknown"
}

// Op is a query, independent of its wire byte in a dialect.
type Op uint8

// The queries of both dialects.
const (
	OpInvalid    Op = iota
	OpValidate      // v2: uint32 magic; no reply
	OpSet           // key, value; no reply
	OpCompareSet    // key, expected, desired; reply: value
	OpGet           // key; reply: value
	OpAdd           // key, int64; reply: int64
	OpCheck         // uint64 n, n keys; reply: uint8 READY(0)/NOT_READY(1)
	OpWait          // uint64 n, n keys; reply (when all exist): uint8 STOP_WAITING(0)
	OpGetNumKeys    // reply: int64
	OpWatchKey      // legacy: key; reply: uint8 KEY_CALLBACK_REGISTERED(3), then notifications
	OpDeleteKey     // key; reply: int64 number deleted
	OpAppend        // key, value; no reply
	OpMultiGet      // uint64 n, n keys; reply: n values
	OpMultiSet      // int64 n, n (key, value); no reply
	OpCancelWait    // reply: uint8 WAIT_CANCELED(1)
	OpPing          // v2: uint32 nonce; reply: the nonce
	OpQueuePush     // v2: key, value; no reply
	OpQueuePop      // v2: key; reply: int64 length before the pop, then the value if it was > 0
	OpQueueLen      // v2: key; reply: int64
	numOps
)

var opNames = [numOps]string{
	"INVALID", "VALIDATE", "SET", "COMPARE_SET", "GET", "ADD", "CHECK", "WAIT",
	"GETNUMKEYS", "WATCH_KEY", "DELETE_KEY", "APPEND", "MULTI_GET", "MULTI_SET",
	"CANCEL_WAIT", "PING", "QUEUE_PUSH", "QUEUE_POP", "QUEUE_LEN",
}

func (o Op) String() string {
	if o < numOps {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Wire query bytes, by dialect (the position in the slice is the byte).
var (
	// torch 1.13 TCPStore.cpp QueryType, extended by 2.0/2.1 with APPEND..CANCEL_WAIT.
	legacyOps = []Op{OpSet, OpCompareSet, OpGet, OpAdd, OpCheck, OpWait, OpGetNumKeys,
		OpWatchKey, OpDeleteKey, OpAppend, OpMultiGet, OpMultiSet, OpCancelWait}
	// torch 2.2+ TCPStoreBackend.hpp QueryType.
	v2Ops = []Op{OpValidate, OpSet, OpCompareSet, OpGet, OpAdd, OpCheck, OpWait,
		OpGetNumKeys, OpDeleteKey, OpAppend, OpMultiGet, OpMultiSet, OpCancelWait,
		OpPing, OpQueuePush, OpQueuePop, OpQueueLen}
)

// WireByte returns the query byte of op in dialect d, and false when the
// dialect has no such query.
func WireByte(d Dialect, op Op) (byte, bool) {
	var table []Op
	switch d {
	case DialectLegacy:
		table = legacyOps
	case DialectV2:
		table = v2Ops
	default:
		return 0, false
	}
	for i, o := range table {
		if o == op {
			return byte(i), true
		}
	}
	return 0, false
}

// Reply bytes.
const (
	checkReady              = 0
	checkNotReady           = 1
	waitStopWaiting         = 0
	waitCanceled            = 1
	watchKeyUpdated         = 0
	watchKeyCreated         = 1
	watchKeyDeleted         = 2
	watchCallbackRegistered = 3
	watchKeyAppended        = 4
)

// Query is one decoded query. Which fields are set depends on Op.
type Query struct {
	Op Op
	// Key: SET, COMPARE_SET, GET, ADD, WATCH_KEY, DELETE_KEY, APPEND, QUEUE_*.
	Key string
	// Keys: CHECK, WAIT, MULTI_GET, MULTI_SET.
	Keys []string
	// Value: SET, APPEND, QUEUE_PUSH.
	Value []byte
	// Expected and Desired: COMPARE_SET.
	Expected, Desired []byte
	// Values: MULTI_SET, parallel to Keys.
	Values [][]byte
	// Delta: ADD.
	Delta int64
	// Nonce: PING's nonce, VALIDATE's magic.
	Nonce uint32
}

// Limits bound what one query may carry. Zero fields take the defaults.
type Limits struct {
	// MaxKeyLen bounds a key (default 64 KiB; torch 2.x's libuv store: 8 KiB).
	MaxKeyLen int
	// MaxValueLen bounds a value (default 64 MiB; torch 2.x's libuv store: 8 MiB).
	MaxValueLen int
	// MaxKeysPerQuery bounds CHECK, WAIT, MULTI_GET and MULTI_SET
	// (default 128Ki, as torch 2.x's libuv store).
	MaxKeysPerQuery int
	// MaxQueryBytes bounds the keys and values of one query together
	// (default 256 MiB).
	MaxQueryBytes int64
}

// DefaultLimits are the limits used for zero fields.
var DefaultLimits = Limits{
	MaxKeyLen:       64 << 10,
	MaxValueLen:     64 << 20,
	MaxKeysPerQuery: 128 << 10,
	MaxQueryBytes:   256 << 20,
}

func (l Limits) withDefaults() Limits {
	if l.MaxKeyLen <= 0 {
		l.MaxKeyLen = DefaultLimits.MaxKeyLen
	}
	if l.MaxValueLen <= 0 {
		l.MaxValueLen = DefaultLimits.MaxValueLen
	}
	if l.MaxKeysPerQuery <= 0 {
		l.MaxKeysPerQuery = DefaultLimits.MaxKeysPerQuery
	}
	if l.MaxQueryBytes <= 0 {
		l.MaxQueryBytes = DefaultLimits.MaxQueryBytes
	}
	return l
}

// ProtocolError is a malformed or forbidden query. The connection that sent
// it cannot be resynchronised and is closed.
type ProtocolError struct {
	Dialect Dialect
	Op      Op
	Msg     string
}

func (e *ProtocolError) Error() string {
	if e.Op != OpInvalid {
		return fmt.Sprintf("c10d store protocol (%s) %s: %s", e.Dialect, e.Op, e.Msg)
	}
	return fmt.Sprintf("c10d store protocol (%s): %s", e.Dialect, e.Msg)
}

// Decoder reads queries from one connection's byte stream. It is not safe
// for concurrent use.
type Decoder struct {
	r       *bufio.Reader
	lim     Limits
	dialect Dialect
	first   bool // the next query is the connection's first
	budget  int64
	op      Op
}

// NewDecoder returns a decoder reading from r. The dialect is decided by the
// first query: VALIDATE with the right magic means DialectV2, anything else
// DialectLegacy.
func NewDecoder(r io.Reader, lim Limits) *Decoder {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 16<<10)
	}
	return &Decoder{r: br, lim: lim.withDefaults(), first: true}
}

// Dialect returns the connection's dialect (DialectUnknown before the first
// query).
func (d *Decoder) Dialect() Dialect { return d.dialect }

func (d *Decoder) errf(format string, args ...any) error {
	return &ProtocolError{Dialect: d.dialect, Op: d.op, Msg: fmt.Sprintf(format, args...)}
}

// Next decodes the next query. It returns io.EOF when the stream ends
// cleanly between queries, io.ErrUnexpectedEOF when it ends inside one, a
// *ProtocolError for a malformed query, or the reader's error.
func (d *Decoder) Next() (Query, error) {
	d.op = OpInvalid
	d.budget = d.lim.MaxQueryBytes
	if d.first {
		head, err := d.r.Peek(1)
		if err != nil {
			return Query{}, err
		}
		if head[0] == 0 {
			head, err = d.r.Peek(5)
			if err != nil {
				return Query{}, eofUnexpected(err)
			}
			if binary.LittleEndian.Uint32(head[1:5]) == ValidationMagic {
				_, _ = d.r.Discard(5)
				d.first = false
				d.dialect = DialectV2
				return Query{Op: OpValidate, Nonce: ValidationMagic}, nil
			}
		}
		d.first = false
		d.dialect = DialectLegacy
	}
	b, err := d.r.ReadByte()
	if err != nil {
		return Query{}, err // io.EOF here is a clean end
	}
	table := legacyOps
	if d.dialect == DialectV2 {
		table = v2Ops
	}
	if int(b) >= len(table) {
		return Query{}, d.errf("unknown query type %d", b)
	}
	q := Query{Op: table[b]}
	d.op = q.Op
	switch q.Op {
	case OpValidate:
		return Query{}, d.errf("VALIDATE after the connection's first query")
	case OpSet, OpAppend, OpQueuePush:
		if q.Key, err = d.key(); err != nil {
			return Query{}, err
		}
		q.Value, err = d.value()
	case OpCompareSet:
		if q.Key, err = d.key(); err != nil {
			return Query{}, err
		}
		if q.Expected, err = d.value(); err != nil {
			return Query{}, err
		}
		q.Desired, err = d.value()
	case OpGet, OpWatchKey, OpDeleteKey, OpQueuePop, OpQueueLen:
		q.Key, err = d.key()
	case OpAdd:
		if q.Key, err = d.key(); err != nil {
			return Query{}, err
		}
		var v uint64
		v, err = d.u64()
		q.Delta = int64(v)
	case OpCheck, OpWait, OpMultiGet:
		q.Keys, err = d.keys()
	case OpMultiSet:
		var n int
		if n, err = d.count(); err != nil {
			return Query{}, err
		}
		q.Keys = make([]string, 0, min(n, 1024))
		q.Values = make([][]byte, 0, min(n, 1024))
		for range n {
			var k string
			var v []byte
			if k, err = d.key(); err != nil {
				return Query{}, err
			}
			if v, err = d.value(); err != nil {
				return Query{}, err
			}
			q.Keys = append(q.Keys, k)
			q.Values = append(q.Values, v)
		}
	case OpGetNumKeys, OpCancelWait:
	case OpPing:
		q.Nonce, err = d.u32()
	default:
		return Query{}, d.errf("unsupported query type %d", b)
	}
	if err != nil {
		return Query{}, err
	}
	return q, nil
}

func eofUnexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

func (d *Decoder) u64() (uint64, error) {
	var buf [8]byte
	if _, err := io.ReadFull(d.r, buf[:]); err != nil {
		return 0, eofUnexpected(err)
	}
	return binary.LittleEndian.Uint64(buf[:]), nil
}

func (d *Decoder) u32() (uint32, error) {
	var buf [4]byte
	if _, err := io.ReadFull(d.r, buf[:]); err != nil {
		return 0, eofUnexpected(err)
	}
	return binary.LittleEndian.Uint32(buf[:]), nil
}

func (d *Decoder) count() (int, error) {
	n, err := d.u64()
	if err != nil {
		return 0, err
	}
	if n > uint64(d.lim.MaxKeysPerQuery) {
		return 0, d.errf("%d keys in one query, limit %d", n, d.lim.MaxKeysPerQuery)
	}
	return int(n), nil
}

func (d *Decoder) keys() ([]string, error) {
	n, err := d.count()
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, min(n, 1024))
	for range n {
		k, err := d.key()
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func (d *Decoder) key() (string, error) {
	b, err := d.bytes(d.lim.MaxKeyLen, "key")
	return string(b), err
}

func (d *Decoder) value() ([]byte, error) {
	return d.bytes(d.lim.MaxValueLen, "value")
}

// bytes reads a uint64 length and that many bytes. Memory grows with the
// bytes that actually arrive, not with the length announced.
func (d *Decoder) bytes(limit int, what string) ([]byte, error) {
	n, err := d.u64()
	if err != nil {
		return nil, err
	}
	if n > uint64(limit) {
		return nil, d.errf("%s of %d bytes, limit %d", what, n, limit)
	}
	if int64(n) > d.budget {
		return nil, d.errf("query larger than %d bytes", d.lim.MaxQueryBytes)
	}
	d.budget -= int64(n)
	const chunk = 64 << 10
	buf := make([]byte, min(int(n), chunk))
	if _, err := io.ReadFull(d.r, buf); err != nil {
		return nil, eofUnexpected(err)
	}
	for len(buf) < int(n) {
		m := min(int(n)-len(buf), max(len(buf), chunk))
		start := len(buf)
		buf = append(buf, make([]byte, m)...)
		if _, err := io.ReadFull(d.r, buf[start:]); err != nil {
			return nil, eofUnexpected(err)
		}
	}
	return buf, nil
}

// Reply encoding helpers (little-endian, as torch's native-endian sends on
// every platform it supports).

func appendU64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }

func appendBytes(b []byte, v []byte) []byte {
	b = appendU64(b, uint64(len(v)))
	return append(b, v...)
}

func appendString(b []byte, v string) []byte {
	b = appendU64(b, uint64(len(v)))
	return append(b, v...)
}

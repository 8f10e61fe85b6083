package c10dstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"
	"testing/iotest"
)

type frame []byte

func (f frame) u8(b byte) frame    { return append(f, b) }
func (f frame) u32(v uint32) frame { return binary.LittleEndian.AppendUint32(f, v) }
func (f frame) u64(v uint64) frame { return binary.LittleEndian.AppendUint64(f, v) }
func (f frame) str(s string) frame { return append(f.u64(uint64(len(s))), s...) }

// handshake returns a new frame holding the v2 VALIDATE query.
func handshake() frame { return frame{}.u8(0).u32(ValidationMagic) }

func TestDecoderTable(t *testing.T) {
	validate := Query{Op: OpValidate, Nonce: ValidationMagic}
	cases := []struct {
		name    string
		in      frame
		dialect Dialect
		want    []Query
		err     error // after the queries in want; nil means a clean io.EOF
		perr    bool  // the error is a *ProtocolError
	}{
		{name: "empty stream", in: frame{}, dialect: DialectUnknown},
		{name: "v2 handshake only", in: handshake(), dialect: DialectV2, want: []Query{validate}},
		{
			name: "v2 every query",
			in: handshake().
				u8(v2Ping).u32(1234).
				u8(v2Set).str("/k").str("v").
				u8(v2CompareSet).str("/k").str("v").str("w").
				u8(v2Get).str("/k").
				u8(v2Add).str("/n").u64(uint64(0xFFFFFFFFFFFFFFFF)).
				u8(v2Check).u64(2).str("/a").str("/b").
				u8(v2Wait).u64(1).str("/a").
				u8(v2GetNumKeys).
				u8(v2DeleteKey).str("/k").
				u8(v2Append).str("/l").str("xy").
				u8(v2MultiGet).u64(2).str("/a").str("/b").
				u8(v2MultiSet).u64(2).str("/a").str("1").str("/b").str("").
				u8(v2CancelWait).
				u8(v2QueuePush).str("/q").str("item").
				u8(v2QueuePop).str("/q").
				u8(v2QueueLen).str("/q"),
			dialect: DialectV2,
			want: []Query{
				validate,
				{Op: OpPing, Nonce: 1234},
				{Op: OpSet, Key: "/k", Value: []byte("v")},
				{Op: OpCompareSet, Key: "/k", Expected: []byte("v"), Desired: []byte("w")},
				{Op: OpGet, Key: "/k"},
				{Op: OpAdd, Key: "/n", Delta: -1},
				{Op: OpCheck, Keys: []string{"/a", "/b"}},
				{Op: OpWait, Keys: []string{"/a"}},
				{Op: OpGetNumKeys},
				{Op: OpDeleteKey, Key: "/k"},
				{Op: OpAppend, Key: "/l", Value: []byte("xy")},
				{Op: OpMultiGet, Keys: []string{"/a", "/b"}},
				{Op: OpMultiSet, Keys: []string{"/a", "/b"}, Values: [][]byte{[]byte("1"), {}}},
				{Op: OpCancelWait},
				{Op: OpQueuePush, Key: "/q", Value: []byte("item")},
				{Op: OpQueuePop, Key: "/q"},
				{Op: OpQueueLen, Key: "/q"},
			},
		},
		{
			name: "legacy every query (torch 1.13 + 2.0/2.1)",
			in: frame{}.
				u8(l1Add).str("init/").u64(1).
				u8(l1Set).str("/k").str("v").
				u8(l1CompareSet).str("/k").str("").str("w").
				u8(l1Get).str("/k").
				u8(l1Check).u64(1).str("/k").
				u8(l1Wait).u64(0).
				u8(l1GetNumKeys).
				u8(l1WatchKey).str("/k").
				u8(l1DeleteKey).str("/k").
				u8(l1Append).str("/l").str("z").
				u8(l1MultiGet).u64(1).str("/l").
				u8(l1MultiSet).u64(1).str("/m").str("1").
				u8(l1CancelWait),
			dialect: DialectLegacy,
			want: []Query{
				{Op: OpAdd, Key: "init/", Delta: 1},
				{Op: OpSet, Key: "/k", Value: []byte("v")},
				{Op: OpCompareSet, Key: "/k", Expected: []byte{}, Desired: []byte("w")},
				{Op: OpGet, Key: "/k"},
				{Op: OpCheck, Keys: []string{"/k"}},
				{Op: OpWait, Keys: []string{}},
				{Op: OpGetNumKeys},
				{Op: OpWatchKey, Key: "/k"},
				{Op: OpDeleteKey, Key: "/k"},
				{Op: OpAppend, Key: "/l", Value: []byte("z")},
				{Op: OpMultiGet, Keys: []string{"/l"}},
				{Op: OpMultiSet, Keys: []string{"/m"}, Values: [][]byte{[]byte("1")}},
				{Op: OpCancelWait},
			},
		},
		{
			name:    "legacy SET first with an empty key is not a handshake",
			in:      frame{}.u8(l1Set).str("").str("v"),
			dialect: DialectLegacy,
			want:    []Query{{Op: OpSet, Key: "", Value: []byte("v")}},
		},
		{
			name: "wrong magic is a legacy SET with an absurd key length", dialect: DialectLegacy,
			in: frame{}.u8(0).u32(0xDEADBEEF).u32(0xFFFFFFFF), perr: true,
		},
		{name: "unknown legacy query", in: frame{}.u8(13), dialect: DialectLegacy, perr: true},
		{name: "PING is not legacy", in: frame{}.u8(l1Set).str("k").str("v").u8(v2Ping).u32(1),
			dialect: DialectLegacy, want: []Query{{Op: OpSet, Key: "k", Value: []byte("v")}}, perr: true},
		{name: "WATCH_KEY byte is GETNUMKEYS in v2", in: handshake().u8(7), dialect: DialectV2,
			want: []Query{validate, {Op: OpGetNumKeys}}},
		{name: "unknown v2 query", in: handshake().u8(17), dialect: DialectV2, want: []Query{validate}, perr: true},
		{name: "second VALIDATE", in: handshake().u8(0).u32(ValidationMagic), dialect: DialectV2,
			want: []Query{validate}, perr: true},
		{name: "key too long", in: frame{}.u8(l1Get).u64(65), dialect: DialectLegacy, perr: true},
		{name: "value too long", in: frame{}.u8(l1Set).str("k").u64(129), dialect: DialectLegacy, perr: true},
		{name: "too many keys", in: frame{}.u8(l1Wait).u64(9), dialect: DialectLegacy, perr: true},
		{name: "negative multi_set count", in: handshake().u8(v2MultiSet).u64(1 << 63), dialect: DialectV2,
			want: []Query{validate}, perr: true},
		{name: "query over the byte budget", dialect: DialectLegacy, perr: true,
			in: frame{}.u8(l1MultiSet).u64(3).str("a").str(string(make([]byte, 128))).
				str("b").str(string(make([]byte, 128))).str("c").str(string(make([]byte, 128)))},
		{name: "truncated handshake", in: frame{0, 0xCE}, dialect: DialectUnknown, err: io.ErrUnexpectedEOF},
		{name: "truncated query byte stream", in: handshake().u8(v2Set).u8(3), dialect: DialectV2,
			want: []Query{validate}, err: io.ErrUnexpectedEOF},
		{name: "truncated value", in: frame{}.u8(l1Set).str("k").u64(10).u8('x'), dialect: DialectLegacy,
			err: io.ErrUnexpectedEOF},
		{name: "truncated ping", in: handshake().u8(v2Ping).u8(1), dialect: DialectV2,
			want: []Query{validate}, err: io.ErrUnexpectedEOF},
	}
	lim := Limits{MaxKeyLen: 64, MaxValueLen: 128, MaxKeysPerQuery: 8, MaxQueryBytes: 300}
	for _, tc := range cases {
		for _, mode := range []string{"whole", "one byte at a time"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				var r io.Reader = bytes.NewReader(tc.in)
				if mode != "whole" {
					r = iotest.OneByteReader(r)
				}
				d := NewDecoder(r, lim)
				var got []Query
				var err error
				for {
					var q Query
					if q, err = d.Next(); err != nil {
						break
					}
					got = append(got, q)
				}
				if !reflect.DeepEqual(got, tc.want) {
					t.Errorf("queries:\n got %+v\nwant %+v", got, tc.want)
				}
				var pe *ProtocolError
				switch {
				case tc.perr:
					if !errors.As(err, &pe) {
						t.Errorf("error %v, want a *ProtocolError", err)
					}
				case tc.err != nil:
					if !errors.Is(err, tc.err) {
						t.Errorf("error %v, want %v", err, tc.err)
					}
				default:
					if err != io.EOF {
						t.Errorf("error %v, want io.EOF", err)
					}
				}
				if d.Dialect() != tc.dialect {
					t.Errorf("dialect %s, want %s", d.Dialect(), tc.dialect)
				}
			})
		}
	}
}

func TestWireByte(t *testing.T) {
	for _, tc := range []struct {
		d    Dialect
		op   Op
		want byte
		ok   bool
	}{
		{DialectLegacy, OpSet, 0, true},
		{DialectLegacy, OpWatchKey, 7, true},
		{DialectLegacy, OpDeleteKey, 8, true},
		{DialectLegacy, OpCancelWait, 12, true},
		{DialectLegacy, OpPing, 0, false},
		{DialectV2, OpValidate, 0, true},
		{DialectV2, OpSet, 1, true},
		{DialectV2, OpDeleteKey, 8, true},
		{DialectV2, OpPing, 13, true},
		{DialectV2, OpQueueLen, 16, true},
		{DialectV2, OpWatchKey, 0, false},
		{DialectUnknown, OpSet, 0, false},
	} {
		got, ok := WireByte(tc.d, tc.op)
		if got != tc.want || ok != tc.ok {
			t.Errorf("WireByte(%s, %s) = %d %v, want %d %v", tc.d, tc.op, got, ok, tc.want, tc.ok)
		}
	}
}

func TestStoll(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"42", 42, true}, {"-7", -7, true}, {"  +3", 3, true}, {"12abc", 12, true},
		{"", 0, false}, {"abc", 0, false}, {"-", 0, false},
		{"9223372036854775807", 1<<63 - 1, true}, {"9223372036854775808", 0, false},
	} {
		got, err := stoll([]byte(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("stoll(%q) = %d, %v", tc.in, got, err)
		}
	}
}

// FuzzDecoder: arbitrary bytes never panic the decoder and never make it
// allocate beyond its limits.
func FuzzDecoder(f *testing.F) {
	f.Add([]byte(handshake().u8(v2Set).str("k").str("v")))
	f.Add([]byte(frame{}.u8(l1Wait).u64(2).str("a").str("b")))
	f.Add([]byte(handshake().u8(v2MultiSet).u64(1).str("a").str("b")))
	f.Add([]byte{0, 0xCE, 0xF7, 0x85, 0x3C, 13, 1, 2, 3, 4})
	f.Fuzz(func(t *testing.T, in []byte) {
		d := NewDecoder(bytes.NewReader(in), Limits{MaxKeyLen: 256, MaxValueLen: 1024, MaxKeysPerQuery: 16, MaxQueryBytes: 4096})
		for range 1000 {
			q, err := d.Next()
			if err != nil {
				return
			}
			if len(q.Key) > 256 || len(q.Value) > 1024 || len(q.Keys) > 16 {
				t.Fatalf("limits exceeded: %+v", q)
			}
		}
	})
}

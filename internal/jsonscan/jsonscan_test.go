package jsonscan

import (
	"encoding/binary"
	"encoding/json"
	"testing"
)

// special8 finds a quote, a backslash or a control character at any of
// the eight places, and nothing else (other bytes around it included).
func TestSpecial8(t *testing.T) {
	for _, fill := range []byte{'a', 0x7f, 0xff, 0x20, 0x21} {
		for b := range 256 {
			for p := range 8 {
				var buf [8]byte
				for i := range buf {
					buf[i] = fill
				}
				buf[p] = byte(b)
				want := b == '"' || b == '\\' || b < 0x20
				if got := special8(binary.LittleEndian.Uint64(buf[:])); got != want {
					t.Fatalf("byte %#x at %d among %#x: %v, want %v", b, p, fill, got, want)
				}
			}
		}
	}
}

// Members takes only a valid JSON object, and hands f each member's name
// and raw value in order, as encoding/json reads them.
func FuzzMembers(f *testing.F) {
	for _, s := range []string{
		`{}`, ` { "a" : 1 , "b" : [true, null, {"c": "d\u00e9"}] } `, `{"a":1,}`, `{"a":01}`, `[1]`,
		`{"a":"x"} x`, `{"a\"b":-1.5e+3}`, "{\"a\":\"\x01\"}", `{"a":{"b":{"c":[]}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		var names []string
		var raws []json.RawMessage
		err := Members(v, func(name, raw []byte) error {
			names = append(names, string(name))
			raws = append(raws, append(json.RawMessage(nil), raw...))
			return nil
		})
		if err != nil {
			return // encoding/json decides
		}
		var obj map[string]json.RawMessage
		if jerr := json.Unmarshal(v, &obj); jerr != nil {
			t.Fatalf("Members took %q, which encoding/json refuses: %v", v, jerr)
		}
		for i, raw := range raws {
			if !json.Valid(raw) {
				t.Errorf("%q: member %q's raw value %q is not a JSON value", v, names[i], raw)
			}
		}
		if len(obj) > len(names) {
			t.Errorf("%q: Members saw %d members, encoding/json %d", v, len(names), len(obj))
		}
	})
}

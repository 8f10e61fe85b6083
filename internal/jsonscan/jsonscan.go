// Package jsonscan is a lean reader of JSON objects: it steps over an
// object's members without decoding them, hands each member's raw value to
// the caller, and reads plain strings, integers, booleans and string lists
// in place, without reflection.
//
// It exists for speed: elasticctl's listings at 10,000 jobs decode every
// job's records, and encoding/json's reflection was most of that time. The
// reader takes only the common, plain form of a value; for anything unusual
// (an escape in a member name, a fraction where an integer is read, a
// value of another type, syntax it does not accept) it returns
// ErrFallback, and the caller decodes the whole record with encoding/json,
// which then decides (and words any problem). It checks the syntax of
// everything it steps over, so it never accepts a document encoding/json
// refuses as invalid.
package jsonscan

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrFallback says the lean reader leaves this value to encoding/json: it is
// unusual or malformed.
var ErrFallback = errors.New("not for the lean reader")

// NotFolded is for the member names a reader skips: it is ErrFallback
// when name is one of the fields it reads, spelt in other case
// (encoding/json matches names case-insensitively, so such a record must be
// left to it), else nil.
func NotFolded(name []byte, fields ...string) error {
	for _, f := range fields {
		if len(name) == len(f) && strings.EqualFold(string(name), f) {
			return ErrFallback
		}
	}
	return nil
}

// String reads the JSON string raw into *s, leaving *s as it is for null.
// A string with an escape (or with bytes that are not UTF-8) is decoded by
// encoding/json; any other value is ErrFallback.
func String(raw []byte, s *string) error {
	if raw[0] != '"' {
		if string(raw) == "null" {
			return nil
		}
		return ErrFallback
	}
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '\\') >= 0 || !utf8.Valid(in) {
		return JSON(raw, s)
	}
	*s = string(in)
	return nil
}

// Int reads the JSON integer raw into *n, leaving *n as it is for null.
// Anything strconv.Atoi does not take (a fraction, an exponent, a value
// out of range, a string) is ErrFallback.
func Int(raw []byte, n *int) error {
	if string(raw) == "null" {
		return nil
	}
	x, err := strconv.Atoi(string(raw))
	if err != nil {
		return ErrFallback
	}
	*n = x
	return nil
}

// Bool reads the JSON boolean raw into *b, leaving *b as it is for null;
// any other value is ErrFallback.
func Bool(raw []byte, b *bool) error {
	switch string(raw) {
	case "true":
		*b = true
	case "false":
		*b = false
	case "null":
	default:
		return ErrFallback
	}
	return nil
}

// Strings reads the JSON array of strings raw into *out (nil for null, an
// empty slice for []); an element that is not a string is ErrFallback.
func Strings(raw []byte, out *[]string) error {
	if string(raw) == "null" {
		*out = nil
		return nil
	}
	if raw[0] != '[' {
		return ErrFallback
	}
	var list []string
	i := skipSpace(raw, 1)
	if raw[i] == ']' {
		*out = []string{}
		return nil
	}
	for {
		end, err := skipValue(raw, i, 0)
		if err != nil {
			return ErrFallback
		}
		var s string
		if raw[i] != '"' {
			return ErrFallback
		}
		if err := String(raw[i:end], &s); err != nil {
			return err
		}
		list = append(list, s)
		i = skipSpace(raw, end)
		if raw[i] == ']' {
			*out = list
			return nil
		}
		i = skipSpace(raw, i+1) // a ','
	}
}

// JSON decodes a rare value (an escaped string, a nested object) with
// encoding/json; its errors are ErrFallback.
func JSON(raw []byte, x any) error {
	if err := json.Unmarshal(raw, x); err != nil {
		return ErrFallback
	}
	return nil
}

// Members calls f with the name and raw value of each member of the JSON
// object v, in order, checking v's syntax as it goes: the values f does
// not decode are only stepped over. An error of f ends it.
func Members(v []byte, f func(name, raw []byte) error) error {
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '{' {
		return ErrFallback
	}
	i = skipSpace(v, i+1)
	if i < len(v) && v[i] == '}' {
		return atEnd(v, i+1)
	}
	for {
		if i >= len(v) || v[i] != '"' {
			return ErrFallback
		}
		end, err := skipString(v, i)
		if err != nil {
			return err
		}
		name := v[i+1 : end-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			return ErrFallback
		}
		i = skipSpace(v, end)
		if i >= len(v) || v[i] != ':' {
			return ErrFallback
		}
		i = skipSpace(v, i+1)
		start := i
		if i, err = skipValue(v, i, 0); err != nil {
			return err
		}
		if err := f(name, v[start:i]); err != nil {
			return err
		}
		i = skipSpace(v, i)
		switch {
		case i < len(v) && v[i] == ',':
			i = skipSpace(v, i+1)
		case i < len(v) && v[i] == '}':
			return atEnd(v, i+1)
		default:
			return ErrFallback
		}
	}
}

// atEnd checks that only white space follows v[i:].
func atEnd(v []byte, i int) error {
	if skipSpace(v, i) != len(v) {
		return ErrFallback
	}
	return nil
}

// skipSpace returns the index of the first byte of v[i:] that is not JSON
// white space (len(v) if none).
func skipSpace(v []byte, i int) int {
	for i < len(v) && (v[i] == ' ' || v[i] == '\t' || v[i] == '\n' || v[i] == '\r') {
		i++
	}
	return i
}

// skipString steps over the string starting at v[i] (a '"'), returning
// the index after its closing quote. Runs of eight plain bytes are stepped
// over at once.
func skipString(v []byte, i int) (int, error) {
	i++
	for {
		for i+8 <= len(v) && !special8(binary.LittleEndian.Uint64(v[i:])) {
			i += 8
		}
		if i >= len(v) {
			return 0, ErrFallback
		}
		switch c := v[i]; {
		case c == '"':
			return i + 1, nil
		case c == '\\':
			if i+1 >= len(v) {
				return 0, ErrFallback
			}
			switch v[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(v) {
					return 0, ErrFallback
				}
				for _, h := range v[i+2 : i+6] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return 0, ErrFallback
					}
				}
				i += 6
			default:
				return 0, ErrFallback
			}
		case c < 0x20:
			return 0, ErrFallback
		default:
			i++
		}
	}
}

// special8 says whether any of the eight bytes of x is a '"', a '\\' or
// a control character (below 0x20): the bytes a string scan stops at.
func special8(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(y uint64) uint64 { return (y - ones) & ^y & highs }
	return (x-0x20*ones)&^x&highs|zero(x^'"'*ones)|zero(x^'\\'*ones) != 0
}

// skipValue steps over the JSON value starting at v[i], returning the
// index after it.
func skipValue(v []byte, i, depth int) (int, error) {
	if i >= len(v) || depth > 1000 {
		return 0, ErrFallback
	}
	switch c := v[i]; {
	case c == '"':
		return skipString(v, i)
	case c == '{' || c == '[':
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		i = skipSpace(v, i+1)
		if i < len(v) && v[i] == closing {
			return i + 1, nil
		}
		for {
			if c == '{' {
				if i >= len(v) || v[i] != '"' {
					return 0, ErrFallback
				}
				end, err := skipString(v, i)
				if err != nil {
					return 0, err
				}
				i = skipSpace(v, end)
				if i >= len(v) || v[i] != ':' {
					return 0, ErrFallback
				}
				i = skipSpace(v, i+1)
			}
			end, err := skipValue(v, i, depth+1)
			if err != nil {
				return 0, err
			}
			i = skipSpace(v, end)
			switch {
			case i < len(v) && v[i] == ',':
				i = skipSpace(v, i+1)
			case i < len(v) && v[i] == closing:
				return i + 1, nil
			default:
				return 0, ErrFallback
			}
		}
	case c == '-' || '0' <= c && c <= '9':
		return skipNumber(v, i)
	}
	for _, lit := range []string{"true", "false", "null"} {
		if bytes.HasPrefix(v[i:], []byte(lit)) {
			return i + len(lit), nil
		}
	}
	return 0, ErrFallback
}

// skipNumber steps over a JSON number (RFC 8259's grammar).
func skipNumber(v []byte, i int) (int, error) {
	digits := func() int {
		n := 0
		for i < len(v) && '0' <= v[i] && v[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if v[i] == '-' {
		i++
	}
	switch {
	case i < len(v) && v[i] == '0':
		i++
	case digits() == 0:
		return 0, ErrFallback
	}
	if i < len(v) && v[i] == '.' {
		i++
		if digits() == 0 {
			return 0, ErrFallback
		}
	}
	if i < len(v) && (v[i] == 'e' || v[i] == 'E') {
		i++
		if i < len(v) && (v[i] == '+' || v[i] == '-') {
			i++
		}
		if digits() == 0 {
			return 0, ErrFallback
		}
	}
	return i, nil
}

package syncbuf

import (
	"strings"
	"testing"
)

func TestBoundedBufferKeepsTheTail(t *testing.T) {
	const limit = 1 << 20
	b := Buffer{Limit: limit}
	b.Write([]byte("hello "))
	b.Write([]byte("world"))
	if got := b.Tail(5); got != "world" {
		t.Errorf("Tail(5) = %q, want world", got)
	}
	if got := b.Tail(100); got != "hello world" {
		t.Errorf("Tail(100) = %q, want all of it", got)
	}
	line := []byte(strings.Repeat("x", 1023) + "\n")
	for range 2 * limit / len(line) {
		b.Write(line)
	}
	if n := len(b.String()); n > limit+len(line) {
		t.Errorf("holds %d bytes after writing %d, want at most %d", n, 2*limit, limit+len(line))
	}
	var u Buffer
	for range 2 * limit / len(line) {
		u.Write(line)
	}
	if n := len(u.String()); n != 2*limit/len(line)*len(line) {
		t.Errorf("an unbounded buffer holds %d bytes, want all %d", n, 2*limit/len(line)*len(line))
	}
}

package testutil

import (
	"strings"
	"testing"
)

func TestLogBufferKeepsTheTailAndStaysBounded(t *testing.T) {
	var b LogBuffer
	b.Write([]byte("hello "))
	b.Write([]byte("world"))
	if got := b.Tail(5); got != "world" {
		t.Errorf("Tail(5) = %q, want world", got)
	}
	if got := b.Tail(100); got != "hello world" {
		t.Errorf("Tail(100) = %q, want all of it", got)
	}
	line := []byte(strings.Repeat("x", 1023) + "\n")
	for range 2 * maxLog / len(line) {
		b.Write(line)
	}
	if n := len(b.Tail(1 << 30)); n > maxLog+len(line) {
		t.Errorf("holds %d bytes after writing %d, want at most %d", n, 2*maxLog, maxLog+len(line))
	}
}

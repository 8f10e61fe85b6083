package testutil

import (
	"bytes"
	"sync"
)

// maxLog is how much a LogBuffer holds before it starts over.
const maxLog = 4 << 20

// LogBuffer collects a daemon's output (a kube-apiserver's, a Jaeger's)
// for a test's failure message: safe for concurrent use, and bounded, so
// that a chatty daemon of a long test does not hold its whole output: past
// 4 MiB it starts over.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b.Len() > maxLog {
		b.b.Reset()
	}
	return b.b.Write(p)
}

// Tail is the last n bytes written (all, when fewer).
func (b *LogBuffer) Tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.b.String()
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

// Package syncbuf is a bytes.Buffer safe for concurrent writers and readers,
// for capturing the output of processes and goroutines in tests.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a mutex-guarded bytes.Buffer. With Limit set it is bounded:
// a write past Limit bytes starts it over, so a chatty daemon of a long
// test (a kube-apiserver, a Jaeger) does not hold its whole output.
type Buffer struct {
	// Limit bounds what the buffer holds (0: unbounded).
	Limit int

	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Limit > 0 && s.b.Len() > s.Limit {
		s.b.Reset()
	}
	return s.b.Write(p)
}

// String returns the contents so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Tail is the last n bytes held (all, when fewer).
func (s *Buffer) Tail(n int) string {
	str := s.String()
	if len(str) > n {
		str = str[len(str)-n:]
	}
	return str
}

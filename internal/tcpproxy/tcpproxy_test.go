package tcpproxy

import (
	"bufio"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

func echoServer(t *testing.T) (string, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String(), func() { ln.Close(); <-done }
}

func roundTrip(t *testing.T, c net.Conn, msg string) error {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(got) != msg {
		t.Fatalf("echo: got %q want %q", got, msg)
	}
	return nil
}

func TestForwardCutRestore(t *testing.T) {
	before := runtime.NumGoroutine()
	target, stop := echoServer(t)
	defer stop()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(t, c, "hello"); err != nil {
		t.Fatalf("through proxy: %v", err)
	}

	p.Cut()
	// The established connection is dropped...
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read on a cut connection succeeded")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("cut connection was not closed (read timed out)")
	}
	// ...and new ones are refused.
	if c2, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second); err == nil {
		c2.Close()
		t.Fatal("dial through a cut proxy succeeded")
	}

	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(t, c3, "again"); err != nil {
		t.Fatalf("after restore: %v", err)
	}
	c3.Close()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	stop()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines leaked: %d > %d\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

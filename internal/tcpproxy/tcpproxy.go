// Package tcpproxy is a tiny TCP forwarder for tests that need to partition
// a client from a server: Cut drops every connection and refuses new ones,
// Restore lets connections through again.
package tcpproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// Proxy forwards connections accepted on a loopback port to a target.
type Proxy struct {
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	cut   bool
	done  bool
	wg    sync.WaitGroup
}

// New starts a proxy on a free loopback port that forwards to target
// ("host:port").
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tcpproxy: listen: %w", err)
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	return p, nil
}

// Addr is the proxy's "host:port".
func (p *Proxy) Addr() string { return p.addr }

func (p *Proxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.handle(c)
		}
	}()
}

func (p *Proxy) handle(c net.Conn) {
	p.mu.Lock()
	if p.cut || p.done {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.conns[c] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		defer p.forget(c)
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut || p.done {
			p.mu.Unlock()
			up.Close()
			return
		}
		p.conns[up] = struct{}{}
		p.mu.Unlock()
		defer p.forget(up)
		var cp sync.WaitGroup
		cp.Add(2)
		pipe := func(dst, src net.Conn) {
			defer cp.Done()
			_, _ = io.Copy(dst, src)
			// Either direction ending tears the pair down.
			dst.Close()
			src.Close()
		}
		go pipe(up, c)
		go pipe(c, up)
		cp.Wait()
	}()
}

func (p *Proxy) forget(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// Cut closes every forwarded connection and refuses new ones (the port
// stops listening, so dials fail at once with "connection refused").
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.done {
		return
	}
	p.cut = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
}

// Restore listens again on the same port after Cut.
func (p *Proxy) Restore() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return errors.New("tcpproxy: closed")
	}
	if !p.cut {
		return nil
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("tcpproxy: listen again on %s: %w", p.addr, err)
	}
	p.cut = false
	p.serve(ln)
	return nil
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if !p.done {
		p.done = true
		p.ln.Close()
		for c := range p.conns {
			c.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

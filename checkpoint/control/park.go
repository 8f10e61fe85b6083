package control

import (
	"fmt"
	"net"
	"syscall"
)

type parkedWorker struct {
	rank  int
	step  int64
	reply chan Assignment // buffered (1)
}

// park holds a believed ReportReconfigure until Release answers it, the
// worker hangs up (it died) or the channel closes.
func (c *Channel) park(conn *net.UnixConn, r Report) {
	pgid, err := syscall.Getpgid(r.PeerPID)
	if err != nil || pgid <= 1 {
		c.reply(conn, ack{Error: fmt.Sprintf("%v: cannot tell the process group of process %d", ErrStaleRound, r.PeerPID)})
		return
	}
	p := &parkedWorker{rank: r.Rank, step: r.Step, reply: make(chan Assignment, 1)}
	c.mu.Lock()
	if w, ok := c.workers[pgid]; ok {
		p.rank = w
	} else if _, ok := c.prewarm[pgid]; ok {
		p.rank = -1
	}
	c.parked[pgid] = p
	c.parkedChangedLocked()
	c.mu.Unlock()
	c.log.Debug("worker waits for its next assignment", "pgid", pgid, "rank", p.rank, "step", r.Step)
	gone := make(chan struct{})
	go func() {
		// The worker sends nothing more: a read returns when it hangs up.
		var b [1]byte
		conn.Read(b[:])
		close(gone)
	}()
	var a Assignment
	answered := false
	select {
	case a = <-p.reply:
		answered = true
	case <-gone:
	case <-c.done:
	}
	c.mu.Lock()
	if c.parked[pgid] == p {
		delete(c.parked, pgid)
		c.parkedChangedLocked()
	}
	c.mu.Unlock()
	if answered {
		c.reply(conn, ack{OK: true, Assignment: &a})
	}
}

func (c *Channel) parkedChangedLocked() {
	close(c.parkedCh)
	c.parkedCh = make(chan struct{})
}

// Parked returns the process groups of the workers waiting for their next
// assignment, each with the rank it held when it asked (-1: started ahead
// of its round, AdmitPrewarmed), and a channel
// closed when that set changes.
func (c *Channel) Parked() (map[int]int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int]int, len(c.parked))
	for pgid, p := range c.parked {
		out[pgid] = p.rank
	}
	return out, c.parkedCh
}

// Release answers the parked workers named in by (process group ->
// assignment) and returns how many it answered; a worker not parked (any
// more) is skipped. Admit a worker for its new round (SetRound, Admit)
// before releasing it, so that its first report is believed.
func (c *Channel) Release(by map[int]Assignment) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for pgid, a := range by {
		p, ok := c.parked[pgid]
		if !ok {
			continue
		}
		delete(c.parked, pgid)
		p.reply <- a
		n++
	}
	if n > 0 {
		c.parkedChangedLocked()
	}
	return n
}

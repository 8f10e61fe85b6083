package control

import (
	"sort"
	"time"
)

// Environment variables of the hang detection (hyperpodrun --hang-timeout),
// set by the agent only when it watches the workers' progress.
const (
	// EnvHangTimeout is the agent's --hang-timeout in seconds; unset or 0:
	// the workers send no heartbeats.
	EnvHangTimeout = "HYPERPODRUN_HANG_TIMEOUT"
	// EnvHeartbeatInterval is the least time in seconds between two
	// heartbeats of one worker (the Python helper's throttle).
	EnvHeartbeatInterval = "HYPERPODRUN_HEARTBEAT_INTERVAL"
	// EnvStacksDir is the directory in which a worker's Python helper opens
	// its stack dump file (in the run's log directory).
	EnvStacksDir = "HYPERPODRUN_STACKS_DIR"
	// EnvStacksSignal is the signal on which the helper's faulthandler
	// writes every thread's Python stack to that file.
	EnvStacksSignal = "HYPERPODRUN_STACKS_SIGNAL"
)

// Heartbeat is what the channel knows of one worker's progress in the
// current round: its first and last heartbeat.
type Heartbeat struct {
	// Rank is the worker's global rank (as admitted, else as reported).
	Rank int
	// PID is the process that sent the heartbeats (SO_PEERCRED).
	PID int
	// First and Last are when the first and the last heartbeat arrived.
	First, Last time.Time
	// Count is the number of heartbeats received.
	Count int
	// Stacks is the worker's stack dump file ("" if it has none).
	Stacks string
}

// beat records a believed ReportHeartbeat.
func (c *Channel) beat(r Report) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.beats == nil {
		c.beats = make(map[int]*Heartbeat)
	}
	h, ok := c.beats[r.PeerPID]
	if !ok {
		h = &Heartbeat{PID: r.PeerPID, First: r.Received}
		c.beats[r.PeerPID] = h
	}
	h.Rank, h.Last, h.Stacks = r.Rank, r.Received, r.Stacks
	h.Count++
}

// Heartbeats returns the heartbeats of the current round's workers, by
// rank. SetRound forgets them.
func (c *Channel) Heartbeats() []Heartbeat {
	c.mu.Lock()
	out := make([]Heartbeat, 0, len(c.beats))
	for _, h := range c.beats {
		out = append(out, *h)
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out
}

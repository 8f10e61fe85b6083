package control

import (
	"crypto/rand"
	"crypto/subtle"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// admitWait is how long a report from a process not (yet) admitted waits
// for its admission: a worker may connect before the agent has admitted
// its process group, which it does right after spawning it.
const admitWait = time.Second

// SetRound makes round the current round, with no worker admitted yet
// (Admit admits them). From the first call on, the channel believes only
// the workers of the current round: a report is refused, with an error
// wrapping ErrStaleRound, unless the process that sent it (the kernel says
// which: SO_PEERCRED) is in a process group admitted for the current round,
// and unless it names no round or the current one. An accepted report's
// Round is set to the current round. SetRound(0) makes no round current:
// every report is refused (between rounds, or once this node was fenced).
// A channel on which SetRound is never called accepts every report (the
// standalone agent's, which has no rounds).
func (c *Channel) SetRound(round int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rounds = true
	c.round = round
	if round != 0 {
		c.token = newToken()
	}
	c.announced = 0
	clear(c.workers)
	clear(c.beats)
	close(c.admitted)
	c.admitted = make(chan struct{})
}

// Admit believes the processes of process group pgid (a worker and the
// children it did not move to another group) as the worker of global rank
// rank of round, if round is the current round; otherwise it does nothing.
func (c *Channel) Admit(round int64, pgid, rank int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.rounds || round == 0 || round != c.round || pgid <= 1 {
		return
	}
	c.workers[pgid] = rank
	delete(c.prewarm, pgid)
	close(c.admitted)
	c.admitted = make(chan struct{})
}

// PrewarmEnv returns the variables that tell a worker started ahead of its
// round where the channel is; its token (a fresh one per call, replacing
// the previous) is good only for asking for a first assignment.
func (c *Channel) PrewarmEnv() map[string]string {
	env := c.Env()
	c.mu.Lock()
	c.prewarmToken = newToken()
	env[EnvControlToken] = c.prewarmToken
	c.mu.Unlock()
	return env
}

// AdmitPrewarmed believes process group pgid as a worker started ahead of
// its round (in-process resize: a joining node starts its workers before
// it registers). It holds no rank: the only report believed from it is a
// ReportReconfigure with PrewarmEnv's token, parked like a kept worker's
// (its rank in Parked is -1) until Release answers it. Admit, for a round,
// makes it an ordinary worker of that round.
func (c *Channel) AdmitPrewarmed(pgid int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pgid <= 1 {
		return
	}
	c.prewarm[pgid] = struct{}{}
	close(c.admitted)
	c.admitted = make(chan struct{})
}

// ForgetPrewarmed stops believing every process group admitted by
// AdmitPrewarmed and not admitted for a round since.
func (c *Channel) ForgetPrewarmed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.prewarm)
	c.prewarmToken = ""
}

// believePrewarmed checks a report from a prewarmed process group: only a
// request for its first assignment, with the prewarm token.
func believePrewarmed(r *Report, token string) error {
	if r.Type != ReportReconfigure {
		return fmt.Errorf("%w: process %d was started ahead of its round and holds no rank yet; only a %s request is accepted from it", ErrStaleRound, r.PeerPID, ReportReconfigure)
	}
	if token == "" || subtle.ConstantTimeCompare([]byte(r.Token), []byte(token)) != 1 {
		return fmt.Errorf("%w: the request carries no or a wrong control token (%s of the workers started ahead of their round)", ErrForged, EnvControlToken)
	}
	if r.Round != 0 {
		return fmt.Errorf("%w: a worker started ahead of its round names round %d", ErrStaleRound, r.Round)
	}
	r.Rank, r.rankSet = -1, false
	return nil
}

// believe checks that r comes from a worker of the current round and sets
// its Round. A sender not admitted yet gets admitWait to be.
func (c *Channel) believe(r *Report) error {
	deadline := time.Now().Add(admitWait)
	for {
		c.mu.Lock()
		rounds, round, changed := c.rounds, c.round, c.admitted
		pgid, err := -1, error(nil)
		if r.PeerPID > 0 {
			pgid, err = syscall.Getpgid(r.PeerPID)
		}
		rank, ok := c.workers[pgid]
		ok = ok && err == nil && pgid > 1
		_, prewarmed := c.prewarm[pgid]
		prewarmed = prewarmed && !ok && err == nil && pgid > 1
		token, ptoken := c.token, c.prewarmToken
		c.mu.Unlock()
		if prewarmed {
			return believePrewarmed(r, ptoken)
		}
		if !rounds {
			return nil
		}

		if round == 0 {
			return fmt.Errorf("%w: no round is current on this node (it is between rounds or was fenced)", ErrStaleRound)
		}
		if r.Round != 0 && r.Round != round {
			return fmt.Errorf("%w: the report is of round %d, the current round is %d", ErrStaleRound, r.Round, round)
		}
		if ok {
			if subtle.ConstantTimeCompare([]byte(r.Token), []byte(token)) != 1 {
				return fmt.Errorf("%w: the report carries no or a wrong control token (%s of the current round's workers)", ErrForged, EnvControlToken)
			}
			if r.rankSet && r.Rank != rank {
				return fmt.Errorf("%w: process %d is the worker of rank %d, and its report names rank %d", ErrForged, r.PeerPID, rank, r.Rank)
			}
			if err := c.plausible(round, r); err != nil {
				return err
			}
			r.Round = round
			return nil
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return fmt.Errorf("%w: process %d (process group %d) is not a worker of round %d", ErrStaleRound, r.PeerPID, pgid, round)
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-t.C:
		case <-c.done:
			t.Stop()
			return ErrClosed
		}
		t.Stop()
	}
}

// peerPID returns the pid of the process at the other end of conn, or 0.
func peerPID(conn *net.UnixConn) int {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0
	}
	var cred *unix.Ucred
	if err := raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cred == nil {
		return 0
	}
	return int(cred.Pid)
}

// plausible refuses a checkpoint beyond the step after which a worker of
// round said it stops (a stopping report with its step), and records that
// step from stopping reports.
func (c *Channel) plausible(round int64, r *Report) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.round != round {
		return nil // superseded meanwhile: the caller's next check refuses it
	}
	switch r.Type {
	case ReportStopping:
		if r.Step > 0 && (c.announced == 0 || r.Step < c.announced) {
			c.announced = r.Step
		}
	case ReportCheckpoint, ReportCheckpointUpdate:
		if c.announced > 0 && r.Step > c.announced {
			return fmt.Errorf("implausible %s report: step %d is beyond step %d, after which this round's workers said they stop", r.Type, r.Step, c.announced)
		}
	}
	return nil
}

// newToken returns a random control token (crypto/rand.Text: 128 bits).
func newToken() string { return rand.Text() }

// Token is the control token the current round's workers carry (Env).
func (c *Channel) Token() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.token
}

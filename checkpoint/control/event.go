package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/hyperpodrun/hyperpodrun/internal/fsutil"
)

// EventKind says why the agent is asking workers to stop.
type EventKind string

// Event kinds. Workers treat every kind the same way (checkpoint and exit 0);
// the kind is for logs and for training code that wants to act differently.
const (
	ScaleUp    EventKind = "scale_up"
	ScaleDown  EventKind = "scale_down"
	Resize     EventKind = "resize"
	Preemption EventKind = "preemption"
	Drain      EventKind = "drain"
	Shutdown   EventKind = "shutdown"
	// MemberLost is announced only to in-process workers (Event.InProcess):
	// a member of the round died or failed; the survivors leave the broken
	// process group and reconfigure.
	MemberLost EventKind = "member_lost"
)

// Event is a planned change announced to the workers.
type Event struct {
	Kind EventKind
	// NewWorldSize is the world size workers will be restarted at (0 when
	// the job is not restarted, e.g. preemption to zero).
	NewWorldSize int
	// Deadline is when the agent escalates (SIGTERM, then SIGKILL). Zero
	// means none announced.
	Deadline time.Time
	// Round is the rendezvous round being ended.
	Round int64
	// TraceParent is the W3C traceparent of the scaling event's trace.
	TraceParent string
	// Reason is a human explanation when one is known, e.g. the
	// coordinator's "preempted: team a reclaimed its nominal quota ...".
	Reason string
	// InProcess says the agent offers in-process reconfiguration for this
	// change (--inprocess-resize): the workers leave their process group
	// and send a ReportReconfigure instead of exiting, and the agent
	// answers with their next assignment (or tells them to leave).
	InProcess bool
	// Seq numbers the announcements of one Channel (1, 2, ...); set by
	// Announce.
	Seq uint64
	// AnnouncedAt is set by Announce.
	AnnouncedAt time.Time
}

// eventFile is the JSON layout of event.json. Times are given both as
// RFC 3339 and as float Unix seconds (easier to use from Python).
type eventFile struct {
	Kind            EventKind `json:"kind"`
	NewWorldSize    int       `json:"new_world_size"`
	Deadline        time.Time `json:"deadline,omitzero"`
	DeadlineUnix    float64   `json:"deadline_unix,omitempty"`
	Round           int64     `json:"round"`
	TraceParent     string    `json:"traceparent,omitempty"`
	Reason          string    `json:"reason,omitempty"`
	InProcess       bool      `json:"inprocess,omitempty"`
	Seq             uint64    `json:"seq"`
	AnnouncedAt     time.Time `json:"announced_at"`
	AnnouncedAtUnix float64   `json:"announced_at_unix"`
}

func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

// Announce atomically replaces event.json with ev. The caller sends the
// elastic signal afterwards, so that a worker woken by it finds the event.
func (c *Channel) Announce(ev Event) error {
	if ev.Kind == "" {
		return errors.New("control: announce: event kind is empty")
	}
	if ev.NewWorldSize < 0 || ev.Round < 0 {
		return fmt.Errorf("control: announce: negative world size (%d) or round (%d)", ev.NewWorldSize, ev.Round)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.seq++
	seq := c.seq
	c.mu.Unlock()
	now := time.Now()
	data, err := json.Marshal(eventFile{
		Kind:            ev.Kind,
		NewWorldSize:    ev.NewWorldSize,
		Deadline:        ev.Deadline,
		DeadlineUnix:    unixSeconds(ev.Deadline),
		Round:           ev.Round,
		TraceParent:     ev.TraceParent,
		Reason:          ev.Reason,
		InProcess:       ev.InProcess,
		Seq:             seq,
		AnnouncedAt:     now,
		AnnouncedAtUnix: unixSeconds(now),
	})
	if err != nil {
		return fmt.Errorf("control: announce: encode event: %w", err)
	}
	if err := fsutil.WriteFileAtomic(c.eventPath, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("control: announce: %w", err)
	}
	c.log.Debug("elastic event announced", "kind", ev.Kind, "new_world_size", ev.NewWorldSize, "round", ev.Round, "seq", seq)
	return nil
}

// ClearEvent removes event.json. Call it before starting the next workers.
func (c *Channel) ClearEvent() error {
	if err := os.Remove(c.eventPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("control: clear event: %w", err)
	}
	if err := fsutil.SyncDir(c.dir); err != nil {
		return fmt.Errorf("control: clear event: %w", err)
	}
	return nil
}

// ReadEvent reads an event file as written by Announce. It returns nil and
// no error when the file does not exist.
func ReadEvent(path string) (*Event, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("control: read event: %w", err)
	}
	var f eventFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("control: event file %s: malformed: %w", path, err)
	}
	if f.Kind == "" {
		return nil, fmt.Errorf("control: event file %s: malformed: missing kind", path)
	}
	return &Event{
		Kind:         f.Kind,
		NewWorldSize: f.NewWorldSize,
		Deadline:     f.Deadline,
		Round:        f.Round,
		TraceParent:  f.TraceParent,
		Reason:       f.Reason,
		InProcess:    f.InProcess,
		Seq:          f.Seq,
		AnnouncedAt:  f.AnnouncedAt,
	}, nil
}

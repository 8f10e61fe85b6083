package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// Report types sent by workers.
const (
	// ReportCheckpoint means a checkpoint is complete on every rank
	// (committed) at Step, stored at Path.
	ReportCheckpoint = "checkpoint"
	// ReportStopping means a rank saw the event and is exiting after Step.
	ReportStopping = "stopping"
	// ReportCheckpointUpdate is one rank's part of a checkpoint (HyperPod's
	// CheckpointDiscoverySocketClient.update): the step is committed once
	// every expected writer of every kind has reported it.
	ReportCheckpointUpdate = "checkpoint_update"
	// ReportReconfigure means the worker left its process group (in-process
	// resize) and waits on this connection for its next assignment; the
	// agent's answer carries it (Channel.Release). It is not given to the
	// handler.
	ReportReconfigure = "reconfigure"
	// ReportHeartbeat is a worker's progress (the Python helper sends one
	// from elastic_event_detected(), at most every HYPERPODRUN_HEARTBEAT_INTERVAL
	// seconds): the agent's hang detection (--hang-timeout) watches it. The
	// Channel records it (Heartbeats); it is not given to the handler.
	ReportHeartbeat = "heartbeat"
	// ReportCheckpointFailed means a rank could not save the checkpoint of
	// Step (Error says why: a full or read-only disk...); the step is not
	// committed.
	ReportCheckpointFailed = "checkpoint_failed"
)

// Report is one message from a worker.
type Report struct {
	Type      string `json:"type"`
	Step      int64  `json:"step"`
	Path      string `json:"path,omitempty"`
	Rank      int    `json:"rank"`
	WorldSize int    `json:"world_size,omitempty"`
	PID       int    `json:"pid,omitempty"`
	// Detected marks the stopping report the Python helper sends as soon
	// as the ranks agree on an event, before the step's checkpoint; its
	// Step is unknown (0). A rank may send a stopping report with the step
	// afterwards.
	Detected bool `json:"detected,omitempty"`
	// CheckpointType, NumModel, NumData and Nodes come with a
	// ReportCheckpointUpdate (HyperPod's CheckpointDiscoverySocketClient):
	// "model" or "data", the writers per node of each kind, and the number
	// of nodes.
	CheckpointType string `json:"checkpoint_type,omitempty"`
	NumModel       int    `json:"num_model_checkpoints,omitempty"`
	NumData        int    `json:"num_data_checkpoints,omitempty"`
	Nodes          int    `json:"nodes,omitempty"`
	// Round is the rendezvous round of the sender. A worker may name it
	// (HYPERPODRUN_ROUND); a Channel with rounds refuses a report naming
	// another round than the current one, and sets it on the reports it
	// accepts.
	Round int64 `json:"round,omitempty"`
	// Token is the sender's HYPERPODRUN_CONTROL_TOKEN; a Channel with
	// rounds refuses a report without the current round's.
	Token string `json:"token,omitempty"`
	// Stacks comes with a ReportHeartbeat: the file the worker's Python
	// stacks are written to when it gets HYPERPODRUN_STACKS_SIGNAL
	// (faulthandler), empty when it installed no such dump.
	Stacks string `json:"stacks,omitempty"`
	// Error comes with a ReportCheckpointFailed: the save's error.
	Error string `json:"error,omitempty"`
	// rankSet: the message named a rank.
	rankSet bool
	// Received is when the agent read the message.
	Received time.Time `json:"-"`
	// PeerPID is the process that sent the report, as the kernel says
	// (SO_PEERCRED); 0 when unknown.
	PeerPID int `json:"-"`
	// Raw is the message as sent, for fields this package does not know.
	Raw json.RawMessage `json:"-"`
}

// MaxStep is the largest step a report may name (2^53: exact in every
// JSON reader, and beyond any real training run).
const MaxStep = 1 << 53

// ErrForged is wrapped by the refusal of a report that does not carry the
// current round's control token, or names another rank than its sender's.
var ErrForged = errors.New("not from this job's workers")

// ParseReport decodes and validates one message line, as the Channel does
// with every line a worker sends.
func ParseReport(line []byte) (Report, error) {
	var r Report
	if err := json.Unmarshal(line, &r); err != nil {
		return Report{}, fmt.Errorf("malformed message: %w", err)
	}
	if r.Type == "" {
		return Report{}, errors.New(`malformed message: missing "type"`)
	}
	if r.Step < 0 {
		return Report{}, fmt.Errorf("malformed %s message: negative step %d", r.Type, r.Step)
	}
	if r.Step > MaxStep {
		return Report{}, fmt.Errorf("implausible %s message: step %d is beyond %d", r.Type, r.Step, int64(MaxStep))
	}
	var named struct {
		Rank *int `json:"rank"`
	}
	if json.Unmarshal(line, &named) == nil && named.Rank != nil {
		r.rankSet = true
	}
	if r.Rank < 0 || r.WorldSize < 0 || r.Round < 0 {
		return Report{}, fmt.Errorf("malformed %s message: negative rank, world_size or round", r.Type)
	}
	if (r.Type == ReportCheckpoint || r.Type == ReportCheckpointUpdate) && r.Path == "" {
		return Report{}, fmt.Errorf(`malformed %s message: missing "path"`, r.Type)
	}
	if r.Type == ReportCheckpointUpdate {
		if r.CheckpointType != "model" && r.CheckpointType != "data" {
			return Report{}, fmt.Errorf(`malformed checkpoint_update message: checkpoint_type %q (want "model" or "data")`, r.CheckpointType)
		}
		if r.NumModel < 0 || r.NumData < 0 || r.Nodes < 0 {
			return Report{}, errors.New("malformed checkpoint_update message: negative writer or node count")
		}
	}
	r.Raw = append(json.RawMessage(nil), line...)
	return r, nil
}

// SendReport sends one report to the control socket and waits for the
// agent's acknowledgement. It is the Go workers' client; an agent refusal
// is returned as an error.
func SendReport(ctx context.Context, socketPath string, r Report) error {
	_, err := exchange(ctx, socketPath, r)
	return err
}

// RequestAssignment sends a ReportReconfigure (the worker has left its
// process group) and waits, until ctx ends, for the agent's answer: the
// worker's next assignment, or Leave. It is the Go workers' reconfigure().
func RequestAssignment(ctx context.Context, socketPath string, r Report) (*Assignment, error) {
	r.Type = ReportReconfigure
	a, err := exchange(ctx, socketPath, r)
	if err != nil {
		return nil, err
	}
	if a.Assignment == nil {
		return nil, errors.New("control: the agent acknowledged the reconfigure request without an assignment")
	}
	return a.Assignment, nil
}

func exchange(ctx context.Context, socketPath string, r Report) (ack, error) {
	if r.PID == 0 {
		r.PID = os.Getpid()
	}
	if r.Token == "" {
		r.Token = os.Getenv(EnvControlToken)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return ack{}, fmt.Errorf("control: encode report: %w", err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return ack{}, fmt.Errorf("control: connect to control socket: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			return ack{}, fmt.Errorf("control: send report: %w", err)
		}
	}
	// Unblock the read below if ctx is cancelled without a deadline.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := conn.Write(append(data, '\n')); err != nil {
		return ack{}, fmt.Errorf("control: send report: %w", err)
	}
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return ack{}, fmt.Errorf("control: wait for acknowledgement: %w", ctx.Err())
		}
		return ack{}, fmt.Errorf("control: wait for acknowledgement: %w", err)
	}
	var a ack
	if err := json.Unmarshal(line, &a); err != nil {
		return ack{}, fmt.Errorf("control: malformed acknowledgement %q: %w", bytes.TrimSpace(line), err)
	}
	if !a.OK {
		return ack{}, fmt.Errorf("control: agent refused %s report: %s", r.Type, a.Error)
	}
	return a, nil
}

// Assignment is what a worker parked by a ReportReconfigure is told: the
// environment of its next round (RANK, WORLD_SIZE, MASTER_ADDR/PORT, the
// round, the new control token...), or to leave (checkpointed already, it
// exits 0).
type Assignment struct {
	Leave bool              `json:"leave,omitempty"`
	Round int64             `json:"round,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	// Reason says why a worker is told to leave.
	Reason string `json:"reason,omitempty"`
}

// Package control is the worker control channel: the scale sync-signal
// protocol between the hyperpodrun agent and its training workers. The
// agent announces a planned change in an event file and by a signal;
// workers report checkpoints and stops on a unix socket whose peers the
// kernel names (SO_PEERCRED), with a per-round token; in-process workers
// park on it for their next assignment.
//
// The agent owns one control directory per worker group ([NewChannel]). Every
// worker gets its paths in the environment ([Channel.Env]):
//
//	HYPERPODRUN_CONTROL_DIR     the directory
//	HYPERPODRUN_CONTROL_SOCKET  <dir>/control.sock, a unix stream socket
//	HYPERPODRUN_EVENT_FILE      <dir>/event.json
//
// A planned change is announced by [Channel.Announce], which replaces
// event.json atomically, and then by the elastic signal (SIGUSR1 unless
// HYPERPODRUN_ELASTIC_SIGNAL says otherwise), which the agent sends itself.
// event.json holds:
//
//	{"kind":"scale_down","new_world_size":2,"round":4,"seq":1,
//	 "deadline":"2025-01-01T00:00:30Z","deadline_unix":1735689630.0,
//	 "announced_at":"...","announced_at_unix":...,"traceparent":"00-...",
//	 "reason":"..."}
//
// Kinds: scale_up and scale_down (the job's size changes), resize (a
// planned change that keeps the size), drain (this node leaves; the job
// goes on without it), preemption (the coordinator took the whole job's
// capacity for another job; it is requeued) and shutdown (the job was
// suspended or deleted). new_world_size is 0 for preemption and shutdown.
//
// Workers send newline-delimited JSON messages to control.sock; the agent
// answers every message with one line, {"ok":true} or
// {"ok":false,"error":"..."}, after the message has been handled. Messages:
//
//	{"type":"checkpoint","step":120,"path":"/ckpt/step-120","rank":0,"world_size":3}
//	{"type":"stopping","step":120,"rank":1,"world_size":3}
//	{"type":"stopping","detected":true,"step":0,"rank":1,"world_size":3}
//	{"type":"heartbeat","rank":1,"world_size":3,"stacks":"/logs/.../stacks_rank1_pid42.txt"}
//	{"type":"checkpoint_failed","step":120,"path":"/ckpt/step-120","rank":0,"error":"OSError: [Errno 28] No space left on device"}
//
// A heartbeat (sent only under --hang-timeout, see HYPERPODRUN_HANG_TIMEOUT)
// is progress for the agent's hang detection; a checkpoint_failed report
// says a rank could not save a step, which is then not committed. The
// agent answers it with what the worker does next ([Advice]):
// {"ok":true,"advice":"retry","retry_after_s":1.0} (save the step again),
// {"ok":true,"advice":"go_on"} (go on without the checkpoint: in process,
// the survivors keep their state in memory) or no advice (the save's error
// stands).
//
// The Python helper sends the "detected" stopping report from every rank as
// soon as the ranks agree on an event (step unknown), so an agent whose
// workers learned of the change only through the agreement knows that
// their exit 0 is not the end of training.
//
// A checkpoint message means committed: the worker that sends it (rank 0 in
// the Python helper) does so only after every rank has finished writing its
// part. With a handler that records it (checkpoint.Store.ReportHandler) the
// acknowledgement is sent after the record is in etcd, so a worker that got
// {"ok":true} and exits knows a restart will resume from that step.
package control

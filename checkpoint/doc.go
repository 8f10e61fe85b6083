// Package checkpoint keeps the job's committed-checkpoint record in etcd,
// commits checkpoint directories atomically for Go workers, and embeds the
// Python helper package. The worker control channel the checkpoints are
// reported on is package [github.com/hyperpodrun/hyperpodrun/checkpoint/control].
//
// # Checkpoint records
//
// [Store] keeps the latest committed checkpoint of a job under
// <prefix>/jobs/<job>/checkpoint; commits never move it backwards.
// [Record.Env] turns it into the variables restarted workers read:
// HYPERPODRUN_CHECKPOINT, HYPERPODRUN_RESUME_STEP and
// HYPERPODRUN_CHECKPOINT_WORLD_SIZE. Only reported (committed) checkpoints are
// ever recorded, so one that was being written when a worker died is never
// handed out.
//
// # Atomic directories
//
// [WriteDir] and [WriteDirFunc] write a checkpoint directory beside its final
// name, fsync every file and directory, write a manifest (names, sizes,
// SHA-256) last and rename the directory into place. [Verify] and [ReadDir]
// refuse a directory without a valid manifest.
package checkpoint

"""Atomic saves, the commit protocol and the checkpoint handed to restarts."""

import logging
import os
import tempfile
import time
from typing import Callable, Optional

from . import _control, _events

log = logging.getLogger("hyperpodrun_elastic")

ENV_CHECKPOINT = "HYPERPODRUN_CHECKPOINT"
ENV_RESUME_STEP = "HYPERPODRUN_RESUME_STEP"
ENV_CHECKPOINT_WORLD_SIZE = "HYPERPODRUN_CHECKPOINT_WORLD_SIZE"


class Checkpoint(tuple):
    """``(step, path)`` of the latest committed checkpoint.

    Unpacks as a pair; ``world_size`` (the world size that wrote it, or
    None) is an attribute.
    """

    def __new__(cls, step: int, path: str, world_size: Optional[int] = None):
        self = tuple.__new__(cls, (step, path))
        self.world_size = world_size
        return self

    @property
    def step(self) -> int:
        return self[0]

    @property
    def path(self) -> str:
        return self[1]

    def __repr__(self):
        return "Checkpoint(step=%d, path=%r, world_size=%r)" % (self[0], self[1], self.world_size)


def latest_checkpoint() -> Optional[Checkpoint]:
    """The checkpoint this worker should resume from, or None to start fresh.

    Read from ``HYPERPODRUN_CHECKPOINT`` and ``HYPERPODRUN_RESUME_STEP``, which
    hyperpodrun sets from the job's last committed checkpoint. Malformed values
    raise ValueError rather than silently starting from scratch.

    The path comes only from this job's own ranks: the agent commits a
    checkpoint report only from a process of the current round's workers
    that carries the round's control token (``HYPERPODRUN_CONTROL_TOKEN``)
    and names its own rank, and only the job's own etcd user may write its
    checkpoint record. Load it as data all the same (``torch.load(...,
    weights_only=True)`` where torch has it): a checkpoint file is only as
    trustworthy as the storage it lives on.
    """
    path = os.environ.get(ENV_CHECKPOINT, "").strip()
    step_text = os.environ.get(ENV_RESUME_STEP, "").strip()
    if not path and not step_text:
        return None
    if not path or not step_text:
        raise ValueError("%s and %s must be set together (got %r and %r)"
                         % (ENV_CHECKPOINT, ENV_RESUME_STEP, path, step_text))
    try:
        step = int(step_text)
    except ValueError:
        raise ValueError("%s=%r is not an integer" % (ENV_RESUME_STEP, step_text)) from None
    if step < 0:
        raise ValueError("%s=%d is negative" % (ENV_RESUME_STEP, step))
    ws_text = os.environ.get(ENV_CHECKPOINT_WORLD_SIZE, "").strip()
    world_size = None
    if ws_text:
        try:
            world_size = int(ws_text)
        except ValueError:
            log.warning("hyperpodrun_elastic: ignoring malformed %s=%r", ENV_CHECKPOINT_WORLD_SIZE, ws_text)
    return Checkpoint(step, path, world_size)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(obj, path, save_fn: Optional[Callable] = None) -> str:
    """Save ``obj`` to ``path`` so that ``path`` is either the old or the new
    complete file, whatever happens to the process.

    ``save_fn(obj, file)`` writes to a binary file object; default
    ``torch.save``. The data goes to a temporary file in the same directory,
    which is flushed, fsynced and renamed over ``path``; then the directory
    is fsynced. Returns the absolute path.
    """
    path = os.path.abspath(os.fspath(path))
    directory, base = os.path.split(path)
    os.makedirs(directory, exist_ok=True)
    if save_fn is None:
        import torch  # only needed for the default
        save_fn = torch.save
    fd, tmp = tempfile.mkstemp(prefix="." + base + ".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            save_fn(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)
    return path


def save_and_commit(state, path, step, *, sharded: bool = False, save_fn: Optional[Callable] = None,
                    timeout: Optional[float] = None) -> bool:
    """Save a checkpoint of ``step`` on every rank and commit it.

    Not sharded: rank 0 saves ``state`` to the file ``path``. Sharded: every
    rank saves its ``state`` to ``path/rank-<rank>.pt``. Then all ranks
    synchronise (a save failure on any rank stops the commit), rank 0 reports
    the checkpoint to the agent, and every rank learns whether the agent
    recorded it. Must be called by every rank. Returns True on every rank iff
    the checkpoint is committed; raises on the rank whose save failed.

    A rank whose save fails tells the agent (``checkpoint_failed``), which
    answers what to do and the ranks agree on it: during a planned change
    the agent may have the ranks save the same step again after a pause (a
    transient error), or, under ``--inprocess-resize``, go on without the
    checkpoint (False on every rank, nothing raised: the survivors keep the
    state in memory and ``reconfigure()``); otherwise the save's error is
    raised as before.
    """
    step = int(step)
    dist = _events._distributed()
    if dist is not None:
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = _control._env_int("RANK", 0), _control._env_int("WORLD_SIZE", 1)
    collective = dist is not None and world > 1
    path = os.path.abspath(os.fspath(path)) if "://" not in os.fspath(path) else os.fspath(path)

    tries = 0
    while True:
        tries += 1
        error = _save_once(state, path, rank, sharded, save_fn)
        failed = 1.0 if error is not None else 0.0
        if collective:
            # Also the barrier: nobody reports before every rank has saved.
            failed = _events.all_reduce_max(dist, failed)
        if failed <= 0:
            break
        advice, pause = _RAISE, 0.0
        if error is not None:
            advice, pause = _report_failed(step, path, rank, world, error)
        if collective:
            # Every rank follows the strongest advice any rank got.
            advice = int(_events.all_reduce_max(dist, float(advice)))
            pause = _events.all_reduce_max(dist, pause)
        if advice == _RETRY and tries < _MAX_TRIES:
            log.warning("hyperpodrun_elastic: checkpoint of step %d failed (try %d); the agent asks to save it again in %.1fs",
                        step, tries, pause)
            time.sleep(max(0.0, min(pause, 60.0)))
            continue
        if advice == _GO_ON:
            log.warning("hyperpodrun_elastic: checkpoint of step %d not committed (%s); the agent says go on without it",
                        step, error if error is not None else "another rank failed to save")
            return False
        if error is not None:
            raise error
        log.warning("hyperpodrun_elastic: checkpoint of step %d not committed: another rank failed to save", step)
        return False

    ok = False
    if rank == 0:
        ok = _control.report_checkpoint(step, path, rank=rank, world_size=world, timeout=timeout)
    if collective:
        ok = _events.all_reduce_max(dist, 1.0 if ok else 0.0) > 0
    return ok


# What the agent advises after a failed save (checkpoint/control/advice.go),
# ordered so that the ranks agree on the strongest with a MAX.
_RAISE, _GO_ON, _RETRY = 0, 1, 2
_ADVICE = {"go_on": _GO_ON, "retry": _RETRY}
# The helper's own bound on the tries of one save, whatever the agent says.
_MAX_TRIES = 10


def _save_once(state, path, rank, sharded, save_fn):
    """One try of this rank's part of the save; the error, or None."""
    try:
        if sharded:
            os.makedirs(path, exist_ok=True)
            _fsync_dir(os.path.dirname(path))
            atomic_save(state, os.path.join(path, "rank-%05d.pt" % rank), save_fn)
        elif rank == 0:
            atomic_save(state, path, save_fn)
    except Exception as e:  # agreed on by the caller, then re-raised or retried
        return e
    return None


def _report_failed(step, path, rank, world, error):
    """Tell the agent this rank could not save the checkpoint of ``step``
    and return its advice: (_RAISE, _GO_ON or _RETRY, the pause in seconds
    before a retry). During a planned change the agent says which steps the
    change loses when the save cannot be made."""
    if not _control.under_hyperpodrun():
        return _RAISE, 0.0
    msg = {"type": "checkpoint_failed", "step": step, "path": path, "rank": rank, "world_size": world,
           "error": ("%s: %s" % (type(error).__name__, error))[:1000], "pid": os.getpid()}
    try:
        reply = _control._exchange(os.environ[_control.ENV_CONTROL_SOCKET], msg, 5.0)
    except Exception as e:  # the save's own error is what the caller gets
        log.warning("hyperpodrun_elastic: could not tell the agent the checkpoint failed: %s", e)
        return _RAISE, 0.0
    if not isinstance(reply, dict) or reply.get("ok") is not True:
        err = reply.get("error") if isinstance(reply, dict) else repr(reply)
        log.warning("hyperpodrun_elastic: agent refused checkpoint_failed report: %s", err)
        return _RAISE, 0.0
    pause = reply.get("retry_after_s")
    if isinstance(pause, bool) or not isinstance(pause, (int, float)) or pause < 0:
        pause = 0.0
    return _ADVICE.get(reply.get("advice"), _RAISE), float(pause)

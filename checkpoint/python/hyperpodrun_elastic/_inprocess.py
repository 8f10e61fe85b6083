"""In-process resize: leave the process group, take the next round's
assignment from the agent, re-form the group, and share the training state.

Under ``hyperpodrun --inprocess-resize`` (``HYPERPODRUN_INPROCESS=1`` in the
worker's environment) a planned change does not end the worker::

    if elastic_event_detected():                 # all ranks, same step
        save_and_commit(state, path, step)       # the fallback
        del ddp                                  # before its process group
        a = reconfigure(step, timeout=pg_timeout)
        if a is None:                            # this node leaves the job
            sys.exit(0)
        step = broadcast_state(model, optimizer, step)   # None: load the checkpoint
        ddp = DDP(model)                         # re-wrapped on the new group

Fresh workers (a node that joins, a node whose workers were restarted) call
``broadcast_state`` once right after their first ``init_process_group``, so
every rank of a round runs the same collectives.

A node that joins a job already training starts its workers *before* it
registers (prewarm: ``HYPERPODRUN_PREWARM=1``, and no RANK, WORLD_SIZE or
MASTER_ADDR/PORT yet), so that the survivors stop only once the new workers
have started Python and imported torch. Such a worker asks the agent for its
first assignment and waits for it, either explicitly::

    import torch                                 # the slow part, done ahead
    a = wait_for_assignment()                    # no-op unless prewarmed
    dist.init_process_group("gloo")

or, in code that reads the environment and never calls it, at the first read
of one of the round's variables (``os.environ["RANK"]``, ``os.getenv
("WORLD_SIZE")``, ``"MASTER_PORT" in os.environ``, torch's ``env://``): the
package, once imported, makes those reads wait for the assignment. A worker
that never asks (it does not import this package) is restarted by the agent
after the round, as without prewarm.

Why a broadcast rather than a checkpoint for new nodes: the survivors hold
the state in memory at the step they all stopped at; sending it over the new
process group costs one collective, while a checkpoint costs a write, a
commit and a read on the resize's critical path, and needs storage every
node can read. The checkpoint committed just before ``reconfigure()`` stays
the fallback: ``broadcast_state`` returns None when the survivors do not
hold one same step (an unplanned failure broke a step half way), and the
caller then loads ``latest_checkpoint()`` (the agent updates it in
``os.environ`` with the assignment).
"""

import datetime
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Dict, Optional

from . import _control, _events

log = logging.getLogger("hyperpodrun_elastic")

ENV_INPROCESS = "HYPERPODRUN_INPROCESS"
# Set by the agent on workers started ahead of their round (prewarm).
ENV_PREWARM = "HYPERPODRUN_PREWARM"
# The variables a prewarmed worker gets with its first assignment; reading
# one of them before waits for it.
_ROUND_KEYS = frozenset((
    "RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "HYPERPODRUN_ROUND", "HYPERPODRUN_NUM_NODES", "HYPERPODRUN_CHECKPOINT", "HYPERPODRUN_RESUME_STEP",
    "HYPERPODRUN_CHECKPOINT_WORLD_SIZE", "HYPERPODRUN_CHECKPOINT_ROUND",
))
ENV_RECONFIGURE_TIMEOUT = "HYPERPODRUN_RECONFIGURE_TIMEOUT"
DEFAULT_RECONFIGURE_TIMEOUT = 600.0


class _State:
    holds_state = False  # this process's model/optimizer are the job's current state
    backend = None
    timeout = None
    source = None  # the rank the last broadcast_state took the state from (None: none)


_state = _State()


@dataclass(frozen=True)
class Assignment:
    """This worker's place in the next round, as the agent assigned it."""

    round: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    env: Dict[str, str] = field(default_factory=dict)


def inprocess_enabled() -> bool:
    """Whether the agent offers in-process reconfiguration (--inprocess-resize)."""
    return os.environ.get(ENV_INPROCESS, "").strip().lower() in ("1", "true", "yes")


class _Prewarm:
    lock = threading.RLock()
    pending = False        # started ahead of the round, not assigned yet
    assignment = None      # the first Assignment, once given
    asker = None           # the thread making the request (its own reads pass)


_prewarm = _Prewarm()


def prewarmed() -> bool:
    """Whether this worker was started ahead of its round and has not been
    given its first assignment yet (see ``wait_for_assignment``)."""
    return _prewarm.pending


def wait_for_assignment(timeout: Optional[float] = None) -> Optional[Assignment]:
    """Wait for this worker's first assignment if it was started ahead of
    its round (prewarm, ``HYPERPODRUN_PREWARM=1``).

    Call it once the slow imports are done (torch, your model code) and
    before reading RANK or ``init_process_group``: the agent registers the
    node only once each of its workers has asked, so the others stop
    training only once this one is ready. The assignment (RANK, WORLD_SIZE,
    MASTER_ADDR/PORT, the round, the control token, the checkpoint) is
    written to ``os.environ`` and returned. Without prewarm, or once
    assigned, it returns at once (None, or the first assignment). When the
    agent tells the worker to leave (its node was not taken, or hyperpodrun
    stops), it exits 0. ``timeout`` (seconds; default: wait as long as the
    agent keeps the worker) raises RuntimeError when it passes, as does a
    refusal.
    """
    with _prewarm.lock:  # another thread waits here for the same answer
        if not _prewarm.pending or _prewarm.asker is not None:
            return _prewarm.assignment
        _prewarm.asker = threading.get_ident()
        try:
            return _ask_first_assignment(timeout)
        finally:
            _prewarm.asker = None


def _ask_first_assignment(timeout: Optional[float]) -> Assignment:
    msg = {"type": "reconfigure", "step": 0, "pid": os.getpid()}
    reply = _control.request(msg, timeout)
    a = reply.get("assignment") if isinstance(reply, dict) else None
    if not isinstance(a, dict):
        raise RuntimeError("hyperpodrun_elastic: the agent answered the first-assignment request without an assignment: %r" % (reply,))
    if a.get("leave"):
        log.info("hyperpodrun_elastic: prewarmed worker not needed (%s); exiting", a.get("reason") or "no round")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # may be inside an import or an os.environ read: leave at once
    env = a.get("env")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise RuntimeError("hyperpodrun_elastic: malformed assignment environment: %r" % (env,))
    _stop_lazy_environ()
    os.environ.update(env)
    os.environ.pop(ENV_PREWARM, None)
    _events.reset()
    _prewarm.assignment = Assignment(
        round=int(a.get("round") or 0),
        rank=_control._env_int("RANK", 0),
        world_size=_control._env_int("WORLD_SIZE", 1),
        local_rank=_control._env_int("LOCAL_RANK", 0),
        local_world_size=_control._env_int("LOCAL_WORLD_SIZE", 1),
        master_addr=os.environ.get("MASTER_ADDR", ""),
        master_port=_control._env_int("MASTER_PORT", 0),
        env=dict(env),
    )
    _prewarm.pending = False
    log.info("hyperpodrun_elastic: prewarmed worker assigned: round %d rank %d of %d",
             _prewarm.assignment.round, _prewarm.assignment.rank, _prewarm.assignment.world_size)
    return _prewarm.assignment


class _PrewarmEnviron(os._Environ):
    """os.environ while a prewarmed worker has no assignment: reading one of
    the round's variables waits for it (wait_for_assignment)."""

    def __getitem__(self, key):
        if key in _ROUND_KEYS and _prewarm.pending and _prewarm.asker != threading.get_ident():
            wait_for_assignment()
        return os._Environ.__getitem__(self, key)  # the class may have changed meanwhile


def _stop_lazy_environ() -> None:
    if type(os.environ) is _PrewarmEnviron:
        os.environ.__class__ = os._Environ


def _init_prewarm() -> None:
    """Called at import: a worker started ahead of its round (and not
    assigned yet: no RANK) waits for its assignment at the first read of
    one of the round's variables."""
    if os.environ.get(ENV_PREWARM, "").strip() != "1" or "RANK" in os.environ:
        return
    if not _control.under_hyperpodrun():
        return
    _prewarm.pending = True
    if type(os.environ) is os._Environ:
        os.environ.__class__ = _PrewarmEnviron


def _reconfigure_timeout(timeout: Optional[float]) -> float:
    if timeout is not None:
        return float(timeout)
    value = os.environ.get(ENV_RECONFIGURE_TIMEOUT, "").strip()
    try:
        return float(value) if value else DEFAULT_RECONFIGURE_TIMEOUT
    except ValueError:
        return DEFAULT_RECONFIGURE_TIMEOUT


def _torch_distributed():
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        try:
            import torch.distributed as dist  # noqa: F811 (the training code uses torch already)
        except ImportError:
            return None
    return dist


def reconfigure(step: int = 0, *, backend: Optional[str] = None, timeout=None,
                init: bool = True, wait_timeout: Optional[float] = None) -> Optional[Assignment]:
    """Leave the process group and re-form it on the next round's assignment.

    Destroys the default process group (drop DDP wrappers before), asks the
    agent for this worker's next assignment on the control channel and waits
    for it (``wait_timeout``, default ``HYPERPODRUN_RECONFIGURE_TIMEOUT`` or
    600 s). When this node leaves the job the agent says so and None is
    returned: the caller exits 0 (it checkpointed before). Otherwise the
    assignment (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, the
    round, the new control token, the latest checkpoint) is written to
    ``os.environ``, the event is forgotten (``reset()``) and, with ``init``,
    the default process group is initialised again (env://, on the store the
    round's rank-0 agent serves) with ``backend`` and ``timeout`` (default:
    the previous group's backend and the timeout given last).

    Raises RuntimeError when the agent refuses or cannot be reached: the
    worker should exit non-zero, and the agent restarts it.
    """
    if not _control.under_hyperpodrun():
        raise RuntimeError("reconfigure() needs hyperpodrun (HYPERPODRUN_CONTROL_SOCKET is not set)")
    dist = _torch_distributed()
    if timeout is not None:
        _state.timeout = timeout
    if dist is not None and dist.is_available() and dist.is_initialized():
        if backend is None:
            backend = str(dist.get_backend())
        try:
            dist.destroy_process_group()
        except Exception as e:  # a broken group: it is being left anyway
            log.warning("hyperpodrun_elastic: destroy_process_group failed (%s); going on", e)
    if backend is None:
        backend = _state.backend or "gloo"
    _state.backend = backend
    msg = {
        "type": "reconfigure",
        "step": _control._check_step(step),
        "rank": _control._env_int("RANK", 0),
        "world_size": _control._env_int("WORLD_SIZE", 1),
        "pid": os.getpid(),
    }
    reply = _control.request(msg, _reconfigure_timeout(wait_timeout))
    a = reply.get("assignment") if isinstance(reply, dict) else None
    if not isinstance(a, dict):
        raise RuntimeError("hyperpodrun_elastic: the agent answered reconfigure without an assignment: %r" % (reply,))
    if a.get("leave"):
        log.info("hyperpodrun_elastic: this node leaves the job (%s)", a.get("reason") or "not in the next round")
        return None
    env = a.get("env")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise RuntimeError("hyperpodrun_elastic: malformed assignment environment: %r" % (env,))
    os.environ.update(env)
    _events.reset()
    out = Assignment(
        round=int(a.get("round") or 0),
        rank=_control._env_int("RANK", 0),
        world_size=_control._env_int("WORLD_SIZE", 1),
        local_rank=_control._env_int("LOCAL_RANK", 0),
        local_world_size=_control._env_int("LOCAL_WORLD_SIZE", 1),
        master_addr=os.environ.get("MASTER_ADDR", ""),
        master_port=_control._env_int("MASTER_PORT", 0),
        env=dict(env),
    )
    if init:
        if dist is None:
            raise RuntimeError("reconfigure(init=True) needs torch.distributed")
        kw = {}
        if _state.timeout is not None:
            t = _state.timeout
            kw["timeout"] = t if isinstance(t, datetime.timedelta) else datetime.timedelta(seconds=float(t))
        dist.init_process_group(backend, **kw)
    log.info("hyperpodrun_elastic: reconfigured in process: round %d rank %d of %d", out.round, out.rank, out.world_size)
    return out


def broadcast_state(model, optimizer=None, step: int = 0, *, holds_state: Optional[bool] = None,
                    src: Optional[int] = None) -> Optional[int]:
    """Give every rank the training state of a rank that holds it in memory.

    Every rank calls it right after (re-)initialising the process group.
    A rank holds the state when it went through ``reconfigure()`` or an
    earlier ``broadcast_state`` (``holds_state`` overrides). Then:

    * some ranks hold it, all at one step: the lowest of them (or ``src``)
      broadcasts model and optimizer state dicts; returns that step;
    * none holds it (every rank started fresh): returns ``step`` when all
      ranks give the same one (they loaded the same checkpoint), else None;
    * the holders disagree on the step (an unplanned failure broke a step
      half way on some of them): returns None, and every rank loads
      ``latest_checkpoint()``.
    """
    dist = _torch_distributed()
    step = _control._check_step(step)
    _state.source = None
    if dist is None or not dist.is_initialized() or dist.get_world_size() == 1:
        _state.holds_state = True
        return step
    torch = sys.modules["torch"]
    holds = _state.holds_state if holds_state is None else bool(holds_state)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if "nccl" in str(dist.get_backend()).lower():
        device = torch.device("cuda", torch.cuda.current_device())
    mine = torch.tensor([step, 1 if holds else 0], dtype=torch.int64, device=device)
    every = [torch.zeros(2, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(every, mine)
    every = [(int(t[0].item()), bool(t[1].item())) for t in every]
    holders = [r for r, (_, h) in enumerate(every) if h]
    if not holders:
        steps = {s for s, _ in every}
        if len(steps) == 1:
            _state.holds_state = True
            return step
        log.warning("hyperpodrun_elastic: fresh ranks hold different steps %s; resume from the checkpoint", sorted(steps))
        return None
    steps = {every[r][0] for r in holders}
    if len(steps) != 1:
        log.warning("hyperpodrun_elastic: the survivors hold different steps %s; resume from the checkpoint", sorted(steps))
        _state.holds_state = False
        return None
    src = holders[0] if src is None else int(src)
    at = every[src][0]
    payload = [None]
    if rank == src:
        payload = [{"model": model.state_dict(),
                    "optimizer": optimizer.state_dict() if optimizer is not None else None,
                    "step": at}]
    dist.broadcast_object_list(payload, src=src)
    _state.source = src
    if rank != src:
        state = payload[0]
        model.load_state_dict(state["model"])
        if optimizer is not None and state["optimizer"] is not None:
            optimizer.load_state_dict(state["optimizer"])
    _state.holds_state = True
    return at


def holds_state() -> bool:
    """Whether this process holds the job's training state in memory."""
    return _state.holds_state


def state_source() -> Optional[int]:
    """The rank the last ``broadcast_state`` took the state from, or None
    when it broadcast nothing (every rank loaded the same checkpoint)."""
    return _state.source


def forget_state() -> None:
    """This process no longer holds the job's state (it loaded a checkpoint
    of an older step, say); the next ``broadcast_state`` receives it."""
    _state.holds_state = False

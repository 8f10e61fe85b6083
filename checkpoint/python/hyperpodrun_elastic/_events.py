"""Elastic events: the signal handler, the event file and cross-rank agreement."""

import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Optional

log = logging.getLogger("hyperpodrun_elastic")

ENV_EVENT_FILE = "HYPERPODRUN_EVENT_FILE"
ENV_ELASTIC_SIGNAL = "HYPERPODRUN_ELASTIC_SIGNAL"
ENV_ROUND = "HYPERPODRUN_ROUND"


@dataclass(frozen=True)
class Event:
    """A planned change announced by the agent.

    ``kind`` is ``scale_up``, ``scale_down``, ``resize``, ``drain`` (this
    node leaves, the job goes on), ``preemption`` (the whole job is requeued
    for another job; ``new_world_size`` is 0) or ``shutdown`` (suspended or
    deleted); ``unknown`` when only the signal arrived (no event file).
    ``reason`` explains the change when the agent knows why (e.g. the
    coordinator's preemption message). ``deadline`` and ``announced_at``
    are Unix times in seconds.
    """

    kind: str
    new_world_size: Optional[int] = None
    deadline: Optional[float] = None
    round: Optional[int] = None
    traceparent: Optional[str] = None
    seq: Optional[int] = None
    announced_at: Optional[float] = None
    reason: Optional[str] = None
    # The agent offers in-process reconfiguration for this change
    # (hyperpodrun --inprocess-resize): see reconfigure().
    inprocess: bool = False

    def time_left(self, now: Optional[float] = None) -> Optional[float]:
        """Seconds until the agent escalates (SIGTERM), or None if unknown."""
        if self.deadline is None:
            return None
        return self.deadline - (time.time() if now is None else now)


def parse_signal(value) -> signal.Signals:
    """Parse a signal given as a number, ``SIGUSR1``/``USR1`` or a Signals.

    None or an empty string means SIGUSR1.
    """
    if value is None or value == "":
        return signal.SIGUSR1
    if isinstance(value, int):
        return signal.Signals(value)
    text = str(value).strip().upper()
    if text.isdigit():
        return signal.Signals(int(text))
    if not text.startswith("SIG"):
        text = "SIG" + text
    try:
        return signal.Signals[text]
    except KeyError:
        raise ValueError("unknown signal %r" % (value,)) from None


class _State:
    def __init__(self):
        self.signalled = False  # set by the signal handler
        self.signum = None
        self.agreed = False  # latched once all ranks agreed on an event
        self.installed = {}  # signum -> previous Python handler to chain
        self.file_key = None  # (ino, mtime_ns, size) of the last event file read
        self.file_event = None


_state = _State()
_lock = threading.Lock()  # guards installation and the event file cache


def _handler(signum, frame):
    # Only plain attribute stores here: this runs between bytecodes.
    _state.signalled = True
    _state.signum = signum
    prev = _state.installed.get(signum)
    if callable(prev):
        prev(signum, frame)


def elastic_signal() -> signal.Signals:
    """The elastic signal: ``HYPERPODRUN_ELASTIC_SIGNAL``, else SIGUSR1."""
    try:
        return parse_signal(os.environ.get(ENV_ELASTIC_SIGNAL))
    except ValueError:
        return signal.SIGUSR1


def install_signal_handler(sig=None) -> bool:
    """Install the elastic signal handler (idempotent).

    ``sig`` defaults to ``HYPERPODRUN_ELASTIC_SIGNAL`` (default SIGUSR1). Called
    when the package is imported. Returns False if it could not be installed
    (not the main thread); the event file is still checked then.
    """
    try:
        signum = parse_signal(os.environ.get(ENV_ELASTIC_SIGNAL) if sig is None else sig)
    except ValueError as e:
        log.warning("hyperpodrun_elastic: %s; using SIGUSR1", e)
        signum = signal.SIGUSR1
    with _lock:
        if signum in _state.installed:
            return True
        try:
            prev = signal.signal(signum, _handler)
            # Restart system calls the signal interrupts (SA_RESTART), so
            # blocking I/O in native code (gloo, NCCL, file writes) is not
            # failed with EINTR.
            signal.siginterrupt(signum, False)
        except (ValueError, OSError, RuntimeError) as e:
            log.warning("hyperpodrun_elastic: cannot install a handler for %s (%s); "
                        "relying on the event file", signum.name, e)
            return False
        _state.installed[signum] = prev if callable(prev) and prev is not _handler else None
    return True


def _env_round() -> Optional[int]:
    value = os.environ.get(ENV_ROUND, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        log.warning("hyperpodrun_elastic: ignoring malformed %s=%r", ENV_ROUND, value)
        return None


def _opt_int(v) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _opt_float(v) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        return None
    return float(v)


def _parse_event(data: bytes, path: str) -> Optional[Event]:
    try:
        raw = json.loads(data)
    except ValueError as e:
        log.warning("hyperpodrun_elastic: malformed event file %s: %s", path, e)
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("kind"), str) or not raw["kind"]:
        log.warning("hyperpodrun_elastic: malformed event file %s: no kind", path)
        return None
    return Event(
        kind=raw["kind"],
        new_world_size=_opt_int(raw.get("new_world_size")),
        deadline=_opt_float(raw.get("deadline_unix")),
        round=_opt_int(raw.get("round")),
        traceparent=raw.get("traceparent") if isinstance(raw.get("traceparent"), str) else None,
        seq=_opt_int(raw.get("seq")),
        announced_at=_opt_float(raw.get("announced_at_unix")),
        reason=raw.get("reason") if isinstance(raw.get("reason"), str) else None,
        inprocess=raw.get("inprocess") is True,
    )


def read_event_file() -> Optional[Event]:
    """The event announced in ``HYPERPODRUN_EVENT_FILE``, or None.

    An event of an earlier round than ``HYPERPODRUN_ROUND`` is ignored. The
    file is only re-read when it changed (one stat per call otherwise).
    """
    path = os.environ.get(ENV_EVENT_FILE)
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        with _lock:
            _state.file_key, _state.file_event = None, None
        return None
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    with _lock:
        if key == _state.file_key:
            return _state.file_event
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None  # removed between stat and open
    ev = _parse_event(data, path)
    current = _env_round()
    if ev is not None and current is not None and ev.round is not None and ev.round < current:
        log.debug("hyperpodrun_elastic: ignoring event of round %d (this is round %d)", ev.round, current)
        ev = None
    with _lock:
        _state.file_key, _state.file_event = key, ev
    return ev


def local_event_pending() -> bool:
    """Whether this process has seen an event (signal or event file)."""
    return _state.signalled or read_event_file() is not None


def _distributed():
    """torch.distributed if it is imported and initialised, else None.

    The package never imports torch itself.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # a half-initialised torch: treat as not distributed
        return None
    return None


def all_reduce_max(dist, value: float) -> float:
    """MAX of ``value`` over all ranks of the default process group."""
    torch = sys.modules["torch"]
    backend = str(dist.get_backend()).lower()
    if "nccl" in backend:
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    t = torch.tensor([float(value)], dtype=torch.float32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def elastic_event_detected(sig=None) -> bool:
    """True once the agent has announced a planned change.

    Call it once per training step on every rank, at the same point. When
    torch.distributed is initialised with more than one rank, the ranks agree
    (all_reduce MAX of the local flags): all of them return True at the same
    step, even if only one got the signal. Once True, it stays True and no
    further collective is issued.

    ``sig`` (optional, for code written for HyperPod's
    ``elastic_event_detected(sig)``) asks about one signal: only the elastic
    signal (``HYPERPODRUN_ELASTIC_SIGNAL``, SIGUSR1 by default) can be an
    event; any other, SIGTERM included, gives False and installs no handler,
    so SIGTERM keeps its meaning (PyTorch's, or the default: terminate).
    """
    if sig is not None:
        try:
            asked = parse_signal(sig)
        except ValueError:
            return False
        if asked != elastic_signal():
            return False
    _heartbeat()
    if _state.agreed:
        return True
    local = local_event_pending()
    dist = _distributed()
    result = local
    if dist is not None:
        try:
            if dist.get_world_size() > 1:
                result = all_reduce_max(dist, 1.0 if local else 0.0) > 0
        except Exception as e:
            log.warning("hyperpodrun_elastic: cross-rank event check failed (%s); using the local flag", e)
    if result:
        _state.agreed = True
        ev = event()
        log.info("hyperpodrun_elastic: elastic event detected (kind=%s new_world_size=%s)",
                 ev.kind if ev else "unknown", ev.new_world_size if ev else None)
        _report_detected()
    return result


def _heartbeat():
    """Progress for the agent's hang detection (--hang-timeout); never raises."""
    from ._heartbeat import heartbeat
    try:
        heartbeat()
    except Exception as e:
        log.warning("hyperpodrun_elastic: heartbeat failed: %s", e)


def _report_detected():
    """Tell this rank's agent that it is stopping for a planned change.

    A rank that learned of the event only through the cross-rank agreement
    (the change was announced on another node) would otherwise exit 0 with
    its agent none the wiser, and an agent whose workers all exit 0 without
    this report takes it as the end of training. The step is not known
    here (0; ``report_stopping(step)`` can still follow with it).
    """
    from ._control import _env_int, send_message, under_hyperpodrun
    if not under_hyperpodrun():
        return
    msg = {"type": "stopping", "step": 0, "detected": True,
           "rank": _env_int("RANK", 0), "world_size": _env_int("WORLD_SIZE", 1), "pid": os.getpid()}
    try:
        send_message(msg, 5.0)
    except Exception as e:  # never break the training loop over it
        log.warning("hyperpodrun_elastic: could not tell the agent this rank is stopping: %s", e)


def event() -> Optional[Event]:
    """Details of the pending event, or None if there is none.

    Returns ``Event(kind="unknown")`` when an event was signalled (or agreed by
    another rank) but no event file can be read.
    """
    ev = read_event_file()
    if ev is not None:
        return ev
    if _state.signalled or _state.agreed:
        return Event(kind="unknown")
    return None


def reset() -> None:
    """Forget any event seen (for tests, or a process that trains again)."""
    with _lock:
        _state.signalled = False
        _state.signum = None
        _state.agreed = False
        _state.file_key = None
        _state.file_event = None

"""Reports to the agent over the control socket (newline-delimited JSON)."""

import json
import logging
import operator
import os
import socket
from typing import Optional

log = logging.getLogger("hyperpodrun_elastic")

ENV_CONTROL_SOCKET = "HYPERPODRUN_CONTROL_SOCKET"
# The secret of this round's workers: the agent refuses reports without it.
ENV_CONTROL_TOKEN = "HYPERPODRUN_CONTROL_TOKEN"
ENV_REPORT_TIMEOUT = "HYPERPODRUN_REPORT_TIMEOUT"
DEFAULT_REPORT_TIMEOUT = 60.0
_MAX_REPLY = 1 << 16

_warned_not_under_agent = False


def under_hyperpodrun() -> bool:
    """Whether this process has a hyperpodrun control channel."""
    return bool(os.environ.get(ENV_CONTROL_SOCKET))


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        log.warning("hyperpodrun_elastic: ignoring malformed %s=%r", name, value)
        return default


def _timeout(timeout: Optional[float]) -> float:
    if timeout is not None:
        return float(timeout)
    value = os.environ.get(ENV_REPORT_TIMEOUT, "").strip()
    try:
        return float(value) if value else DEFAULT_REPORT_TIMEOUT
    except ValueError:
        return DEFAULT_REPORT_TIMEOUT


def _exchange(path: str, msg: dict, timeout: float):
    """One round trip on the control socket: msg (with this round's token
    from the environment) as one JSON line, the agent's one-line JSON reply
    decoded. Raises OSError or ValueError; the callers decide how loudly."""
    token = os.environ.get(ENV_CONTROL_TOKEN)
    if token and "token" not in msg:
        msg = dict(msg, token=token)
    data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(data)
        buf = b""
        while not buf.endswith(b"\n") and len(buf) < _MAX_REPLY:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return json.loads(buf.decode() or "null")


def send_message(msg: dict, timeout: Optional[float] = None) -> bool:
    """Send one message and wait for the agent's acknowledgement.

    Returns True when the agent accepted it. Never raises for transport
    problems: they are logged and give False. Outside hyperpodrun it logs one
    warning and returns False.
    """
    global _warned_not_under_agent
    path = os.environ.get(ENV_CONTROL_SOCKET)
    if not path:
        if not _warned_not_under_agent:
            _warned_not_under_agent = True
            log.warning("hyperpodrun_elastic: %s is not set (not running under hyperpodrun); "
                        "%s report not sent", ENV_CONTROL_SOCKET, msg.get("type"))
        return False
    try:
        reply = _exchange(path, msg, _timeout(timeout))
    except (OSError, ValueError) as e:
        log.warning("hyperpodrun_elastic: %s report to %s failed: %s", msg.get("type"), path, e)
        return False
    if isinstance(reply, dict) and reply.get("ok") is True:
        return True
    err = reply.get("error") if isinstance(reply, dict) else repr(reply)
    log.warning("hyperpodrun_elastic: agent refused %s report: %s", msg.get("type"), err)
    return False


def request(msg: dict, timeout: float) -> dict:
    """Send one message and return the agent's reply (a dict with ``ok``).

    Unlike ``send_message`` it raises: RuntimeError when not under
    hyperpodrun, when the connection fails or times out, or when the agent
    refuses the message.
    """
    path = os.environ.get(ENV_CONTROL_SOCKET)
    if not path:
        raise RuntimeError("%s is not set (not running under hyperpodrun)" % ENV_CONTROL_SOCKET)
    try:
        reply = _exchange(path, msg, timeout)
    except (OSError, ValueError) as e:
        raise RuntimeError("hyperpodrun_elastic: %s request to %s failed: %s" % (msg.get("type"), path, e)) from e
    if isinstance(reply, dict) and reply.get("ok") is True:
        return reply
    err = reply.get("error") if isinstance(reply, dict) else repr(reply)
    raise RuntimeError("hyperpodrun_elastic: agent refused %s request: %s" % (msg.get("type"), err))


def _check_step(step) -> int:
    """An int (or anything with __index__: numpy ints, integer 0-d tensors) >= 0."""
    if isinstance(step, bool):
        raise TypeError("step must be an integer, got %r" % (step,))
    try:
        step = operator.index(step)
    except TypeError:
        raise TypeError("step must be an integer, got %r" % (step,)) from None
    if step < 0:
        raise ValueError("step must be >= 0, got %d" % step)
    return step


def _normalise_path(path) -> str:
    path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise ValueError("checkpoint path must be a non-empty string")
    if "://" in path:  # a URL (s3://...) is passed through
        return path
    return os.path.abspath(path)


def report_checkpoint(step, path, *, rank: Optional[int] = None, world_size: Optional[int] = None,
                      timeout: Optional[float] = None) -> bool:
    """Tell the agent a checkpoint of ``step`` at ``path`` is committed.

    Call it once, from one rank, after every rank has finished writing (see
    ``save_and_commit``). Returns True once the agent has recorded it; False
    (with a warning) if it was refused, failed, or not under hyperpodrun.
    """
    msg = {
        "type": "checkpoint",
        "step": _check_step(step),
        "path": _normalise_path(path),
        "rank": _env_int("RANK", 0) if rank is None else int(rank),
        "world_size": _env_int("WORLD_SIZE", 1) if world_size is None else int(world_size),
        "pid": os.getpid(),
    }
    return send_message(msg, timeout)


def report_stopping(step, *, rank: Optional[int] = None, world_size: Optional[int] = None,
                    timeout: Optional[float] = None) -> bool:
    """Tell the agent this rank saw the event and is exiting after ``step``."""
    msg = {
        "type": "stopping",
        "step": _check_step(step),
        "rank": _env_int("RANK", 0) if rank is None else int(rank),
        "world_size": _env_int("WORLD_SIZE", 1) if world_size is None else int(world_size),
        "pid": os.getpid(),
    }
    return send_message(msg, timeout)

"""Progress heartbeats for hyperpodrun's hang detection (``--hang-timeout``).

``elastic_event_detected()`` calls ``heartbeat()`` on every call, so a
training loop that checks for events every step (HyperPod's pattern) is
watched with no other change. A loop that never calls the helper sends no
heartbeat and is not watched: call ``heartbeat()`` (or
``elastic_event_detected()``) once per step.

The agent sets ``HYPERPODRUN_HANG_TIMEOUT`` only when it watches; the
heartbeats are throttled to one per ``HYPERPODRUN_HEARTBEAT_INTERVAL``
seconds. When the package is imported (and at the latest with the first
heartbeat) the helper registers a ``faulthandler`` dump of every thread's
Python stack on ``HYPERPODRUN_STACKS_SIGNAL`` into a file of
``HYPERPODRUN_STACKS_DIR`` (the run's log directory): the agent sends that
signal to a hung worker before it stops it, also to one that hangs before
its first heartbeat (``--hang-startup-timeout``), which it finds by that
file. Should the program install its own handler on that signal later, the
first heartbeat removes the file: the agent then sends it nothing.
"""

import faulthandler
import logging
import os
import signal
import time

log = logging.getLogger("hyperpodrun_elastic")

ENV_HANG_TIMEOUT = "HYPERPODRUN_HANG_TIMEOUT"
ENV_HEARTBEAT_INTERVAL = "HYPERPODRUN_HEARTBEAT_INTERVAL"
ENV_STACKS_DIR = "HYPERPODRUN_STACKS_DIR"
ENV_STACKS_SIGNAL = "HYPERPODRUN_STACKS_SIGNAL"


class _Beat:
    def __init__(self):
        self.interval = None  # seconds between heartbeats, once known
        self.off = False  # not watched: never send
        self.last = None  # time.monotonic() of the last heartbeat sent
        self.stacks = None  # the open stack dump file
        self.signum = None  # its signal
        self.offered = False  # the heartbeats name the stack dump file
        self.key = None  # (pid, environment) of the setup: a fork or a new assignment starts over


_beat = _Beat()


def _env_float(name):
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        log.warning("hyperpodrun_elastic: ignoring malformed %s=%r", name, value)
        return None


def _key():
    env = os.environ
    return (os.getpid(), env.get(ENV_HANG_TIMEOUT), env.get(ENV_HEARTBEAT_INTERVAL), env.get(ENV_STACKS_DIR),
            env.get("RANK"), env.get("HYPERPODRUN_CONTROL_SOCKET"))


def _setup():
    """Decide once whether this worker is watched, and install its stack dump."""
    from ._control import under_hyperpodrun
    _reset()
    _beat.key = _key()
    timeout = _env_float(ENV_HANG_TIMEOUT)
    if not under_hyperpodrun() or timeout is None or timeout <= 0:
        _beat.off = True
        return
    _beat.off = False
    interval = _env_float(ENV_HEARTBEAT_INTERVAL)
    _beat.interval = interval if interval is not None and interval >= 0 else min(timeout / 10.0, 30.0)
    _install_stacks()


def _install_stacks():
    from ._control import _env_int
    from ._events import elastic_signal, parse_signal
    directory = os.environ.get(ENV_STACKS_DIR, "").strip()
    if not directory:
        return
    try:
        signum = parse_signal(os.environ.get(ENV_STACKS_SIGNAL) or "SIGUSR2")
    except ValueError as e:
        log.warning("hyperpodrun_elastic: no stack dumps on a hang: %s", e)
        return
    if signum == elastic_signal():
        log.warning("hyperpodrun_elastic: no stack dumps on a hang: %s is the elastic signal", signum.name)
        return
    try:
        current = signal.getsignal(signum)
    except (ValueError, OSError):
        current = None
    if current not in (signal.SIG_DFL, None):
        # The training code handles that signal itself: keep its handler
        # (the agent then sends it nothing; the hang is still detected).
        log.warning("hyperpodrun_elastic: no stack dumps on a hang: %s has a handler of the program's", signum.name)
        return
    path = os.path.join(directory, "stacks_rank%d_pid%d.txt" % (_env_int("RANK", 0), os.getpid()))
    try:
        os.makedirs(directory, exist_ok=True)
        f = open(path, "a")
        faulthandler.register(signum, file=f, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError) as e:
        log.warning("hyperpodrun_elastic: no stack dumps on a hang: %s", e)
        return
    _beat.stacks, _beat.signum, _beat.offered = f, signum, True


def init_stacks():
    """Install the stack dump at import when hyperpodrun watches this
    worker, so a worker that hangs before its first heartbeat can be dumped
    too. Never raises."""
    from ._inprocess import prewarmed
    if prewarmed():  # no RANK yet (reading it would wait for the assignment)
        return
    try:
        if _env_float(ENV_HANG_TIMEOUT) and os.environ.get(ENV_STACKS_DIR, "").strip():
            _setup()
    except Exception as e:  # never break the import over it
        log.warning("hyperpodrun_elastic: no stack dumps on a hang: %s", e)


def _keep_stacks():
    """Give up the stack dump if the program has since taken its signal
    (signal.signal after our import): the file goes, so that the agent,
    which signals only workers that name one or have one, sends nothing."""
    if not _beat.offered:
        return
    try:
        current = signal.getsignal(_beat.signum)
    except (ValueError, OSError):
        return
    if current in (signal.SIG_DFL, None):
        return
    log.warning("hyperpodrun_elastic: no stack dumps on a hang: %s has a handler of the program's", _beat.signum.name)
    try:
        os.remove(_beat.stacks.name)
    except OSError:
        pass
    _beat.offered = False
    try:
        # faulthandler.unregister puts back the action it found (the
        # default): the program's handler goes back on after it.
        faulthandler.unregister(_beat.signum)
        signal.signal(_beat.signum, current)
    except (ValueError, OSError, RuntimeError) as e:  # not the main thread: leave it registered
        log.warning("hyperpodrun_elastic: stack dump left registered: %s", e)
        _beat.signum = None  # _reset must not unregister it over the program's handler
        return
    _beat.stacks.close()
    _beat.stacks, _beat.signum = None, None


def heartbeat() -> bool:
    """Tell the agent this worker makes progress (throttled; cheap to call
    every step). Returns True when a heartbeat was sent and acknowledged.

    Only under ``hyperpodrun --hang-timeout`` (the default): otherwise it
    does nothing. The first call starts the agent's clock for this worker.
    """
    if _beat.key != _key():
        _setup()
    if _beat.off:
        return False
    now = time.monotonic()
    if _beat.last is None:
        _keep_stacks()
    if _beat.last is not None and now - _beat.last < _beat.interval:
        return False
    _beat.last = now
    from ._control import _env_int, send_message
    msg = {"type": "heartbeat", "rank": _env_int("RANK", 0), "world_size": _env_int("WORLD_SIZE", 1),
           "pid": os.getpid()}
    if _beat.offered:
        msg["stacks"] = _beat.stacks.name
    try:
        return send_message(msg, 5.0)
    except Exception as e:  # never break the training loop over it
        log.warning("hyperpodrun_elastic: heartbeat not sent: %s", e)
        return False


def _reset():
    """Forget the setup (tests; a process whose environment changed)."""
    if _beat.signum is not None:
        faulthandler.unregister(_beat.signum)
    if _beat.stacks is not None:
        _beat.stacks.close()
    _beat.key, _beat.off, _beat.last, _beat.stacks, _beat.signum, _beat.offered = None, False, None, None, None, False

"""hyperpodrun_elastic: training-side helper of hyperpodrun's elastic protocol.

Stdlib only; torch is used only when the training code has imported it.

    from hyperpodrun_elastic import (elastic_event_detected, event, latest_checkpoint,
                                     save_and_commit, atomic_save, report_checkpoint)

    ckpt = latest_checkpoint()            # (step, path) to resume from, or None
    for step in range(start, total):
        train_one_step()
        if elastic_event_detected():      # all ranks agree, same step
            save_and_commit(state, path, step)
            sys.exit(0)

Under ``hyperpodrun --inprocess-resize`` the workers of nodes that stay do
not exit on a change: see ``reconfigure()`` and ``broadcast_state()``
(``_inprocess.py`` shows the pattern). A node joining a job that trains
starts its workers ahead of their round (prewarm): they wait for their first
assignment in ``wait_for_assignment()``, or at the first read of RANK,
WORLD_SIZE, MASTER_ADDR/PORT... once this package is imported.

Importing the package installs the elastic signal handler (SIGUSR1, or
HYPERPODRUN_ELASTIC_SIGNAL): without it the signal would kill the process.
"""

from ._control import report_checkpoint, report_stopping, under_hyperpodrun
from ._discovery import CheckpointDiscoverySocketClient, CheckpointType, HyperPodIPCException
from ._heartbeat import heartbeat
from ._heartbeat import init_stacks as _init_stacks
from ._events import (
    Event,
    elastic_event_detected,
    event,
    install_signal_handler,
    parse_signal,
    reset,
)
from ._inprocess import (
    Assignment,
    broadcast_state,
    forget_state,
    holds_state,
    inprocess_enabled,
    prewarmed,
    reconfigure,
    state_source,
    wait_for_assignment,
)
from ._inprocess import _init_prewarm
from ._save import Checkpoint, atomic_save, latest_checkpoint, save_and_commit

__version__ = "0.1.0"

__all__ = [
    "Assignment",
    "broadcast_state",
    "forget_state",
    "holds_state",
    "state_source",
    "inprocess_enabled",
    "prewarmed",
    "reconfigure",
    "wait_for_assignment",
    "Checkpoint",
    "CheckpointDiscoverySocketClient",
    "CheckpointType",
    "HyperPodIPCException",
    "Event",
    "atomic_save",
    "elastic_event_detected",
    "event",
    "heartbeat",
    "install_signal_handler",
    "latest_checkpoint",
    "parse_signal",
    "report_checkpoint",
    "report_stopping",
    "reset",
    "save_and_commit",
    "under_hyperpodrun",
]

install_signal_handler()
_init_prewarm()
_init_stacks()

"""HyperPod's ``elastic_event_detected`` with HyperPod's semantics.

As in HyperPod's module:

- ``HYPERPOD_SIGNAL_COORDINATION`` is read once, at import: ``disabled`` (the
  default when unset) makes ``elastic_event_detected`` always False;
  ``distributed`` turns it on; any other value warns and means ``disabled``.
  hyperpodrun, like HyperPod's agent, passes the variable to the workers: it
  sets ``distributed`` when its own environment does not set it, because
  hyperpodrun always announces planned changes (HyperPod's operator does the
  same when graceful shutdown is used).
- ``elastic_event_detected(sig)`` answers only for SIGUSR1 (the default);
  any other signal, SIGTERM included, gives False and installs nothing, so
  SIGTERM keeps PyTorch's meaning.
- ``distributed``: all ranks agree (all_reduce MAX) when torch.distributed
  is initialised, else this rank's own flag. hyperpodrun's event file counts
  as the signal, and once True it stays True (no further collectives).
"""

import logging
import os
import signal

from hyperpodrun_elastic import _events

log = logging.getLogger("hyperpod_elastic_agent")

_VALID_COORDINATION_MODES = {"disabled", "distributed"}

_raw_mode = os.getenv("HYPERPOD_SIGNAL_COORDINATION", "disabled").lower()
if _raw_mode not in _VALID_COORDINATION_MODES:
    log.warning('Invalid HYPERPOD_SIGNAL_COORDINATION value: "%s". Valid values are: %s. '
                'Defaulting to "disabled".', _raw_mode, ", ".join(sorted(_VALID_COORDINATION_MODES)))
    _SIGNAL_COORDINATION_MODE = "disabled"
else:
    _SIGNAL_COORDINATION_MODE = _raw_mode

__all__ = ["elastic_event_detected"]


def elastic_event_detected(sig=signal.SIGUSR1) -> bool:
    """True once an elastic event (SIGUSR1) was announced, when enabled."""
    if sig is None:
        sig = signal.SIGUSR1
    try:
        if _events.parse_signal(sig) != signal.SIGUSR1:
            return False  # only SIGUSR1 is an elastic event; SIGTERM stays PyTorch's
    except ValueError:
        return False
    if _SIGNAL_COORDINATION_MODE != "distributed":
        return False
    return _events.elastic_event_detected()

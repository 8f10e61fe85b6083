"""HyperPod's ``elastic_event_detected`` backed by hyperpodrun_elastic.

Same call as HyperPod's: ``elastic_event_detected(sig=None)``, True on every
rank at the same step once the agent has announced a scale event. As with
HyperPod, ``HYPERPOD_SIGNAL_COORDINATION=disabled`` turns it off (always
False); unset or ``distributed`` means on.
"""

import os

from hyperpodrun_elastic import _events

__all__ = ["elastic_event_detected"]


def elastic_event_detected(sig=None) -> bool:
    """True once an elastic event was announced (all ranks agree)."""
    if os.environ.get("HYPERPOD_SIGNAL_COORDINATION", "").strip().lower() == "disabled":
        return False
    return _events.elastic_event_detected(sig)

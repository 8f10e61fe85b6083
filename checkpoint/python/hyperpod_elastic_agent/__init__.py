"""Compatibility shim: SageMaker HyperPod's import path, served by hyperpodrun.

Training code written for HyperPod elastic training runs unchanged:

    from hyperpod_elastic_agent.elastic_event_handler import elastic_event_detected
    from hyperpod_elastic_agent import CheckpointDiscoverySocketClient
    from hyperpod_elastic_agent.checkpoint_discovery import CheckpointType

When AWS's real ``hyperpod_elastic_agent`` package is installed, this shim
steps aside: the real package is loaded in its place (hyperpodrun puts the
shim first on PYTHONPATH, so without this it would shadow it).
"""

import importlib.machinery
import importlib.util
import os
import sys


def _real_package():
    """The spec of another hyperpod_elastic_agent on sys.path, or None."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec(__name__, paths)
    if spec is None or spec.origin is None:
        return None
    if os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return None
    return spec


_spec = _real_package()
if _spec is not None:
    # Step aside: load the real package under this name. Submodules are then
    # found through its __path__ (the import system reads the parent from
    # sys.modules after this module ran).
    _real = importlib.util.module_from_spec(_spec)
    sys.modules[__name__] = _real
    _spec.loader.exec_module(_real)
else:
    from hyperpodrun_elastic._discovery import CheckpointDiscoverySocketClient

    __all__ = ["CheckpointDiscoverySocketClient"]

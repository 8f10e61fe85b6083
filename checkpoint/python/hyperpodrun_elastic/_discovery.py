"""HyperPod's checkpoint discovery API over hyperpodrun's control channel.

``CheckpointDiscoverySocketClient(prefix, num_model_checkpoints,
num_data_checkpoints)`` as in HyperPod's ``hyperpod_elastic_agent``:

- ``update(step, path, checkpoint_type)``: each writing rank reports its part
  of a checkpoint (a ``checkpoint_update`` message). hyperpodrun commits the
  step (and hands it to restarted workers) once every expected writer
  reported it: ``num_model_checkpoints`` local ranks of every node for
  ``CheckpointType.MODEL_CHECKPOINT``, ``num_data_checkpoints`` for
  ``CheckpointType.DATA_CHECKPOINT``. Safe to call from a forked process.
- ``get_latest_checkpoint_path()``: the path of the latest committed
  checkpoint this run was started from (``HYPERPODRUN_CHECKPOINT``), or None
  on a first start, as HyperPod returns None before any restart.
"""

import enum
import os
from typing import Optional

from ._control import _check_step, _env_int, _normalise_path, send_message


class HyperPodIPCException(Exception):
    """An update the agent did not acknowledge (HyperPod's exception name)."""


class CheckpointType(str, enum.Enum):
    """The kind of a checkpoint part (HyperPod's names)."""

    MODEL_CHECKPOINT = "model"
    DATA_CHECKPOINT = "data"


class CheckpointDiscoverySocketClient:
    """Reports checkpoint parts to hyperpodrun and reads the one to resume from."""

    def __init__(self, prefix: str, num_model_checkpoints: int = 0, num_data_checkpoints: int = 0):
        if num_model_checkpoints < 0 or num_data_checkpoints < 0:
            raise ValueError("num_model_checkpoints and num_data_checkpoints must be >= 0")
        self.prefix = prefix
        self.num_model_checkpoints = int(num_model_checkpoints)
        self.num_data_checkpoints = int(num_data_checkpoints)

    def update(self, step: int, path: str, checkpoint_type=CheckpointType.MODEL_CHECKPOINT) -> None:
        """Report this rank's part of the checkpoint of ``step`` at ``path``.

        Raises HyperPodIPCException if hyperpodrun did not acknowledge it.
        """
        kind = CheckpointType(checkpoint_type).value
        msg = {
            "type": "checkpoint_update",
            "step": _check_step(step),
            "path": _normalise_path(path),
            "checkpoint_type": kind,
            "num_model_checkpoints": self.num_model_checkpoints,
            "num_data_checkpoints": self.num_data_checkpoints,
            "nodes": _env_int("GROUP_WORLD_SIZE", 1),
            "rank": _env_int("RANK", 0),
            "world_size": _env_int("WORLD_SIZE", 1),
            "pid": os.getpid(),
        }
        if not send_message(msg):
            raise HyperPodIPCException(
                "Failed to update hyperpodrun with step=%r, path=%r, checkpoint_type=%s" % (step, path, kind))

    def get_latest_checkpoint_path(self) -> Optional[str]:
        """The committed checkpoint this run resumes from, or None."""
        path = os.environ.get("HYPERPODRUN_CHECKPOINT", "").strip()
        return path or None

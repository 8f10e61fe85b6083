"""HyperPod's ``hyperpod_elastic_agent.ipc`` import path (checkpoint discovery only)."""

from hyperpodrun_elastic._discovery import CheckpointDiscoverySocketClient, HyperPodIPCException

__all__ = ["CheckpointDiscoverySocketClient", "HyperPodIPCException"]

"""HyperPod's ``hyperpod_elastic_agent.checkpoint_discovery`` import path."""

from hyperpodrun_elastic._discovery import CheckpointDiscoverySocketClient, CheckpointType

__all__ = ["CheckpointDiscoverySocketClient", "CheckpointType"]
